"""``specscope bench``: tokens per second of plain, assisted (transformers), chain, uniform-tree,
routed and dynamic decoding, and of chains from the model-free and early-exit drafters (``ngram``,
``early-exit``), per domain, every method on every prompt with methods interleaved.

Times the decoder of :mod:`specscope.decode`; does not choose trees (:mod:`specscope.tune.policy`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..analysis.stats import ClusterBootstrap, ratio
from ..core.loop import DecodeConfig, DecodeError
from ..decode import SpeculativeDecoder
from ..drafters import DrafterConfig
from ..prompts.domains import select_prompts
from ..prompts.items import PromptItem, sample_items
from ..prompts.render import render_item
from ..records import ALL_DOMAINS
from ..trees import DynamicTree, TreeShape
from .router import (
    LearnedRouter,
    RouterReport,
    RuleRouter,
    holdout_split,
    prompt_text,
    router_accuracy,
)

# --- bench -----------------------------------------------------------------------------------------

BENCH_METHODS = (
    "plain",
    "assisted",
    "chain",
    "uniform",
    "routed",
    "dynamic",
    "ngram",
    "early-exit",
)
# method -> the drafter it runs (the others draft with the pair's draft model or none)
DRAFTER_METHODS = {"ngram": "ngram", "early-exit": "early-exit"}


@dataclass(frozen=True)
class BenchConfig:
    """What ``specscope bench`` times: every method on every prompt ``repeats`` times (methods
    interleaved within a repeat, so that noise hits them alike), after ``warmup`` untimed rounds of
    every method on the first prompt; medians are kept."""

    max_new_tokens: int = 48
    warmup: int = 1
    repeats: int = 3
    chain_depth: int = 4
    min_path_prob: float = 0.0  # see DecodeConfig; for the specscope methods
    methods: tuple[str, ...] = ("plain", "assisted", "chain", "uniform", "routed")
    dynamic: DynamicTree = DynamicTree()
    rendering: str = "task"  # see specscope.prompts.render
    max_prompt_tokens: int = 512
    ngram: DrafterConfig = DrafterConfig("ngram")  # the 'ngram' method's chain of chain_depth
    early_exit: DrafterConfig | None = None  # the 'early-exit' method's (needs exit_layer)

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in BENCH_METHODS]
        if unknown:
            raise DecodeError(
                f"unknown bench method(s) {unknown}; choose from {', '.join(BENCH_METHODS)}"
            )
        if "plain" not in self.methods:
            raise DecodeError("the bench needs the 'plain' method: it is the reference")
        if (
            self.repeats < 1
            or self.warmup < 0
            or self.max_new_tokens < 1
            or self.chain_depth < 1
            or self.max_prompt_tokens < 1
        ):
            raise DecodeError(
                "repeats, max_new_tokens, chain_depth and max_prompt_tokens must be "
                ">= 1, warmup >= 0"
            )
        if not 0 <= self.min_path_prob < 1:  # NaN fails too
            raise DecodeError(f"min_path_prob must be in [0, 1), got {self.min_path_prob}")
        if "early-exit" in self.methods and self.early_exit is None:
            raise DecodeError("the bench method 'early-exit' needs an exit layer (--exit-layer)")
        for method, kind in DRAFTER_METHODS.items():
            drafter = self.drafter(method)
            if drafter is not None and drafter.kind != kind:
                raise DecodeError(
                    f"the {method!r} method runs the {kind} drafter, not {drafter.kind}"
                )

    def drafter(self, method: str) -> DrafterConfig | None:
        """The drafter a method runs; None: the pair's draft model (or no speculation)."""
        return {"ngram": self.ngram, "early-exit": self.early_exit}.get(method)


@dataclass(frozen=True)
class BenchRun:
    """One method on one prompt: the output, and the median time over the repeats."""

    method: str
    prompt_id: str
    domain: str
    routed_to: str  # the router's domain (routed method), else ""
    tokens: tuple[int, ...]
    steps: int  # verification steps (forward passes of the target for plain)
    time_s: float
    first_token_s: float  # the prompt's prefill and the first token (the same work in every method)


@dataclass(frozen=True)
class BenchRow:
    method: str
    domain: str  # or ALL_DOMAINS
    prompts: int
    tokens: int
    time_s: float
    tokens_per_s: float  # end to end, the prefill included
    decode_tokens_per_s: float  # after the first token: the part speculation changes
    speedup: float  # decode tokens per second over plain's, same prompts
    e2e_speedup: float  # end-to-end tokens per second over plain's
    tau: float  # tokens per verification step (nan where not observed)
    exact: bool  # every output equals plain greedy's
    speedup_lo: float = float("nan")  # 95% interval of ``speedup``: prompts resampled within
    speedup_hi: float = float("nan")  # domains, method and plain paired (nan: too few prompts)


class _FirstTokenClock:
    """A transformers streamer that notes when the first new token arrives."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.calls = 0
        self.first_token_s = float("nan")

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            self.first_token_s = time.perf_counter() - self.start

    def end(self) -> None:
        pass


def hf_generate(
    model, prompt: list[int], max_new_tokens: int, eos: frozenset[int], assistant=None
) -> tuple[list[int], float]:
    """``model.generate``, greedy (with ``assistant``: transformers assisted generation); the
    tokens and the seconds to the first one."""
    ids = torch.tensor([prompt], device=model.device)
    eos_ids = sorted(eos) or None
    clock = _FirstTokenClock()
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos_ids,
        streamer=clock,
        pad_token_id=eos_ids[0] if eos_ids else None,
        assistant_model=assistant,
    )
    return out[0, len(prompt) :].tolist(), clock.first_token_s


ROUTERS = ("rules", "learned")


@dataclass(frozen=True)
class BenchPrompts:
    """What the bench times, chosen so that nothing it is scored on was seen before."""

    items: list[PromptItem]  # per domain, a seeded sample of the held-out half
    routers: dict[str, object]  # ROUTERS -> a router (the learned one trained on the other half)
    reports: list[RouterReport]  # each router's accuracy on the held-out half
    held_out: int  # prompts in the held-out half


def bench_prompts(
    domains: list[str], per_domain: int, seed: int, policy, router: str = "rules"
) -> BenchPrompts:
    """Every prompt of ``domains`` except the tuning run's (``policy``'s source), split in half:
    one half trains the learned router; the other scores the routers and gives ``per_domain``
    prompts per domain to time. The learned router is trained only where its training half has
    two domains or more (a classifier needs two classes); asking for it with fewer is refused."""
    tuned = set((policy.info.get("source", {}) if policy else {}).get("prompt_ids", []))
    pool = [it for it in select_prompts(domains, None, seed=seed) if it.id not in tuned]
    train, test = holdout_split(pool, 0.5, seed)
    routers: dict[str, object] = {"rules": RuleRouter()}
    if len({i.domain for i in train}) >= 2:
        routers["learned"] = LearnedRouter().fit(
            [prompt_text(i) for i in train], [i.domain for i in train]
        )
    elif router == "learned":
        raise DecodeError(
            "--router learned needs prompts of two domains or more to train on; "
            f"got {', '.join(domains)} (use --router rules, or give more domains)"
        )
    items = [
        it
        for d in domains
        for it in sample_items([i for i in test if i.domain == d], per_domain, seed)
    ]
    return BenchPrompts(
        items, routers, [router_accuracy(r, test) for r in routers.values()], len(test)
    )


# a drafter -> the decoder that drafts with it (make_decoder of the loaded pair)
DecoderFor = Callable[[DrafterConfig], SpeculativeDecoder]


def bench_methods(decoder_for: DecoderFor, policy, router, config: BenchConfig) -> dict:
    """method -> fn(prompt ids, prompt text) -> (tokens, steps, routed domain, first-token s)."""
    greedy = DecodeConfig(max_new_tokens=config.max_new_tokens, min_path_prob=config.min_path_prob)
    decoder = decoder_for(DrafterConfig())

    def run(spec, drafter: DrafterConfig | None = None):
        speculator = decoder if drafter is None else decoder_for(drafter)

        def fn(ids, text):
            r = speculator.generate(ids, spec, greedy)
            return r.tokens, len(r.steps), "", r.steps[0].step_time_s

        return fn

    def routed(ids, text):
        domain = router.classify(text)
        speculator = decoder_for(policy.drafter_for(domain))
        r = speculator.generate(ids, policy.tree_for(domain), greedy)
        return r.tokens, len(r.steps), domain, r.steps[0].step_time_s

    def hf(assistant):
        def fn(ids, text):  # plain: one target pass per token; assisted: steps not observed
            tokens, first = hf_generate(
                decoder.target, ids, config.max_new_tokens, decoder.eos, assistant
            )
            return tokens, len(tokens) if assistant is None else 0, "", first

        return fn

    chain = TreeShape.chain(config.chain_depth)
    table = {
        "plain": hf(None),
        "assisted": hf(decoder.draft),
        "chain": run(chain),
        "uniform": run(policy.uniform if policy else chain),
        "routed": routed,
        "dynamic": run(config.dynamic),
        **{m: run(chain, config.drafter(m)) for m in DRAFTER_METHODS if m in config.methods},
    }
    if policy is None and ("uniform" in config.methods or "routed" in config.methods):
        raise DecodeError("methods 'uniform' and 'routed' need a policy file (specscope tune)")
    return {m: table[m] for m in config.methods}


def run_bench(
    decoder_for: DecoderFor,
    tokenizer,
    items,
    policy,
    router,
    config: BenchConfig = BenchConfig(),
    log=None,
) -> list[BenchRun]:
    """Time every method on every prompt; medians over ``repeats`` (see :class:`BenchConfig`)."""
    methods = bench_methods(decoder_for, policy, router, config)
    rendered = [
        render_item(tokenizer, item, config.rendering, config.max_prompt_tokens).ids
        for item in items
    ]
    for _ in range(config.warmup if items else 0):
        for fn in methods.values():
            fn(rendered[0], prompt_text(items[0]))
    runs = []
    for i, (item, ids) in enumerate(zip(items, rendered)):
        text = prompt_text(item)
        times: dict[str, list[float]] = {m: [] for m in methods}
        firsts: dict[str, list[float]] = {m: [] for m in methods}
        outputs: dict[str, tuple] = {}
        for _ in range(config.repeats):
            for name, fn in methods.items():
                t0 = time.perf_counter()
                outputs[name] = fn(ids, text)
                times[name].append(time.perf_counter() - t0)
                firsts[name].append(outputs[name][3])
        for name in methods:
            tokens, steps, routed, _ = outputs[name]
            median = sorted(times[name])[len(times[name]) // 2]
            first = sorted(firsts[name])[len(firsts[name]) // 2]
            runs.append(
                BenchRun(name, item.id, item.domain, routed, tuple(tokens), steps, median, first)
            )
            if log:
                log(
                    f"[{i + 1}/{len(items)}] {item.domain:9s} {name:9s} {len(tokens):3d} tokens "
                    f"{median:6.2f} s {len(tokens) / median:6.2f} tok/s"
                    + (f" (routed: {routed})" if routed else "")
                )
    return runs


def summarize_bench(runs: Sequence[BenchRun], n_boot: int = 2000, seed: int = 0) -> list[BenchRow]:
    """Per method and domain (and ``all``): tokens per second end to end and after the first
    token, speed-ups over plain, tau, exactness. Totals over prompts: tokens / seconds. The decode
    speed-up's interval resamples prompts within domains (a prompt's method and plain times stay
    paired), as every interval in specscope does (:mod:`specscope.analysis.stats`)."""
    reference = {r.prompt_id: r.tokens for r in runs if r.method == "plain"}
    domains = list(dict.fromkeys(r.domain for r in runs))
    prompts = list(dict.fromkeys(r.prompt_id for r in runs))
    column = {p: i for i, p in enumerate(prompts)}
    domain_of = {r.prompt_id: r.domain for r in runs}
    boot = ClusterBootstrap.draw(np.array([domain_of[p] for p in prompts]), n_boot, seed)

    def rates(part: list[BenchRun]) -> tuple[float, float]:
        secs = sum(r.time_s for r in part)
        decode_secs = sum(r.time_s - r.first_token_s for r in part if r.tokens)
        tokens = sum(len(r.tokens) for r in part)
        later = sum(len(r.tokens) - 1 for r in part if r.tokens)
        return (
            tokens / secs if secs else float("nan"),
            later / decode_secs if decode_secs > 0 else float("nan"),
        )

    def decode_sums(part: list[BenchRun]) -> np.ndarray:
        """(P, 2): per prompt, tokens after the first and their seconds."""
        sums = np.zeros((len(prompts), 2))
        for r in part:
            if r.tokens:
                sums[column[r.prompt_id]] += (len(r.tokens) - 1, r.time_s - r.first_token_s)
        return sums

    def speedup_interval(mine: list[BenchRun], plain: list[BenchRun]) -> tuple[float, float]:
        timed = {r.prompt_id for r in mine}
        keep = np.array([p in timed for p in prompts])
        sub = boot.subset(np.flatnonzero(keep))
        m, p = sub.total(decode_sums(mine)[keep]), sub.total(decode_sums(plain)[keep])
        reps = ratio(ratio(m[:, 0], m[:, 1]), ratio(p[:, 0], p[:, 1]))
        strata = len({domain_of[q] for q in np.array(prompts)[keep]})
        e = sub.estimate(reps, prompts=int(keep.sum()), strata=strata)
        return e.lo, e.hi

    rows = []
    for domain in domains + [ALL_DOMAINS]:
        part = [r for r in runs if domain in (ALL_DOMAINS, r.domain)]
        plain = [r for r in part if r.method == "plain"]
        plain_tps, plain_decode = rates(plain)
        for method in dict.fromkeys(r.method for r in part):
            mine = [r for r in part if r.method == method]
            tps, decode = rates(mine)
            tokens = sum(len(r.tokens) for r in mine)
            steps = sum(r.steps for r in mine)
            rows.append(
                BenchRow(
                    method,
                    domain,
                    len(mine),
                    tokens,
                    sum(r.time_s for r in mine),
                    tps,
                    decode,
                    decode / plain_decode,
                    tps / plain_tps,
                    tokens / steps if steps else float("nan"),
                    all(r.tokens == reference[r.prompt_id] for r in mine),
                    *speedup_interval(mine, plain),
                )
            )
    return rows
