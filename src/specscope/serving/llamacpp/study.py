"""From a measurement run to llama-server settings that pay, shown side by side.

``specscope llamacpp RUN_DIR``:

1. price every candidate setting in llama.cpp's own loop: llama-bench's pass-cost curves of the
   target and draft GGUFs per quantisation, threads, polling and batch sizes
   (:func:`~specscope.serving.llamacpp.measure_cost_grid`, or a grid measured before with ``--costs``),
   and the break-even tokens per step of each setting and K;
2. per domain, the setting and chain length K (K = 0: plain decoding, in its own fastest
   setting) of highest predicted tokens per second, from the run's top-1 chain acceptance
   (:func:`choose_settings`), written as a policy file whose ``llama_server`` entry holds the
   exact llama-server flags measured, for ``specscope export``;
3. on held-out prompts (the run's sources, none of the run's prompts), one llama-server per
   measured configuration (plain with default flags, plain at its best setting, every fixed K,
   each domain's choice), requests interleaved prompt by prompt; speed and draft counts are the
   server's own per-request ``timings``;
4. summarise every domain and K cell with prompt-clustered intervals: speed-up over plain,
   measured against predicted speed (the prediction bias, and a correction when it is
   systematic), and tokens per step llama.cpp saw against the run's prediction.

It does not measure node-level acceptance (``specscope run``) or build llama.cpp
(:mod:`specscope.serving.llamacpp.programs` does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ...analysis.stats import ClusterBootstrap
from ...errors import SpecscopeError
from ...files import inside_of, write_json, write_output
from ...models import load_tokenizer
from ...models.demo import demo_gguf
from ...prompts.domains import select_prompts
from ...prompts.items import PromptItem
from ...prompts.render import render_item, rendering_of
from ...records import load_run
from ...trees import TreeShape
from ...tune.acceptance import ALL_DOMAINS
from ...tune.policy import Choice, PolicyFile
from ...tune.router import RuleRouter, prompt_text
from .costs import (
    DEFAULT_KS,
    Candidate,
    ChainAcceptance,
    CostGrid,
    SettingChoice,
    break_even_rows,
    choose_setting,
    gguf_quant,
    measure_cost_grid,
    plot_cost_curves,
    quantised_variants,
)
from .programs import BenchGrid, build_llama_tools
from .server import Completion, LlamaServer, ServerSetting

PLAIN, PLAIN_BEST, ROUTED = "plain", "plain-best", "routed"
DEFAULT_SETTING = ServerSetting()  # llama-server as a user starts it: 2 threads, --poll 50


def chain(k: int) -> TreeShape | None:
    return TreeShape.chain(k) if k > 0 else None


def chain_k(shape: TreeShape | None) -> int:
    return 0 if shape is None else shape.max_depth


# --- choosing settings --------------------------------------------------------------------------------


def domain_acceptance(acceptance: ChainAcceptance) -> dict[str, ChainAcceptance]:
    """Each domain's acceptance, and the pooled one (the setting for other domains)."""
    groups = {d: acceptance.subset(d) for d in sorted(set(acceptance.domains))}
    return {**groups, ALL_DOMAINS: acceptance}


def choose_settings(
    acceptance: ChainAcceptance, grid: CostGrid, ks: Sequence[int] = DEFAULT_KS
) -> dict[str, SettingChoice]:
    """Per domain (and pooled), the candidate and K of highest predicted tokens per second."""
    options = grid.candidates()
    return {d: choose_setting(acc, options, ks) for d, acc in domain_acceptance(acceptance).items()}


def default_candidate(grid: CostGrid, quant: str) -> Candidate | None:
    """The grid's plain candidate for llama-server's default flags and the shipped GGUF."""
    for cand in grid.candidates():
        s = cand.setting
        if (
            cand.draft is None
            and cand.target.quant == quant
            and (s.threads, s.poll, s.batch, s.ubatch)
            == (
                DEFAULT_SETTING.threads,
                DEFAULT_SETTING.poll,
                DEFAULT_SETTING.batch,
                DEFAULT_SETTING.ubatch,
            )
        ):
            return cand
    return None


@dataclass(frozen=True)
class ServerConfig:
    """One llama-server the benchmark runs: a setting at one K, its GGUFs, and the grid
    candidate that priced it (None: not measured by llama-bench, so no prediction)."""

    setting: ServerSetting  # with K
    target: Path
    draft: Path | None
    candidate: Candidate | None
    target_quant: str
    draft_quant: str | None

    @property
    def name(self) -> str:
        quants = self.target_quant + (f"+{self.draft_quant}" if self.setting.k else "")
        return f"{quants} {self.setting.name}"

    def to_dict(self) -> dict:
        """What ``specscope export --engine llama.cpp`` needs: the exact flags (models apart)."""
        return {
            "setting": self.setting.name,
            "k": self.setting.k,
            "flags": self.setting.flags(),
            "target_quant": self.target_quant,
            "draft_quant": self.draft_quant if self.setting.k else None,
            "target_gguf": str(self.target),
            "draft_gguf": str(self.draft) if self.setting.k and self.draft else None,
        }


def server_config(cand: Candidate, k: int, models: dict[tuple[str, str], Path]) -> ServerConfig:
    dq = cand.draft.quant if cand.draft else None
    setting = (
        cand.setting.with_k(k)
        if k
        else ServerSetting(
            threads=cand.setting.threads,
            poll=cand.setting.poll,
            batch=cand.setting.batch,
            ubatch=cand.setting.ubatch,
        )
    )
    return ServerConfig(
        setting,
        models[("target", cand.target.quant)],
        models.get(("draft", dq)) if k else None,
        cand,
        cand.target.quant,
        dq if k else None,
    )


@dataclass(frozen=True)
class BenchPlan:
    """The servers of the side-by-side benchmark: fixed methods, and each domain's choice."""

    methods: dict[str, ServerConfig]  # plain, plain-best, k1..kK
    routed: dict[str, ServerConfig]  # domain (and ALL_DOMAINS) -> its chosen server

    def configs(self) -> list[ServerConfig]:
        seen: dict[tuple, ServerConfig] = {}
        for cfg in [*self.methods.values(), *self.routed.values()]:
            seen.setdefault(config_key(cfg), cfg)
        return list(seen.values())

    def for_domain(self, domain: str) -> ServerConfig:
        return self.routed.get(domain, self.routed[ALL_DOMAINS])


def config_key(cfg: ServerConfig) -> tuple:
    return (cfg.setting, str(cfg.target), str(cfg.draft))


def plan_benchmark(
    choices: dict[str, SettingChoice],
    grid: CostGrid,
    acceptance: ChainAcceptance,
    ks: Sequence[int],
    models: dict[tuple[str, str], Path],
    shipped_quant: str,
) -> BenchPlan:
    """Plain decoding with llama-server's default flags (the reference), plain at its fastest
    measured setting, each fixed K at the setting fastest for it over all domains, and every
    domain's choice."""
    options = grid.candidates()
    default = default_candidate(grid, shipped_quant)
    plain = (
        server_config(default, 0, models)
        if default
        else ServerConfig(
            DEFAULT_SETTING, models[("target", shipped_quant)], None, None, shipped_quant, None
        )
    )
    methods = {PLAIN: plain}
    best_plain = choose_setting(acceptance, [c for c in options if c.draft is None], [])
    best = server_config(best_plain.candidate, 0, models)
    if config_key(best) != config_key(plain):
        methods[PLAIN_BEST] = best
    spec = [c for c in options if c.draft is not None]
    for k in ks:
        if spec:
            pick = choose_setting(acceptance, spec, [k])
            methods[f"k{k}"] = server_config(pick.candidate, k, models)
    routed = {d: server_config(c.candidate, c.k, models) for d, c in choices.items()}
    return BenchPlan(methods, routed)


def policy_from_choices(
    choices: dict[str, SettingChoice],
    plan: BenchPlan,
    grid: CostGrid,
    ks: Sequence[int],
    source: dict,
) -> PolicyFile:
    """The policy file: each domain's chain (or none), its predicted speed-up over plain
    decoding with default flags (else the fastest plain setting priced), and under
    ``llama_server`` the exact server flags measured."""
    ref = (
        plan.methods[PLAIN].candidate or plan.methods.get(PLAIN_BEST, plan.methods[PLAIN]).candidate
    )
    if ref is None:  # the grid priced no plain setting
        ref = next(c for c in grid.candidates() if c.draft is None)
    ref_speed = 1 / ref.costs().plain_token_s
    out = {
        d: Choice(chain(c.k), c.tau, c.tokens_per_s / ref_speed, c.tau / c.tokens_per_s)
        for d, c in choices.items()
    }
    server = {
        "domains": {d: plan.routed[d].to_dict() for d in choices if d != ALL_DOMAINS},
        "fallback": plan.routed[ALL_DOMAINS].to_dict(),
        "reference": plan.methods[PLAIN].to_dict(),
    }
    return PolicyFile(
        trees={d: out[d].shape for d in choices if d != ALL_DOMAINS},
        uniform=out[ALL_DOMAINS].shape,
        choices=out,
        info={
            "llama_server": server,
            "cost_grid": grid.info,
            "source": source,
            "tune": {
                "engine": "llama.cpp",
                "ks": list(ks),
                "predicted_tok_s": {d: c.tokens_per_s for d, c in choices.items()},
            },
        },
    )


# --- the side-by-side benchmark through llama-server --------------------------------------------------


@dataclass
class Request:
    """One request of the benchmark, with llama-server's own timings of it."""

    prompt_id: str
    domain: str
    routed_domain: str
    method: str  # plain, plain-best, k<K> or routed
    setting: str  # the server configuration's name
    k: int
    tokens: int  # predicted_n
    decode_s: float  # predicted_ms / 1000
    prompt_s: float
    draft_n: int
    accepted: int  # draft_n_accepted
    steps: int  # verified steps: tokens after the first, less the accepted drafts (K > 0)
    equal_plain: bool
    predicted_tok_s: (
        float  # from the cost grid and the run's acceptance for this domain (nan: none)
    )


def request_row(
    item: PromptItem,
    routed_domain: str,
    method: str,
    cfg: ServerConfig,
    done: Completion,
    plain_tokens: list[int],
    predicted: float,
) -> Request:
    k = cfg.setting.k
    steps = max(done.predicted_n - 1 - done.draft_n_accepted, 0) if k else 0
    return Request(
        item.id,
        item.domain,
        routed_domain,
        method,
        cfg.name,
        k,
        done.predicted_n,
        done.predicted_ms / 1000,
        done.prompt_ms / 1000,
        done.draft_n,
        done.draft_n_accepted,
        steps,
        done.tokens == plain_tokens,
        predicted,
    )


def predicted_tok_s(cfg: ServerConfig, acc: ChainAcceptance) -> float:
    if cfg.candidate is None or not len(acc.prompts):
        return float("nan")
    k = cfg.setting.k
    tau, p_all = (float(acc.tau(k)[0]), float(acc.p_all(k)[0])) if k else (1.0, 1.0)
    return cfg.candidate.tokens_per_s(k, tau, p_all)


def bench_requests(
    complete: Callable[[ServerConfig, list[int]], Completion],
    prompts: Sequence[tuple[PromptItem, list[int]]],
    plan: BenchPlan,
    acceptance: ChainAcceptance,
    router: RuleRouter = RuleRouter(),
    on_request: Callable[[Request], None] | None = None,
) -> list[Request]:
    """Every method and the routed choice on each prompt, in an order that rotates prompt by
    prompt (no method always first). ``complete(config, prompt_ids)`` runs one request."""
    rows = []
    accs = domain_acceptance(acceptance)
    for i, (item, ids) in enumerate(prompts):
        routed_domain = router.classify(prompt_text(item))
        methods = [*plan.methods.items(), (ROUTED, plan.for_domain(routed_domain))]
        shift = i % len(methods)
        done = {m: complete(cfg, ids) for m, cfg in methods[shift:] + methods[:shift]}
        acc = accs.get(item.domain, acceptance.subset(item.domain))
        for method, cfg in methods:
            row = request_row(
                item,
                routed_domain,
                method,
                cfg,
                done[method],
                done[PLAIN].tokens,
                predicted_tok_s(cfg, acc),
            )
            rows.append(row)
            if on_request:
                on_request(row)
    return rows


def requests_frame(rows: Sequence[Request]) -> pd.DataFrame:
    return pd.DataFrame([asdict(r) for r in rows])


# --- tables ---------------------------------------------------------------------------------------------


def _interval(values: np.ndarray, confidence: float) -> tuple[float, float, float]:
    if len(values) < 2:
        return float(values[0]), float("nan"), float("nan")
    lo, hi = np.quantile(values[1:], [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(values[0]), float(lo), float(hi)


def _domain_rates(part: pd.DataFrame, n_boot: int, seed: int) -> tuple[dict, pd.DataFrame]:
    """Per method: decode tokens/s (ratio of sums over prompts) for each resample of the
    domain's prompts (row 0: all prompts once), the same resamples for every method."""
    prompts = sorted(part["prompt_id"].unique())
    boot = ClusterBootstrap.draw(np.zeros(len(prompts)), n_boot, seed)
    wide = part.pivot_table(
        index="prompt_id",
        columns="method",
        values=["tokens", "decode_s", "steps", "accepted"],
        aggfunc="sum",
    ).reindex(prompts)
    rate = {
        m: boot.total(wide["tokens"][m].to_numpy()) / boot.total(wide["decode_s"][m].to_numpy())
        for m in wide["tokens"].columns
    }
    return rate, wide


def speed_table(
    requests: pd.DataFrame, n_boot: int = 1000, seed: int = 0, confidence: float = 0.95
) -> pd.DataFrame:
    """Per domain and method: decode tokens/s as llama-server timed it, the speed-up over plain
    decoding with default flags (prompt-resampled interval), the predicted tokens/s and
    measured/predicted (interval over the same resamples), tokens per step, outputs equal to
    plain."""
    out = []
    for domain, part in requests.groupby("domain", sort=True):
        rate, wide = _domain_rates(part, n_boot, seed)
        for method in _method_order(rate):
            rows = part[part["method"] == method]
            speedup, lo, hi = _interval(rate[method] / rate[PLAIN], confidence)
            predicted = (
                float(rows["predicted_tok_s"].iloc[0])
                if len(set(rows["setting"])) == 1
                else float("nan")
            )
            ratio, rlo, rhi = _interval(rate[method] / predicted, confidence)
            steps = wide["steps"][method].sum()
            out.append(
                {
                    "domain": domain,
                    "method": method,
                    "kind": "speculative"
                    if (rows["k"] > 0).all()
                    else "plain"
                    if (rows["k"] == 0).all()
                    else "mixed",
                    "setting": ", ".join(sorted(set(rows["setting"]))),
                    "k": ", ".join(str(k) for k in sorted(set(rows["k"]))),
                    "prompts": len(rows),
                    "tok_s": float(rate[method][0]),
                    "speedup": speedup,
                    "speedup_lo": lo,
                    "speedup_hi": hi,
                    "predicted_tok_s": predicted,
                    "ratio": ratio,
                    "ratio_lo": rlo,
                    "ratio_hi": rhi,
                    "tokens_per_step": float((wide["accepted"][method].sum() + steps) / steps)
                    if steps
                    else 1.0,
                    "equal_plain": f"{int(rows['equal_plain'].sum())}/{len(rows)}",
                    "_ratio_boot": rate[method] / predicted,
                }
            )
    return pd.DataFrame(out)


def _method_order(rate: dict) -> list[str]:
    fixed = [m for m in (PLAIN, PLAIN_BEST) if m in rate]
    ks = sorted((m for m in rate if m.startswith("k")), key=lambda m: int(m[1:]))
    return fixed + ks + [m for m in (ROUTED,) if m in rate]


@dataclass(frozen=True)
class Bias:
    """Measured over predicted tokens/s pooled over cells of one kind (plain or speculative):
    the geometric mean of the cells' ratios, resampling each domain's prompts."""

    kind: str
    cells: int
    under_predicted: int  # cells whose whole interval lies above 1
    over_predicted: int  # cells whose whole interval lies below 1
    factor: float
    lo: float
    hi: float

    @property
    def systematic(self) -> bool:
        return not self.lo <= 1 <= self.hi


def prediction_bias(speed: pd.DataFrame, confidence: float = 0.99) -> list[Bias]:
    """Per kind of cell (plain decoding, fixed K), whether predictions err to one side; routed
    cells repeat other cells and are left out. Systematic when the pooled interval excludes 1;
    99% by default, as the percentile bootstrap of 10 prompts per domain is liberal (5% false
    positives at 99%, 12% at 95%, in tests/serving/test_llamaserver.py's worlds)."""
    out = []
    fixed = speed[(speed["method"] != ROUTED) & speed["predicted_tok_s"].notna()]
    for kind, part in fixed.groupby("kind", sort=True):
        logs = np.mean([np.log(b) for b in part["_ratio_boot"]], axis=0)
        factor, lo, hi = _interval(np.exp(logs), confidence)
        out.append(
            Bias(
                kind,
                len(part),
                int((part["ratio_lo"] > 1).sum()),
                int((part["ratio_hi"] < 1).sum()),
                factor,
                lo,
                hi,
            )
        )
    return out


def acceptance_table(
    requests: pd.DataFrame,
    acceptance: ChainAcceptance,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """Per domain and K: tokens per step llama-server saw (held-out prompts) beside the run's
    prediction for the top-1 chain of K, each with a prompt-resampled interval, and whether the
    intervals overlap. Every cell is listed."""
    out = []
    spec = requests[requests["method"].str.fullmatch(r"k\d+")]
    for (domain, k), part in spec.groupby(["domain", "k"], sort=True):
        boot = ClusterBootstrap.draw(np.zeros(len(part)), n_boot, seed)
        seen = boot.total(part["accepted"].to_numpy() + part["steps"].to_numpy()) / np.maximum(
            boot.total(part["steps"].to_numpy()), 1
        )
        acc = acceptance.subset(domain)
        pred = acc.tau(
            int(k), ClusterBootstrap.draw(np.zeros(len(acc.prompts)), n_boot, seed + 1).weights
        )
        m, lo, hi = _interval(seen, confidence)
        pm, plo, phi = _interval(pred, confidence)
        out.append(
            {
                "domain": domain,
                "k": int(k),
                "prompts": len(part),
                "steps": int(part["steps"].sum()),
                "measured_tau": m,
                "measured_lo": lo,
                "measured_hi": hi,
                "predicted_tau": pm,
                "predicted_lo": plo,
                "predicted_hi": phi,
                "overlap": bool(lo <= phi and plo <= hi),
                "run_prompts": len(acc.prompts),
            }
        )
    return pd.DataFrame(out)


def break_even_table(grid: CostGrid, ks: Sequence[int]) -> pd.DataFrame:
    """Per speculative setting and K: pass costs, and the tokens per step needed to pay."""
    return pd.DataFrame(break_even_rows(grid.candidates(), ks))


# --- the whole study -------------------------------------------------------------------------------


@dataclass
class LlamaCppStudy:
    grid: CostGrid
    policy: PolicyFile
    plan: BenchPlan
    speed: pd.DataFrame
    bias: list[Bias]
    acceptance: pd.DataFrame
    break_even: pd.DataFrame
    out_dir: Path

    def render(self) -> str:
        """Every table as Markdown: curves, break-even, choices, speed, bias, acceptance."""

        def ci(m, lo, hi, unit=""):
            return f"{m:.2f}{unit} [{lo:.2f}, {hi:.2f}]"

        corr = {b.kind: b.factor for b in self.bias if b.systematic}
        s = self.speed.copy()
        s["speed-up vs plain [95% CI]"] = [
            ci(r.speedup, r.speedup_lo, r.speedup_hi, "x") for r in s.itertuples()
        ]
        s["measured/predicted [95% CI]"] = [
            ci(r.ratio, r.ratio_lo, r.ratio_hi) if r.predicted_tok_s == r.predicted_tok_s else "-"
            for r in s.itertuples()
        ]
        s["corrected prediction"] = [
            r.predicted_tok_s * corr.get(r.kind, 1.0) for r in s.itertuples()
        ]
        s = s.rename(
            columns={
                "tok_s": "tok/s",
                "predicted_tok_s": "predicted tok/s",
                "tokens_per_step": "tokens/step",
                "equal_plain": "equal to plain",
            }
        )
        cols = [
            "domain",
            "method",
            "setting",
            "k",
            "prompts",
            "tok/s",
            "speed-up vs plain [95% CI]",
            "predicted tok/s",
            "measured/predicted [95% CI]",
        ]
        cols += ["corrected prediction"] if corr else []
        cols += ["tokens/step", "equal to plain"]
        a = self.acceptance.copy()
        a["llama-server tokens/step [95% CI]"] = [
            ci(r.measured_tau, r.measured_lo, r.measured_hi) for r in a.itertuples()
        ]
        a["predicted from the run [95% CI]"] = [
            ci(r.predicted_tau, r.predicted_lo, r.predicted_hi) for r in a.itertuples()
        ]
        bias = pd.DataFrame(
            [
                {
                    "cells": b.kind,
                    "n": b.cells,
                    "measured/predicted (geo. mean) [99% CI]": ci(b.factor, b.lo, b.hi),
                    "under-predicted": b.under_predicted,
                    "over-predicted": b.over_predicted,
                    "systematic": "yes: predictions corrected by this factor"
                    if b.systematic
                    else "no",
                }
                for b in self.bias
            ]
        )
        server = self.policy.info["llama_server"]
        choice_rows = [
            {
                "domain": d,
                "server": cfg["setting"],
                "K": cfg["k"],
                "predicted tok/s": self.policy.info["tune"]["predicted_tok_s"][d],
                "flags": " ".join(cfg["flags"]),
            }
            for d, cfg in [*server["domains"].items(), (ALL_DOMAINS, server["fallback"])]
        ]
        lines = [
            "## Pass-cost curves (llama-bench, llama.cpp's own loop)",
            "",
            (
                "A pass of n tokens in units of a one-token pass, per model and setting "
                "(plot: pass_costs.png). Each model timed alone: two models competing for the "
                "cores show only in the llama-server tables below."
            ),
            "",
            self.grid.curve_table().to_markdown(index=False, floatfmt=".2f"),
            "",
            "## Break-even tokens per step (per setting and K)",
            "",
            self.break_even.to_markdown(index=False, floatfmt=".2f")
            if len(self.break_even)
            else "(no speculative setting measured)",
            "",
            "## Chosen llama-server settings (fastest predicted, plain included)",
            "",
            pd.DataFrame(choice_rows).to_markdown(index=False, floatfmt=".2f"),
            "",
            "## Speed per domain (held-out prompts, llama-server timings)",
            "",
            s[cols].to_markdown(index=False, floatfmt=".2f"),
            "",
            "## Prediction bias",
            "",
            bias.to_markdown(index=False) if len(bias) else "(no predicted cells)",
            "",
            "## Acceptance: llama-server vs the run's prediction (every domain and K)",
            "",
            a[
                [
                    "domain",
                    "k",
                    "prompts",
                    "steps",
                    "llama-server tokens/step [95% CI]",
                    "predicted from the run [95% CI]",
                    "overlap",
                ]
            ].to_markdown(index=False)
            if len(a)
            else "(no fixed-K cells)",
        ]
        return "\n".join(lines) + "\n"


def held_out_prompts(manifest: dict, per_domain: int) -> list[PromptItem]:
    """``per_domain`` prompts per domain from the run's sources that the run did not measure."""
    spec = manifest.get("config", {}).get("prompts", {})
    domains = list(spec.get("domains") or [])
    if not domains or spec.get("file"):
        raise SpecscopeError(
            "held-out prompts come from the run's domain sources, but this run "
            "measured a prompts file; measure a run with --domains"
        )
    used = set(manifest.get("prompts", {}).get("ids") or [])
    seed = manifest.get("config", {}).get("seed", 42)
    wanted = (spec.get("per_domain") or 0) + per_domain
    items = select_prompts(domains, wanted, seed=seed, sources=dict(spec.get("sources") or ()))
    picked: dict[str, list[PromptItem]] = {}
    for item in items:
        if item.id not in used and len(picked.setdefault(item.domain, [])) < per_domain:
            picked[item.domain].append(item)
    return [x for d in domains for x in picked.get(d, [])]


@dataclass(frozen=True)
class GridOptions:
    """The cost grid ``specscope llamacpp`` measures when no ``--costs`` file is given."""

    threads: tuple[int, ...] = (2,)
    polls: tuple[int, ...] = (0, 50)
    draft_threads: tuple[int, ...] = (2,)
    batches: tuple[tuple[int, int], ...] = ((2048, 512),)
    quants: tuple[str, ...] = ()  # the target's, made with llama-quantize; () the GGUF as given
    tokens: int = 8  # passes of 1..tokens
    depth: int = 192
    repetitions: int = 5


def measure_grid(tools, target: Path, draft: Path, opts: GridOptions, echo) -> CostGrid:
    """llama-bench over ``opts``: the target as given and requantised to each of
    ``opts.quants``, the draft as given."""
    targets = quantised_variants(tools, target, opts.quants or (gguf_quant(target),), echo)
    curves, info = [], {}
    for batch, ubatch in opts.batches:  # one llama-bench call per pair: it would cross b and ub

        def bench(threads, batch=batch, ubatch=ubatch):
            return BenchGrid(
                threads,
                opts.polls,
                (batch,),
                (ubatch,),
                tuple(range(1, opts.tokens + 1)),
                (opts.depth,),
                opts.repetitions,
            )

        part = measure_cost_grid(
            tools,
            targets,
            {gguf_quant(draft): draft},
            bench(opts.threads),
            bench(opts.draft_threads),
            echo,
        )
        curves += part.curves
        info = info or part.info
    info["grid"] = {
        "threads": list(opts.threads),
        "polls": list(opts.polls),
        "draft_threads": list(opts.draft_threads),
        "batches": [list(b) for b in opts.batches],
        "quants": list(opts.quants),
        "tokens": opts.tokens,
        "depth": opts.depth,
        "repetitions": opts.repetitions,
    }
    return CostGrid(tuple(curves), info)


def run_llamacpp_study(
    run_dir,
    out_dir,
    target_gguf,
    draft_gguf,
    per_domain: int,
    max_new_tokens: int,
    ks: Sequence[int],
    grid_options: GridOptions,
    costs: Path | None,
    n_boot: int,
    echo: Callable[[str], None] = print,
) -> LlamaCppStudy:
    out = Path(out_dir)
    inside = inside_of(out, run_dir)  # outputs in the run directory: its links are refused
    run = load_run(run_dir)
    acceptance = ChainAcceptance.from_nodes(run.nodes)
    outside = [k for k in ks if not 0 < k <= acceptance.max_k]
    if outside or not ks:
        raise SpecscopeError(
            f"--k {outside[0] if outside else '(none)'}: every K must lie in "
            f"1..{acceptance.max_k}, the depth of {run_dir}'s tree"
        )
    target_path = Path(target_gguf) if target_gguf else demo_gguf("target")
    draft_path = Path(draft_gguf) if draft_gguf else demo_gguf("draft")
    items = held_out_prompts(run.manifest, per_domain)
    tools = build_llama_tools(echo)
    grid = (
        CostGrid.load(costs)
        if costs
        else measure_grid(tools, target_path, draft_path, grid_options, echo)
    )
    write_json(out / "cost_grid.json", grid.to_dict(), inside)
    plot_cost_curves(grid, out / "pass_costs.png", inside)
    shipped = gguf_quant(target_path)
    quants = sorted({c.quant for c in grid.curves if c.role == "target"} | {shipped})
    models = {
        ("target", q): p for q, p in quantised_variants(tools, target_path, quants, echo).items()
    }
    models |= {
        ("draft", q): p
        for q, p in quantised_variants(
            tools, draft_path, sorted({c.quant for c in grid.curves if c.role == "draft"}), echo
        ).items()
    }
    choices = choose_settings(acceptance, grid, ks)
    plan = plan_benchmark(choices, grid, acceptance, ks, models, shipped)
    policy = policy_from_choices(
        choices, plan, grid, ks, {"run_dir": str(run_dir), "run_id": run.manifest.get("run_id")}
    )
    policy.save(out / "policy.json", inside)

    tokenizer = load_tokenizer(str(target_path))
    config = run.manifest.get("config", {})
    prompts = [
        (
            item,
            list(
                render_item(
                    tokenizer, item, rendering_of(config), config.get("max_prompt_tokens", 512)
                ).ids
            ),
        )
        for item in items
    ]
    total = len(prompts) * (len(plan.methods) + 1)
    done = 0

    def progress(row: Request) -> None:
        nonlocal done
        done += 1
        echo(
            f"[{done}/{total}] {row.domain} {row.prompt_id} {row.method} ({row.setting}): "
            f"{row.tokens} tokens, {row.tokens / max(row.decode_s, 1e-9):.1f} tok/s"
        )

    with ExitStack() as stack:
        servers = {}
        for cfg in plan.configs():
            echo(f"starting llama-server {cfg.name} ...")
            servers[config_key(cfg)] = stack.enter_context(
                LlamaServer(tools, cfg.target, cfg.setting, cfg.draft)
            )
        rows = bench_requests(
            lambda cfg, ids: servers[config_key(cfg)].complete(ids, max_new_tokens),
            prompts,
            plan,
            acceptance,
            on_request=progress,
        )
    requests = requests_frame(rows)
    write_output(out / "requests.parquet", requests.to_parquet(None, index=False), inside)
    speed = speed_table(requests, n_boot)
    study = LlamaCppStudy(
        grid,
        policy,
        plan,
        speed,
        prediction_bias(speed),
        acceptance_table(requests, acceptance, n_boot),
        break_even_table(grid, ks),
        out,
    )
    write_output(out / "summary.md", study.render(), inside)
    return study
