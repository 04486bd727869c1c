"""From a measurement run to speculation settings that pay on llama.cpp, shown side by side.

``specscope llamacpp RUN_DIR``:

1. time llama.cpp's passes on this machine (:func:`~specscope.llamacpp.measure_pass_costs`);
2. per domain, the chain length K (or no speculation) of best predicted speed-up, from the run's
   top-1 chain acceptance and those costs (:func:`tune_chains`), written as a policy file that
   ``specscope export`` turns into engine settings;
3. on held-out prompts (the run's sources, none of the run's prompts), decode each prompt plainly,
   with every fixed K, and routed (the router picks the domain, the policy picks K), interleaved
   prompt by prompt, and compare outputs with plain greedy;
4. summarise per domain: tokens per second and speed-up with prompt-resampled intervals, the
   tokens per step llama.cpp saw beside the run's prediction for the same K, and the break-even
   points that say why speculation does or does not pay here.

It does not measure node-level acceptance (``specscope run``) or talk to a server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .analysis.stats import ClusterBootstrap
from .prompts.items import PromptItem
from .prompts.domains import select_prompts
from .errors import SpecscopeError
from .files import inside_of, write_json, write_output
from .llamacpp import DEFAULT_KS, ChainAcceptance, GreedyDraft, PassCosts, generate
from .tune.acceptance import ALL_DOMAINS
from .tune.policy import Choice, PolicyFile
from .tune.router import RuleRouter, prompt_text
from .trees import TreeShape

PLAIN, ROUTED = "plain", "routed"


def chain(k: int) -> TreeShape | None:
    return TreeShape.from_paths([(0,) * d for d in range(1, k + 1)]) if k > 0 else None


def chain_k(shape: TreeShape | None) -> int:
    return 0 if shape is None else shape.max_depth


def tune_chains(acceptance: ChainAcceptance, costs: PassCosts, ks: Sequence[int] = DEFAULT_KS,
                source: dict | None = None) -> PolicyFile:
    """Per domain (and pooled: the setting for other domains), the K of best predicted
    speed-up, or no speculation when none beats plain decoding."""
    ks = [k for k in ks if 0 < k <= acceptance.max_k]
    groups = {d: acceptance.subset(d) for d in sorted(set(acceptance.domains))}
    choices = {}
    for name, acc in {**groups, ALL_DOMAINS: acceptance}.items():
        best = Choice(None, 1.0, 1.0, costs.plain_token_s)
        for k in ks:
            tau, p_all = float(acc.tau(k)[0]), float(acc.p_all(k)[0])
            speedup = costs.predicted_speedup(k, tau, p_all)
            if speedup > best.predicted_speedup:
                best = Choice(chain(k), tau, speedup, costs.step_s(k, tau, p_all))
        choices[name] = best
    uniform = choices[ALL_DOMAINS]
    return PolicyFile(trees={d: choices[d].shape for d in groups}, uniform=uniform.shape,
                      choices=choices,
                      info={"cost_model": costs.to_dict(), "source": source or {},
                            "tune": {"engine": "llama.cpp", "ks": ks}})


@dataclass
class Request:
    """One decoded request of the benchmark."""

    prompt_id: str
    domain: str
    routed_domain: str
    method: str  # plain, k<K> or routed
    k: int
    tokens: int
    decode_s: float
    first_token_s: float
    steps: int
    accepted: int  # draft tokens accepted over the verified steps
    equal_plain: bool


def bench_requests(target, draft: GreedyDraft, prompts: Sequence[tuple[PromptItem, list[int]]],
                   policy: PolicyFile, ks: Sequence[int], max_new_tokens: int, eos: set[int],
                   router: RuleRouter = RuleRouter(),
                   on_request: Callable[[Request], None] | None = None) -> list[Request]:
    """Plain, every fixed K and routed decoding of each prompt, one prompt at a time."""
    rows = []
    for i, (item, ids) in enumerate(prompts):
        routed_domain = router.classify(prompt_text(item))
        methods = [(PLAIN, 0)] + [(f"k{k}", k) for k in ks] + [
            (ROUTED, chain_k(policy.tree_for(routed_domain)))]
        shift = i % len(methods)  # each method takes each position in turn: no order bias
        outputs = {}
        for method, k in methods[shift:] + methods[:shift]:
            outputs[method] = (k, generate(target, draft, ids, k, max_new_tokens, eos))
        plain = outputs[PLAIN][1].tokens
        for method, _ in methods:
            k, out = outputs[method]
            row = Request(item.id, item.domain, routed_domain, method, k, len(out.tokens),
                          out.decode_s, out.first_token_s, out.steps, int(sum(out.accepted)),
                          out.tokens == plain)
            rows.append(row)
            if on_request:
                on_request(row)
    return rows


def _interval(values: np.ndarray, confidence: float) -> tuple[float, float, float]:
    lo, hi = np.quantile(values[1:], [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(values[0]), float(lo), float(hi)


def speed_table(requests: pd.DataFrame, policy: PolicyFile, costs: PassCosts,
                acceptance: ChainAcceptance, n_boot: int = 1000, seed: int = 0,
                confidence: float = 0.95) -> pd.DataFrame:
    """Per domain and method: decode tokens/s, speed-up over plain with a prompt-resampled
    interval, tokens per step, outputs equal to plain, and the predicted speed-up."""
    out = []
    for domain, part in requests.groupby("domain", sort=True):
        prompts = sorted(part["prompt_id"].unique())
        boot = ClusterBootstrap.draw(np.zeros(len(prompts)), n_boot, seed)
        wide = part.pivot_table(index="prompt_id", columns="method",
                                values=["tokens", "decode_s", "steps", "accepted"],
                                aggfunc="sum").reindex(prompts)
        # decode rate: tokens after the first over the decode phase, ratio of sums over prompts
        rate = {m: boot.total(wide["tokens"][m].to_numpy() - 1) / boot.total(
            wide["decode_s"][m].to_numpy()) for m in wide["tokens"].columns}
        acc = acceptance.subset(domain)
        for method in [PLAIN] + sorted(m for m in rate if m.startswith("k")) + [ROUTED]:
            rows = part[part["method"] == method]
            k = int(rows["k"].iloc[0]) if method != ROUTED else chain_k(policy.tree_for(domain))
            speedup, lo, hi = _interval(rate[method] / rate[PLAIN], confidence)
            steps = wide["steps"][method].sum()
            out.append({
                "domain": domain, "method": method, "k": k if method != ROUTED else
                ", ".join(sorted({str(x) for x in rows["k"]})),
                "tok_s": float(rate[method][0]), "speedup": speedup, "speedup_lo": lo,
                "speedup_hi": hi, "predicted_speedup": acc.predicted_speedup(costs, k),
                "tokens_per_step": float((wide["accepted"][method].sum() + steps) / steps)
                if steps else 1.0,
                "equal_plain": f"{int(rows['equal_plain'].sum())}/{len(rows)}",
            })
    return pd.DataFrame(out)


def acceptance_table(requests: pd.DataFrame, acceptance: ChainAcceptance, n_boot: int = 1000,
                     seed: int = 0, confidence: float = 0.95) -> pd.DataFrame:
    """Per domain and K: tokens per step llama.cpp saw (held-out prompts) beside the run's
    prediction for the top-1 chain of K, each with a prompt-resampled interval."""
    out = []
    spec = requests[requests["method"].str.startswith("k")]
    for (domain, k), part in spec.groupby(["domain", "k"], sort=True):
        boot = ClusterBootstrap.draw(np.zeros(len(part)), n_boot, seed)
        seen = (boot.total(part["accepted"].to_numpy() + part["steps"].to_numpy())
                / np.maximum(boot.total(part["steps"].to_numpy()), 1))
        acc = acceptance.subset(domain)
        pred = acc.tau(int(k), ClusterBootstrap.draw(np.zeros(len(acc.prompts)), n_boot,
                                                     seed + 1).weights)
        m, lo, hi = _interval(seen, confidence)
        pm, plo, phi = _interval(pred, confidence)
        out.append({"domain": domain, "k": int(k), "steps": int(part["steps"].sum()),
                    "measured_tau": m, "measured_lo": lo, "measured_hi": hi,
                    "predicted_tau": pm, "predicted_lo": plo, "predicted_hi": phi,
                    "run_prompts": len(acc.prompts)})
    return pd.DataFrame(out)


def break_even_table(costs: PassCosts, ks: Sequence[int]) -> pd.DataFrame:
    """Per K: the step's cost, the tokens per step needed to pay, and the largest draft cost at
    which even perfect acceptance pays."""
    return pd.DataFrame([{
        "k": k, "target_pass_ms": 1000 * costs.target(k + 1),
        "draft_ms": 1000 * k * costs.draft(1),
        "break_even_tau": costs.break_even_tau(k), "max_tau": k + 1,
        "break_even_draft_ms": 1000 * costs.break_even_draft_s(k),
        "draft_ms_per_token": 1000 * costs.draft(1)} for k in ks])


def requests_frame(rows: Sequence[Request]) -> pd.DataFrame:
    return pd.DataFrame([asdict(r) for r in rows])


# --- the whole study -------------------------------------------------------------------------------


@dataclass
class LlamaCppStudy:
    costs: PassCosts
    policy: PolicyFile
    speed: pd.DataFrame
    acceptance: pd.DataFrame
    break_even: pd.DataFrame
    out_dir: Path

    def render(self) -> str:
        """The three tables as Markdown, with a verdict on whether speculation pays here."""
        s = self.speed.copy()
        s["speed-up [95% CI]"] = [f"{r.speedup:.2f}x [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]"
                                  for r in s.itertuples()]
        s["predicted"] = s["predicted_speedup"].map(lambda x: f"{x:.2f}x")
        s = s.rename(columns={"tok_s": "tok/s", "tokens_per_step": "tokens/step",
                              "equal_plain": "equal to plain"})
        a = self.acceptance.copy()
        a["llama.cpp tokens/step [95% CI]"] = [
            f"{r.measured_tau:.2f} [{r.measured_lo:.2f}, {r.measured_hi:.2f}]"
            for r in a.itertuples()]
        a["predicted from the run [95% CI]"] = [
            f"{r.predicted_tau:.2f} [{r.predicted_lo:.2f}, {r.predicted_hi:.2f}]"
            for r in a.itertuples()]
        choice = {d: chain_k(t) for d, t in self.policy.trees.items()}
        pays = any(choice.values())
        c = self.costs
        lines = [
            f"llama.cpp pass costs ({c.threads} threads, context {c.context_len}): target "
            + ", ".join(f"{k} tok {1000 * t:.1f} ms" for k, t in c.target_s)
            + "; draft " + ", ".join(f"{k} tok {1000 * t:.1f} ms" for k, t in c.draft_s)
            + f"; sample {1000 * c.sample_s:.2f} ms",
            "routed policy: " + ", ".join(f"{d} {'K=' + str(k) if k else 'none'}"
                                          for d, k in choice.items()),
            "" if pays else "speculation does not pay on this machine: no domain's best K is "
            "predicted faster than plain decoding; see the break-even table",
            "", "## Speed per domain (held-out prompts)", "",
            s[["domain", "method", "k", "tok/s", "speed-up [95% CI]", "predicted",
               "tokens/step", "equal to plain"]].to_markdown(index=False, floatfmt=".2f"),
            "", "## Acceptance: llama.cpp vs the run's prediction", "",
            a[["domain", "k", "steps", "llama.cpp tokens/step [95% CI]",
               "predicted from the run [95% CI]"]].to_markdown(index=False),
            "", "## Break-even (per chain length K)", "",
            self.break_even.to_markdown(index=False, floatfmt=".2f"),
        ]
        return "\n".join(lines) + "\n"


def held_out_prompts(manifest: dict, per_domain: int) -> list[PromptItem]:
    """``per_domain`` prompts per domain from the run's sources that the run did not measure."""
    spec = manifest.get("config", {}).get("prompts", {})
    domains = list(spec.get("domains") or [])
    if not domains or spec.get("file"):
        raise SpecscopeError("held-out prompts come from the run's domain sources, but this run "
                             "measured a prompts file; measure a run with --domains")
    used = set(manifest.get("prompts", {}).get("ids") or [])
    seed = manifest.get("config", {}).get("seed", 42)
    wanted = (spec.get("per_domain") or 0) + per_domain
    items = select_prompts(domains, wanted, seed=seed, sources=dict(spec.get("sources") or ()))
    picked: dict[str, list[PromptItem]] = {}
    for item in items:
        if item.id not in used and len(picked.setdefault(item.domain, [])) < per_domain:
            picked[item.domain].append(item)
    return [x for d in domains for x in picked.get(d, [])]


def run_llamacpp_study(run_dir, out_dir, target_gguf, draft_gguf, per_domain: int,
                       max_new_tokens: int, ks: Sequence[int], threads: int, n_boot: int,
                       echo: Callable[[str], None] = print) -> LlamaCppStudy:
    from .llamacpp import eos_ids, load_llama, measure_pass_costs
    from .models import load_tokenizer
    from .models.demo import demo_gguf
    from .records import load_run
    from .prompts.render import render_item, rendering_of

    out = Path(out_dir)
    inside = inside_of(out, run_dir)  # outputs in the run directory: its links are refused
    run = load_run(run_dir)
    acceptance = ChainAcceptance.from_nodes(run.nodes)
    outside = [k for k in ks if not 0 < k <= acceptance.max_k]
    if outside or not ks:
        raise SpecscopeError(f"--k {outside[0] if outside else '(none)'}: every K must lie in "
                             f"1..{acceptance.max_k}, the depth of {run_dir}'s tree")
    target_path = Path(target_gguf) if target_gguf else demo_gguf("target")
    draft_path = Path(draft_gguf) if draft_gguf else demo_gguf("draft")
    items = held_out_prompts(run.manifest, per_domain)
    tokenizer = load_tokenizer(str(target_path))
    config = run.manifest.get("config", {})
    prompts = [(item, list(render_item(tokenizer, item, rendering_of(config),
                                       config.get("max_prompt_tokens", 512)).ids))
               for item in items]
    draft_llama = load_llama(draft_path, threads)
    draft = GreedyDraft(draft_llama, 0)
    target = load_llama(target_path, threads, logits_all=True, draft_model=draft)
    echo(f"timing llama.cpp passes ({threads} threads) ...")
    costs = measure_pass_costs(target, draft_llama, prompts[0][1], max(ks), threads=threads)
    policy = tune_chains(acceptance, costs, ks, source={"run_dir": str(run_dir),
                                                        "run_id": run.manifest.get("run_id")})
    policy.save(out / "policy.json", inside)
    total = len(prompts) * (len(ks) + 2)
    done = 0

    def progress(row: Request) -> None:
        nonlocal done
        done += 1
        echo(f"[{done}/{total}] {row.domain} {row.prompt_id} {row.method}: {row.tokens} tokens, "
             f"{(row.tokens - 1) / max(row.decode_s, 1e-9):.1f} tok/s")

    rows = bench_requests(target, draft, prompts, policy, ks, max_new_tokens, eos_ids(target),
                          on_request=progress)
    requests = requests_frame(rows)
    write_output(out / "requests.parquet", requests.to_parquet(None, index=False), inside)
    study = LlamaCppStudy(costs, policy,
                          speed_table(requests, policy, costs, acceptance, n_boot),
                          acceptance_table(requests, acceptance, n_boot),
                          break_even_table(costs, ks), out)
    write_json(out / "costs.json", costs.to_dict(), inside)
    write_output(out / "summary.md", study.render(), inside)
    return study
