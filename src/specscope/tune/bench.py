"""``specscope bench``: tokens per second of plain, assisted (transformers), chain, uniform-tree,
routed and dynamic decoding, and of chains from the model-free and early-exit drafters (``ngram``,
``early-exit``), per domain, every method on every prompt with methods interleaved.

What a bench can confirm:

- **Held-out prompts.** The prompts that any tuning run of the policy measured (the policy file's
  ``source``: its ``prompt_ids``, and each run's, or the run directory's manifest) are never timed
  (:func:`tuning_prompts`, :func:`check_held_out`); with ``in_sample`` they may be, and every run
  on one is labelled in-sample.
- **Predicted against measured, every cell** (:func:`predicted_vs_measured`): the tokens per step
  and the speed-up the policy file predicted when it was tuned, before the bench, beside what the
  bench measured (tokens per decoding step counted as the decoder counts them: the prefill's
  token is one step).
- **Is the interval narrow enough** (``speedup_precision``): each domain's decode speed-up with
  an interval over prompts and repeats (method and plain paired by repeat; the two are crossed,
  so each is resampled whole), whether its half-width is within ±5% of the speed-up, and if not
  how many prompts (at these repeats) or repeats (at these prompts) would make it so, from the
  two variances. One repeat gives no verdict: what varies between repeats is then unmeasured.
- **Regret and the route test** (``regrets``, ``routed_against_best_single``): the chosen
  candidate against the best one measured, and routed against the best single one, with an
  interval of the least of the true ratios to every candidate (``least_ratio``), since the best
  is picked on the same prompts (the best of several noisy speed-ups is optimistic); a verdict on
  "3% or less" and on "routing beats", "not testable" with one repeat.

Times the decoder of :mod:`specscope.decode`; does not choose trees (:mod:`specscope.tune.policy`).
The statistics over the timed runs (``summarize_bench``, ``speedup_precision``, ``regrets``,
``least_ratio``: speed-ups and their intervals, precision, regret) are
:mod:`specscope.analysis.bench_stats`'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from ..analysis.bench_stats import (
    REGRET_BOUND,
    TARGET_HALF_WIDTH,
    BenchError,
    BenchRow,
    BenchRun,
    SpeedupPrecision,
)
from ..analysis.render import Column, Grid
from ..analysis.stats import none_differed_p
from ..cache import local_path
from ..core.loop import DecodeConfig, DecodeError
from ..decode import SpeculativeDecoder
from ..drafters import DrafterConfig
from ..files import read_json_object, read_toml_table
from ..hardware import machine_line
from ..progress import counting
from ..prompts.domains import select_prompts
from ..prompts.items import PromptItem, sample_items
from ..prompts.render import render_item
from ..records import ALL_DOMAINS
from ..trees import DynamicTree, TreeShape
from .backends import (
    PLAIN,
    Backend,
    DecoderSetting,
    Engines,
    Prompt,
    Request,
    SpecscopeBackend,
    TransformersBackend,
    TransformersSetting,
)
from .predict import Prediction, Stop
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
    every method on the first prompt; each prompt's time is the repeats' median."""

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
    # the 'assisted' method's chain length K (None: transformers' defaults, which tune cannot
    # predict: up to 20 tokens, stopped by a draft-confidence threshold re-fitted as it goes)
    assisted_tokens: int | None = None
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
        if self.assisted_tokens is not None and self.assisted_tokens < 1:
            raise DecodeError(
                f"assisted_tokens must be >= 1 (or none: transformers' defaults), got "
                f"{self.assisted_tokens}"
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

    @classmethod
    def from_dict(cls, data: Mapping) -> BenchConfig:
        """The config as a bench record holds it (``dataclasses.asdict``), read back."""
        nested = {
            "methods": tuple(data["methods"]),
            "dynamic": DynamicTree(**data["dynamic"]),
            "ngram": DrafterConfig(**data["ngram"]),
            "early_exit": DrafterConfig(**data["early_exit"]) if data.get("early_exit") else None,
        }
        return cls(**{**data, **nested})

    def drafter(self, method: str) -> DrafterConfig | None:
        """The drafter a method runs; None: the pair's draft model (or no speculation)."""
        return {"ngram": self.ngram, "early-exit": self.early_exit}.get(method)


ROUTERS = ("rules", "learned")
# what `specscope bench --backend` times: the pair loaded here (specscope's decoder beside
# transformers), llama-server spawned from a policy's GGUF files, or servers at URLs
BACKENDS = ("specscope", "llama-server", "openai")


@dataclass(frozen=True)
class TuningPrompts:
    """The prompts the tuning runs of a policy measured, and where that came from."""

    ids: frozenset[str]
    runs: tuple[str, ...]  # each tuning run, by run id (or directory)
    known: bool  # False: the policy names no tuning runs (written by hand, or no policy)


def tuning_prompts(policy) -> TuningPrompts:
    """The prompt ids of every run a policy was tuned on: its ``source.prompt_ids`` (the first
    run's) and, for each of ``source.runs``, the run's ``prompt_ids`` or, where the file lacks
    them, the ``prompts.ids`` of the manifest in its ``run_dir``. A run found in neither is
    refused: the bench could not tell its prompts from held-out ones."""
    source = (policy.info.get("source") if policy is not None else None) or {}
    if not source:
        return TuningPrompts(frozenset(), (), known=False)
    ids = set(source.get("prompt_ids") or ())
    first = str(source.get("run_id") or source.get("run_dir") or "the first tuning run")
    if not ids:
        ids |= _run_prompt_ids(source, first)
    runs = [first]
    for run in source.get("runs") or ():
        name = str(run.get("run_id") or run.get("run_dir") or "a tuning run")
        if name == first:  # the first run: its ids are source.prompt_ids
            continue
        runs.append(name)
        ids |= set(run.get("prompt_ids") or ()) or _run_prompt_ids(run, name)
    return TuningPrompts(frozenset(ids), tuple(runs), known=True)


def _run_prompt_ids(run: Mapping, name: str) -> set[str]:
    """A tuning run's prompt ids from its run directory's manifest (or prompts table)."""
    from ..records.rundir import RunDir

    run_dir = local_path(str(run.get("run_dir") or ""))
    manifest = RunDir(run_dir).read_manifest() if (run_dir / "manifest.json").is_file() else None
    ids = ((manifest or {}).get("prompts") or {}).get("ids")
    if ids:
        return set(map(str, ids))
    if (run_dir / "prompts.parquet").is_file():
        return set(pd.read_parquet(run_dir / "prompts.parquet", columns=["prompt_id"])["prompt_id"])
    raise BenchError(
        f"the policy was tuned on run {name}, but its file lists none of that run's prompt ids "
        f"and its run directory {str(run_dir) or '(none named)'} holds no manifest or prompts "
        "table: the bench cannot tell its prompts from held-out ones; tune the policy again "
        "(a policy records every tuning run's prompts), or make the run directory readable"
    )


def check_held_out(items: Sequence[PromptItem], tuned: TuningPrompts, in_sample: bool) -> None:
    """Refuse timing a prompt a tuning run measured, unless ``in_sample`` (then it is labelled)."""
    seen = [it.id for it in items if it.id in tuned.ids]
    if seen and not in_sample:
        raise BenchError(
            f"{len(seen)} of the bench's prompts were measured by the policy's tuning runs "
            f"({', '.join(tuned.runs)}), e.g. {seen[0]!r}: a prediction checked on them is "
            "checked in-sample; time held-out prompts, or label them in-sample (in_sample, "
            "--in-sample)"
        )


@dataclass(frozen=True)
class BenchPrompts:
    """What the bench times, chosen so that nothing it is scored on was seen before."""

    items: list[PromptItem]  # per domain, a seeded sample of the held-out half
    routers: dict[str, object]  # ROUTERS -> a router (the learned one trained on the other half)
    reports: list[RouterReport]  # each router's accuracy on the held-out half
    held_out: int  # prompts in the held-out half
    tuned: TuningPrompts = TuningPrompts(frozenset(), (), known=False)
    in_sample: bool = False  # tuning prompts may be timed (labelled in-sample)
    tuning_only: bool = False  # only tuning prompts are timed (and scored)
    tuning_per_domain: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def held_out_rule(self) -> HeldOut:
        """What :func:`run_bench` refuses of these prompts (or labels in-sample)."""
        return HeldOut(self.tuned, self.in_sample)

    @property
    def in_sample_ids(self) -> frozenset[str]:
        """The timed prompts a tuning run measured."""
        return frozenset(it.id for it in self.items if it.id in self.tuned.ids)


def bench_prompts(
    domains: list[str],
    per_domain: int,
    seed: int,
    policy,
    router: str = "rules",
    in_sample: bool = False,
    split: bool = True,
    tuning_only: bool = False,
) -> BenchPrompts:
    """Every prompt of ``domains`` except those the policy's tuning runs measured
    (:func:`tuning_prompts`; with ``in_sample`` they stay, to be labelled), split in half: one
    half trains the learned router; the other scores the routers and gives ``per_domain``
    prompts per domain to time. A domain with fewer held-out prompts than ``per_domain`` is
    refused. The learned router is trained only where its training half has two domains or more
    (a classifier needs two classes); asking for it with fewer is refused. ``split`` False
    (the rule router alone): no half trains anything, so every held-out prompt may be timed.
    ``tuning_only``: the prompts the tuning runs measured and no other, labelled in-sample (the
    prediction checked on the prompts it was made from, each output against the recorded one)."""
    tuned = tuning_prompts(policy)
    if tuning_only and not tuned.ids:
        raise BenchError("the policy names no tuning run's prompts to time (--tuning-prompts)")
    in_sample = in_sample or tuning_only
    every = select_prompts(domains, None, seed=seed)
    pool = [
        it
        for it in every
        if (it.id in tuned.ids if tuning_only else in_sample or it.id not in tuned.ids)
    ]
    if split:
        train, test = holdout_split(pool, 0.5, seed)
    elif router != "rules":
        raise DecodeError(f"--router {router} is trained on half the held-out prompts")
    else:
        train, test = [], pool
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
    per_domain_items = []
    for d in domains:
        held = [i for i in test if i.domain == d]
        if len(held) < per_domain:
            raise BenchError(
                f"domain {d!r} has {len(held)} tuning prompts to time, fewer than the "
                f"{per_domain} asked for"
                if tuning_only
                else f"domain {d!r} has {len(held)} held-out prompts to time (its prompts less "
                f"those the tuning runs measured"
                f"{', halved for the learned router' if split else ''}), fewer than the "
                f"{per_domain} asked for: ask for fewer, or label tuning prompts in-sample"
            )
        per_domain_items.append(sample_items(held, per_domain, seed))
    # the domains take turns, so that a machine drifting during the bench moves every domain
    # alike, and a bench stopped early holds every domain
    items = [i for row in zip(*per_domain_items) for i in row]
    check_held_out(items, tuned, in_sample)
    return BenchPrompts(
        items,
        routers,
        [router_accuracy(r, test) for r in routers.values()],
        len(test),
        tuned,
        in_sample,
        tuning_only,
        tuning_per_domain(every, tuned),
    )


def tuning_per_domain(items: Sequence[PromptItem], tuned: TuningPrompts) -> dict[str, int]:
    """Domain -> how many of ``items`` (every prompt of the domains) the tuning runs measured."""
    return dict(Counter(it.domain for it in items if it.id in tuned.ids))


# a drafter -> the decoder that drafts with it (make_decoder of the loaded pair)
DecoderFor = Callable[[DrafterConfig], SpeculativeDecoder]


class Setting(NamedTuple):
    """What a method decodes with (routed's depends on the prompt's routed domain)."""

    drafter: DrafterConfig
    tree: TreeShape | DynamicTree | None
    backend: str = "specscope"
    stop: Stop | None = None


def method_settings(policy, config: BenchConfig) -> dict[str, Setting]:
    """The (drafter, tree, backend, stop) of each of ``config``'s methods that decodes with a
    fixed one (chain, dynamic, uniform, the drafter methods, and assisted with
    ``assisted_tokens``; not plain, assisted on transformers' defaults, or routed)."""
    if policy is None and ("uniform" in config.methods or "routed" in config.methods):
        raise DecodeError("methods 'uniform' and 'routed' need a policy file (specscope tune)")
    chain = TreeShape.chain(config.chain_depth)
    settings: dict[str, Setting] = {
        "chain": Setting(DrafterConfig(), chain),
        "dynamic": Setting(DrafterConfig(), config.dynamic),
        **{m: Setting(config.drafter(m), chain) for m in DRAFTER_METHODS if m in config.methods},
    }
    if config.assisted_tokens is not None:
        settings["assisted"] = Setting(
            DrafterConfig(), TreeShape.chain(config.assisted_tokens), "transformers"
        )
    if policy is not None:
        settings["uniform"] = policy_setting(policy, ALL_DOMAINS)  # a domain not listed
    return {m: s for m, s in settings.items() if m in config.methods}


def policy_setting(policy, domain: str) -> Setting:
    """The (drafter, tree, backend, stop) a policy file gives ``domain``."""
    drafter, tree = policy.drafter_for(domain), policy.tree_for(domain)
    return Setting(drafter, tree, policy.backend_for(domain), policy.stop_for(domain))


def _same(a: Setting, b: Setting) -> bool:
    return a[0].resolved() == b[0].resolved() and a[1:] == b[1:]


def policy_choices(policy, config: BenchConfig, domains: Sequence[str]) -> dict[str, str]:
    """domain -> the bench method that decodes as the policy's entry for it does (``plain``
    where the policy does not speculate; a domain whose setting no method times is left out):
    what :func:`regrets` scores."""
    settings = method_settings(policy, config)
    order = sorted(settings, key=lambda m: m == "uniform")  # a method of its own first
    out = {}
    for domain in domains:
        mine = policy_setting(policy, domain)
        if mine[1] is None:
            out[domain] = "plain"
            continue
        match = next((m for m in order if _same(settings[m], mine)), None)
        if match is not None:
            out[domain] = match
    return out


def typed_setting(setting: Setting) -> DecoderSetting | TransformersSetting:
    """A policy's (drafter, tree, backend, stop) as the backend setting that decodes it."""
    drafter, tree, backend, stop = setting
    if backend == "transformers":
        return TransformersSetting(assisted=True, tokens=len(tree))
    return DecoderSetting(drafter, tree, stop) if tree is not None else PLAIN


def decoder_methods(policy, router, config: BenchConfig) -> dict[str, object]:
    """The decoder bench's methods as backend settings: plain and assisted in transformers
    (assisted on transformers' adaptive defaults without ``assisted_tokens``), the rest in
    specscope's decoder, routed a :class:`Route` to the policy's entry for the prompt's domain."""
    fixed = {m: typed_setting(s) for m, s in method_settings(policy, config).items()}
    methods = {
        "plain": PLAIN,
        "assisted": TransformersSetting(assisted=True, tokens=config.assisted_tokens),
        **fixed,
    }
    if policy is not None:
        methods["routed"] = Route(
            router.classify, lambda domain: typed_setting(policy_setting(policy, domain))
        )
    return {m: methods[m] for m in config.methods}


def decoder_backend(decoder_for: DecoderFor, config: BenchConfig) -> Engines:
    """specscope's decoder beside transformers' generate() on the pair ``decoder_for`` loads."""
    decoder = decoder_for(DrafterConfig())
    greedy = DecodeConfig(max_new_tokens=config.max_new_tokens, min_path_prob=config.min_path_prob)
    return Engines(
        {
            TransformersSetting: TransformersBackend(
                decoder.target, decoder.draft, decoder.eos, config.max_new_tokens
            ),
            DecoderSetting: SpecscopeBackend(decoder_for, greedy),
        }
    )


def bench_decoder(
    decoder_for: DecoderFor,
    tokenizer,
    items: Sequence[PromptItem],
    policy,
    router,
    config: BenchConfig = BenchConfig(),
    log=None,
    held_out: HeldOut | None = None,
    checkpoint: BenchCheckpoint | None = None,
) -> list[BenchRun]:
    """specscope's decoder and transformers on the pair loaded here, timed through
    :func:`run_bench` (the runs alone; :func:`specscope.tune.study.bench` concludes)."""
    prompts = rendered_prompts(items, tokenizer, config.rendering, config.max_prompt_tokens)
    methods = decoder_methods(policy, router, config)
    loop = Loop(config.repeats, config.warmup, held_out or HeldOut())
    backend = decoder_backend(decoder_for, config)
    return run_bench(backend, prompts, methods, loop, log, checkpoint).runs


def rendered_prompts(
    items: Sequence[PromptItem], tokenizer, rendering: str, max_tokens: int
) -> list[Prompt]:
    """The prompts rendered for the pair's tokenizer (see :mod:`specscope.prompts.render`)."""
    return [
        Prompt(
            item, tuple(render_item(tokenizer, item, rendering, max_tokens).ids), prompt_text(item)
        )
        for item in items
    ]


# --- the one loop ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """The routed method: the router's domain for a prompt's text, and the setting for it."""

    classify: Callable[[str], str]
    setting_for: Callable[[str], object]


@dataclass(frozen=True)
class HeldOut:
    """Which prompts the policy's tuning runs measured: timing one is refused unless
    ``in_sample`` (then its runs are labelled in-sample)."""

    tuned: TuningPrompts = TuningPrompts(frozenset(), (), known=False)
    in_sample: bool = False


@dataclass(frozen=True)
class Loop:
    """How :func:`run_bench` times: ``repeats`` of every method on every prompt after
    ``warmup`` untimed rounds on the first prompt, refusing prompts ``held_out`` names."""

    repeats: int = 3
    warmup: int = 0
    held_out: HeldOut = HeldOut()


@dataclass(frozen=True)
class Timed:
    """What :func:`run_bench` timed: every request, and one :class:`BenchRun` per method and
    prompt (the repeats' median)."""

    requests: tuple[Request, ...]
    runs: list[BenchRun]


@dataclass(frozen=True)
class _Plan:
    """One prompt's methods resolved: method -> the key of the setting it decodes with (methods
    decoding alike share a key, timed once), and the routed method's domain."""

    keys: dict[str, str]
    routed_to: dict[str, str]  # a routed method -> the router's domain for the prompt


def _plans(methods: Mapping[str, object], prompts: Sequence[Prompt]):
    """Each prompt's :class:`_Plan`, and key -> setting over all prompts (a key is the first
    method decoding with the setting, or ``routed:DOMAIN`` for a route to a setting no fixed
    method has)."""
    settings: dict[str, object] = {}

    def key(name: str, setting) -> str:
        found = next((k for k, s in settings.items() if s == setting), None)
        if found is None:
            settings[name] = setting
        return found or name

    fixed = {m: key(m, s) for m, s in methods.items() if not isinstance(s, Route)}
    plans = []
    for p in prompts:
        keys, routed_to = dict(fixed), {}
        for m, route in methods.items():
            if isinstance(route, Route):
                routed_to[m] = domain = route.classify(p.text)
                keys[m] = key(f"{m}:{domain}", route.setting_for(domain))
        plans.append(_Plan({m: keys[m] for m in methods}, routed_to))
    return plans, settings


def run_bench(
    backend: Backend,
    prompts: Sequence[Prompt],
    methods: Mapping[str, object],
    loop: Loop = Loop(),
    log=None,
    checkpoint: BenchCheckpoint | None = None,
    earlier: Sequence[Request] = (),
) -> Timed:
    """Time every method (a backend setting, or a :class:`Route`) on every prompt, ``repeats``
    times, the settings of a prompt interleaved in an order that rotates prompt by prompt and
    repeat by repeat; one round is one prompt in one repeat. Prompts the policy's tuning runs
    measured are refused (``loop.held_out``). Rounds go prompt by prompt, the repeats of each
    together, or, for a backend that needs a fresh session every repeat (llama-server's
    servers), repeat by repeat. With a ``checkpoint``, each round's requests are appended to it
    as timed and the rounds it holds are not timed again, nor those of ``earlier`` (requests of
    this bench timed before, such as a ``requests.parquet``'s). Methods decoding alike (``uniform``
    equal to ``chain``; ``routed`` where the router sends the prompt to another method's
    setting) share one timing: routing adds one classification and the greedy output is the
    same, so the bench does not pay twice for it."""
    items = [p.item for p in prompts]
    check_held_out(items, loop.held_out.tuned, loop.held_out.in_sample)
    plans, settings = _plans(methods, prompts)
    if backend.fresh_per_repeat:
        rounds = [(rep, i) for rep in range(loop.repeats) for i in range(len(prompts))]
    else:
        rounds = [(rep, i) for i in range(len(prompts)) for rep in range(loop.repeats)]
    done: dict[tuple[int, str], list[Request]] = {}
    for r in earlier:
        done.setdefault((r.repeat, r.prompt_id), []).append(r)
    done |= checkpoint.load() if checkpoint is not None else {}
    if done and log:
        log(f"resuming: {len(done)} of {len(rounds)} rounds timed before ({checkpoint.path})")
    here = machine_line()
    requests: dict[tuple[int, str], list[Request]] = {}
    session, session_rep, warmup = None, None, loop.warmup if prompts else 0
    with ExitStack() as stack, counting("bench", "rounds", len(rounds), len(done)) as advance:
        for rep, i in rounds:
            item = items[i]
            if (rep, item.id) in done:
                requests[rep, item.id] = done[rep, item.id]
                continue
            if session is None or (backend.fresh_per_repeat and rep != session_rep):
                stack.close()
                session, session_rep = stack.enter_context(backend.session(settings)), rep
            for _ in range(warmup):
                for k in dict.fromkeys(plans[0].keys.values()):
                    session(k, prompts[0])
            warmup = 0
            keys = list(dict.fromkeys(plans[i].keys.values()))
            shift = (i + rep) % len(keys)
            timed = []
            for k in keys[shift:] + keys[:shift]:
                out = session(k, prompts[i])
                timed.append(Request(**asdict(out), method=k, prompt_id=item.id,
                                     domain=item.domain, repeat=rep, machine=here))  # fmt: skip
            requests[rep, item.id] = timed
            if checkpoint is not None:
                checkpoint.append(timed)
            advance()
    in_sample = loop.held_out.tuned.ids
    runs = [
        bench_run(m, item, plan, requests, loop.repeats, item.id in in_sample)
        for item, plan in zip(items, plans)
        for m in plan.keys
    ]
    return Timed(tuple(r for rs in requests.values() for r in rs), runs)


def bench_run(method, item, plan: _Plan, requests, repeats: int, in_sample: bool) -> BenchRun:
    """One method on one prompt: the median over repeats of the time and of the first step's,
    every repeat kept, the last repeat's output."""
    key = plan.keys[method]
    mine = [
        next(r for r in requests[rep, item.id] if r.method == key)
        for rep in range(repeats)
        if (rep, item.id) in requests
    ]
    last = mine[-1]
    times = tuple(r.time_s for r in mine)
    firsts = tuple(r.first_token_s for r in mine)
    return BenchRun(
        method,
        item.id,
        item.domain,
        plan.routed_to.get(method, ""),
        last.output_ids,
        last.steps,
        statistics.median(times),
        statistics.median(firsts),
        times,
        firsts,
        in_sample,
        last.first_tokens,
    )


@dataclass(frozen=True)
class BenchCheckpoint:
    """A bench's timed rounds (one prompt in one repeat), appended one line per round (its
    requests) to a JSON Lines file as they finish (``OUT.partial.jsonl`` beside the bench's
    ``--out``), so that an interrupted bench loses at most the round it was timing: the same
    command resumes. The first line is ``key`` (the config, the policy, the prompts, the
    machine); a file with another key is refused by name."""

    path: Path
    key: dict

    def load(self) -> dict[tuple[int, str], list[Request]]:
        """The requests of every round timed before, by (repeat, prompt id) (none: a new file
        is begun)."""
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write([json.dumps(self.key)], "w")
            return {}
        lines = self.path.read_text().splitlines()
        try:
            same = bool(lines) and json.loads(lines[0]) == json.loads(json.dumps(self.key))
        except ValueError:
            same = False
        if not same:
            raise BenchError(
                f"{self.path} holds a bench of other settings (its config, policy, prompts or "
                "machine differ): delete it to start this bench afresh, or run the command that "
                "began it"
            )
        done: dict[tuple[int, str], list[Request]] = {}
        for n, line in enumerate(lines[1:], 1):
            try:
                timed = [Request.from_dict(r) for r in json.loads(line)]
            except (ValueError, TypeError):  # cut short by the interruption: timed again
                self._write(lines[:n], "w")
                break
            done[timed[0].repeat, timed[0].prompt_id] = timed
        return done

    def append(self, requests: Sequence[Request]) -> None:
        self._write([json.dumps([r.to_dict() for r in requests])], "a")

    def _write(self, lines: list[str], mode: str) -> None:
        with self.path.open(mode) as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())


# --- predicted against measured --------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyPrediction:
    """What a tuned policy file predicted for one of its entries, when it was tuned."""

    tokens_per_step: Prediction | None  # None: the entry carries no prediction
    speedup: float  # predicted speed-up of decoding over plain (nan: none)


def policy_predictions(path: str | Path) -> dict[str, PolicyPrediction]:
    """Each entry's prediction as the policy file holds it (domain name, or ``ALL_DOMAINS`` for
    the uniform entry): its ``prediction`` and ``predicted_speedup``; entries without them (a
    hand-written policy) are left out."""
    from .policy import PolicyError, PolicyFile

    path = Path(path)
    if path.suffix == ".toml":
        data = read_toml_table(path, PolicyError, "policy file")
    else:
        data = read_json_object(path, PolicyError, "policy file")
    loaded = PolicyFile.from_dict(data, str(path))  # checks every entry
    entries = {**(data.get("domains") or {}), ALL_DOMAINS: data.get("uniform")}
    out = {}
    for name, entry in entries.items():
        speedup = entry.get("predicted_speedup") if isinstance(entry, dict) else None
        tokens = loaded.predictions.get(name)
        if tokens is None and not isinstance(speedup, (int, float)):
            continue
        out[name] = PolicyPrediction(
            tokens, float(speedup) if isinstance(speedup, (int, float)) else math.nan
        )
    return out


def routed_predictions(policy, router: str) -> dict[str, PolicyPrediction]:
    """Domain -> what ``tune`` predicted for the domain's prompts as ``router`` routes them (the
    policy file's ``routed`` table, :mod:`.routed`); empty for a file without one or made for
    another router."""
    from .policy import PolicyError

    table = (policy.info.get("routed") if policy is not None else None) or {}
    if table.get("router") != router:
        return {}
    out = {}
    for domain, entry in (table.get("domains") or {}).items():
        where = f"policy file: routed.domains.{domain}"
        if not isinstance(entry, dict) or "prediction" not in entry:
            raise PolicyError(f"{where} must be a table with a prediction")
        out[str(domain)] = PolicyPrediction(
            Prediction.from_dict(entry["prediction"], where),
            float(entry.get("predicted_speedup", math.nan)),
        )
    return out


def candidate_predictions(policy, config: BenchConfig) -> dict[tuple[str, str], PolicyPrediction]:
    """(method, domain) -> the prediction ``tune`` made for the drafter and tree that a bench
    method decodes with (the policy file's ``candidates``: every chain of every drafter tuned
    over), so that the chains benched beside the chosen ones are predicted too."""
    from .policy import parse_backend, parse_drafter, parse_tree

    settings = method_settings(policy, config)
    out = {}
    for i, entry in enumerate(policy.info.get("candidates") or ()):
        where = f"policy file: candidates[{i}]"
        setting = Setting(  # candidates are chains without a stop rule
            parse_drafter(entry, where), parse_tree(entry, where), parse_backend(entry, where)
        )
        for method, mine in settings.items():
            if _same(mine, setting):
                out[(method, str(entry["domain"]))] = PolicyPrediction(
                    Prediction.from_dict(entry["prediction"], where),
                    float(entry["predicted_speedup"]),
                )
    return out


@dataclass(frozen=True)
class PredictedCell:
    """One bench cell (method x domain): what the policy predicted beside what was measured."""

    method: str
    domain: str
    prompts: int
    in_sample: int  # of its prompts, those a tuning run measured
    predicted: PolicyPrediction | None  # None: the policy predicts nothing for this cell
    tokens_per_step: float  # measured: output tokens over decoding steps (prefill's included)
    speedup: float  # measured decode speed-up over plain, same prompts
    speedup_lo: float
    speedup_hi: float
    # the tuning runs' prompts in the domain: the prompts behind a prediction whose policy file
    # predates recording them (0: not known)
    tuning_prompts: int = 0
    # where every tuning prompt decoded the same tokens per step (an interval of no width): of
    # this cell's prompts, those that decoded another (None: the interval has width, or none)
    differing: int | None = None

    @property
    def tokens_interval(self) -> tuple[float, float] | None:
        """Where the tokens per step of this cell's prompts were predicted to fall: the
        prediction's interval widened for a sample of held-out prompts of this size
        (:meth:`Prediction.held_out`; None: no interval, or no prompt count behind it)."""
        p = self.predicted.tokens_per_step if self.predicted else None
        return p.held_out(self.prompts, self.tuning_prompts) if p is not None else None

    @property
    def tokens_inside(self) -> bool | None:
        """Whether the measured tokens per step lie in :attr:`tokens_interval`; where that has
        no width (every tuning prompt decoded the same tokens per step), whether no more of
        this cell's prompts decoded another than one population allows
        (:func:`~specscope.analysis.stats.none_differed_p` at 5%). None: no interval, or one of
        no width without the count of prompts that differ."""
        interval = self.tokens_interval
        if interval is None:
            return None
        lo, hi = interval
        if hi - lo < 1e-9:
            if self.differing is None:
                return True if abs(self.tokens_per_step - lo) < 1e-9 else None
            fitted = self.predicted.tokens_per_step.prompts or self.tuning_prompts
            return none_differed_p(fitted, self.prompts, self.differing) >= 0.05
        return lo <= self.tokens_per_step <= hi


def predicted_vs_measured(
    rows: Sequence[BenchRow],
    runs: Sequence[BenchRun],
    predictions: Mapping[str, PolicyPrediction],
    candidates: Mapping[tuple[str, str], PolicyPrediction] | None = None,
    tuning_prompts: Mapping[str, int] | None = None,
    routed: Mapping[str, PolicyPrediction] | None = None,
) -> tuple[PredictedCell, ...]:
    """Every cell of the bench's summary but plain's, with the policy's prediction where it
    made one: the routed method in a domain, its routed prediction (``routed``) or else that
    domain's entry; any other method,
    ``candidates[(method, domain)]`` (the prediction for its drafter and tree in that domain:
    :func:`candidate_predictions`, or a timed backend's); the uniform method without one, the
    uniform entry (pooled over the domains). ``tuning_prompts``: domain -> the tuning runs'
    prompts in it (:attr:`BenchPrompts.tuning_per_domain`), for predictions that do not record
    the prompts behind their interval. ``routed``: domain -> the prediction for its prompts as
    the bench's router sends them (:func:`routed_predictions`), which the routed method is set
    against where the policy holds one (else the domain's entry)."""
    candidates = candidates or {}
    tuning_prompts = tuning_prompts or {}
    routed = routed or {}
    cells = []
    for r in rows:
        if r.method == "plain" or r.domain == ALL_DOMAINS:
            continue
        mine = [x for x in runs if x.method == r.method and x.domain == r.domain]
        if r.method == "routed":
            predicted = routed.get(r.domain) or predictions.get(r.domain)
        elif r.method == "uniform" and (r.method, r.domain) not in candidates:
            predicted = predictions.get(ALL_DOMAINS)
        else:
            predicted = candidates.get((r.method, r.domain))
        cells.append(
            PredictedCell(
                r.method,
                r.domain,
                r.prompts,
                sum(x.in_sample for x in mine),
                predicted,
                r.tau,
                r.speedup,
                r.speedup_lo,
                r.speedup_hi,
                tuning_prompts.get(r.domain, 0),
                differing_prompts(predicted, mine),
            )
        )
    return tuple(cells)


def differing_prompts(predicted: PolicyPrediction | None, runs: Sequence[BenchRun]) -> int | None:
    """Where the predicted interval has no width (every tuning prompt decoded the same tokens
    per step), how many of ``runs`` decoded another (to 4 decimals, as the policy file holds
    the prediction); None where it has width or there is none."""
    p = predicted.tokens_per_step if predicted else None
    if p is None or not math.isfinite(p.lo) or p.hi - p.lo >= 1e-9:
        return None
    return sum(abs(len(x.tokens) / max(x.steps, 1) - p.tokens_per_step) > 5e-5 for x in runs)


def _number(x: float, digits: int = 2, suffix: str = "") -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}{suffix}"


def prediction_grid(cells: Sequence[PredictedCell], tuned: TuningPrompts) -> Grid:
    """Predicted (when the policy was tuned) against measured, every cell."""

    def predicted_tokens(c: PredictedCell) -> str:
        p = c.predicted.tokens_per_step if c.predicted else None
        if p is None:
            return "-"
        interval = f" [{p.lo:.2f}, {p.hi:.2f}]" if math.isfinite(p.lo) else ""
        return f"{p.tokens_per_step:.2f}{interval} ({p.method})"

    def held_out(c: PredictedCell) -> str:
        interval = c.tokens_interval
        return "-" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"

    rows = tuple(
        (
            c.domain,
            c.method,
            f"{c.prompts}" + (f" ({c.in_sample} in-sample)" if c.in_sample else " held out"),
            predicted_tokens(c),
            held_out(c),
            _number(c.tokens_per_step),
            {None: "-", True: "yes", False: "no"}[c.tokens_inside],
            _number(c.predicted.speedup if c.predicted else math.nan, suffix="x"),
            _number(c.speedup, suffix="x")
            + (f" [{c.speedup_lo:.2f}, {c.speedup_hi:.2f}]" if math.isfinite(c.speedup_lo) else ""),
        )
        for c in cells
    )
    where = (
        f"tuning runs {', '.join(tuned.runs)}"
        if tuned.known
        else "the policy names no tuning runs: whether its prompts were held out is unknown"
    )
    columns = (
        "domain",
        "method",
        "prompts",
        "predicted tokens/step",
        "for these prompts",
        "measured tokens/step",
    )
    return Grid(
        "bench_predicted",
        "predicted (policy file, before the bench) against measured",
        tuple(
            Column(c)
            for c in (*columns, "inside", "predicted speed-up", "measured speed-up (95% CI)")
        ),
        rows,
        "tokens per step: output tokens over decoding steps, the prefill's token one step (as "
        "specscope's decoder counts them, and tune's replay with a plain prefill pass). routed: "
        "the domain's tuning prompts as the router sent them, each replayed with the entry it "
        "was sent to (a policy file without that: the domain's entry); another method: the "
        "prediction tune made for its drafter and tree in the domain where the policy holds "
        "one (its candidates: every chain of each drafter tuned over, or a timed backend's "
        "settings); else uniform: the uniform entry (pooled), "
        "another: none. The predicted interval bounds the tuning prompts' population; "
        "'for these prompts' widens it for a sample of the cell's held-out prompts (the two "
        "samples' variances add), and 'inside' checks the measurement against that; where "
        "every tuning prompt decoded the same (an interval of no width), 'inside' asks whether "
        "no more of the cell's prompts decoded another than one population allows (Fisher's "
        "exact test at 5%: at 20 and 20 prompts, up to 4). "
        f"Held out from: {where}.",
    )


# --- the same output everywhere ---------------------------------------------------------------


@dataclass(frozen=True)
class OutputAgreement:
    """One method's greedy outputs against those a measurement run recorded for the same
    prompts (compared as :func:`first_difference` does)."""

    method: str
    prompts: int  # prompts both have
    equal: int
    first_difference: tuple[int, ...]  # for each other prompt, the first token index that differs


def first_difference(mine: Sequence[int], theirs: Sequence[int], cut: int) -> int | None:
    """The first index where two greedy outputs differ over their first ``cut`` tokens (the
    smaller of the two runs' max new tokens); one ending (EOS) where the other goes on differs
    there. None: equal."""
    mine, theirs = mine[:cut], theirs[:cut]
    n = min(len(mine), len(theirs))
    diff = next((i for i in range(n) if mine[i] != theirs[i]), None)
    if diff is None and len(mine) != len(theirs):
        diff = n
    return diff


@dataclass(frozen=True)
class RecordedOutputs:
    """The greedy outputs measurement runs recorded (prompt id -> token ids; of several runs,
    the first holding the prompt), and the smallest max new tokens among the runs."""

    outputs: dict[str, tuple[int, ...]]
    max_new_tokens: int

    @classmethod
    def of(cls, runs: Sequence) -> RecordedOutputs:
        outputs: dict[str, tuple[int, ...]] = {}
        for run in runs:
            for r in run.prompts.itertuples():
                if r.output_token_ids is not None and r.prompt_id not in outputs:
                    outputs[r.prompt_id] = tuple(int(t) for t in r.output_token_ids)
        limits = [
            int(run.manifest.get("config", {}).get("max_new_tokens") or 0) or 2**31 for run in runs
        ]
        return cls(outputs, min(limits, default=2**31))


def policy_runs(policy) -> list:
    """The measurement runs a policy was tuned on that can still be read (their run
    directories), for comparing outputs; those gone are skipped."""
    from ..records import load_run
    from ..records.rundir import RunDirError

    source = (policy.info.get("source") if policy is not None else None) or {}
    dirs = dict.fromkeys(str(r.get("run_dir") or "") for r in [source, *(source.get("runs") or ())])
    runs = []
    for d in dirs:
        if d and Path(d).is_dir():
            try:
                runs.append(load_run(d))
            except (RunDirError, OSError):
                continue
    return runs


def outputs_against_recorded(
    runs: Sequence[BenchRun], recorded: Mapping[str, Sequence[int]], cut: int
) -> tuple[OutputAgreement, ...]:
    """Per method, its outputs against the recorded ones on the prompts both have, over the
    first ``cut`` tokens (see :func:`first_difference`)."""
    out = []
    for method in dict.fromkeys(r.method for r in runs):
        firsts = [
            first_difference(r.tokens, recorded[r.prompt_id], cut)
            for r in runs
            if r.method == method and r.prompt_id in recorded
        ]
        if firsts:
            differ = tuple(sorted(i for i in firsts if i is not None))
            out.append(OutputAgreement(method, len(firsts), len(firsts) - len(differ), differ))
    return tuple(out)


def agreement_grid(rows: Sequence[OutputAgreement], against: str) -> Grid:
    return Grid(
        "bench_outputs_vs_run",
        f"greedy outputs against {against}",
        tuple(Column(c) for c in ("method", "prompts", "equal", "first difference at token")),
        tuple(
            (
                r.method,
                str(r.prompts),
                str(r.equal),
                ", ".join(map(str, r.first_difference)) or "-",
            )
            for r in rows
        ),
        "equal: token for token over the smaller of the two max new tokens; an output that "
        "ended (EOS) where the other went on differs there.",
    )


# --- the chosen against the best measured, routed against the best single -----------------------


def regret_grid(rows, unscored: Sequence[str] = ()) -> Grid:
    """Each domain's regret; ``unscored``: the domains whose chosen setting no method timed,
    named so that a domain is never left out silently."""
    note = (
        "regret: 1 - chosen / best measured decode speed-up over plain. The best of several "
        "noisy speed-ups is optimistic; the interval is not: each candidate's speed against the "
        "chosen one's on the same prompts, prompts and repeats resampled, its upper end from "
        "each alone, its lower end from all held together (Bonferroni). The verdict: the true "
        "regret is "
        f"{REGRET_BOUND:.0%} or less (the interval below it), above it (the interval above "
        "it), or not testable (the interval holds it)."
    )
    if any(r.prompts for r in rows):
        note += (
            " routed (N prompts): the chosen setting was timed only inside routed, so it is "
            "scored on the N prompts the router sent to the domain's own entry, against every "
            "method on those prompts."
        )
    if unscored:
        note += (
            f" Not scored: {', '.join(unscored)} (the policy's setting there was timed by no "
            "method, and by routed on none of its prompts; bench it as a method to score it)."
        )
    return Grid(
        "bench_regret",
        "the chosen setting against the best one measured, per domain (held-out prompts)",
        tuple(
            Column(c)
            for c in (
                "domain",
                "chosen",
                "speed-up",
                "best measured",
                "speed-up",
                "regret (95% CI)",
                f"{REGRET_BOUND:.0%} or less",
            )
        ),
        tuple(
            (
                r.domain,
                f"{r.chosen} ({r.prompts} prompts)" if r.prompts else r.chosen,
                f"{r.chosen_speedup:.3f}x",
                r.best,
                f"{r.best_speedup:.3f}x",
                f"{r.regret:.1%}" + (f" [{r.lo:.1%}, {r.hi:.1%}]" if math.isfinite(r.hi) else ""),
                r.verdict,
            )
            for r in rows
        ),
        note,
    )


# --- is the interval narrow enough ---------------------------------------------------------------


def precision_grid(rows: Sequence[SpeedupPrecision]) -> Grid:
    """Each domain's speed-up interval, and whether it is narrow enough to confirm a prediction."""

    def verdict(r: SpeedupPrecision) -> str:
        if not math.isfinite(r.half_width):
            return "no: one prompt gives no interval; time more prompts"
        if r.repeats < 2:
            return (
                f"not testable: ±{r.half_width:.1%} over prompts, but one repeat leaves the "
                "variation between repeats unmeasured; time 2 or more"
            )
        if r.narrow_enough:
            return f"yes: ±{r.half_width:.1%}"
        more = f"no: ±{r.half_width:.1%}; ±{r.target:.0%} needs"
        if r.prompts_needed is None and r.repeats_needed is None:
            k = (r.half_width / r.target) ** 2  # both scaled by k: the variance by 1 / k
            return (
                f"{more} more prompts and repeats together, e.g. ~{math.ceil(r.prompts * k)} "
                f"prompts x ~{math.ceil(r.repeats * k)} repeats (neither alone can get there)"
            )
        if r.prompts_needed is None:
            return f"{more} ~{r.repeats_needed} repeats (prompts alone cannot get there)"
        more += f" ~{r.prompts_needed} prompts at {r.repeats} repeats"
        if r.repeats_needed is not None:
            return f"{more}, or ~{r.repeats_needed} repeats"
        return f"{more} (repeats alone cannot get there)"

    return Grid(
        "bench_precision",
        f"speed-up intervals (prompts and repeats resampled): ±{TARGET_HALF_WIDTH:.0%} or narrower?",
        tuple(
            Column(c)
            for c in (
                "domain",
                "method",
                "prompts",
                "repeats",
                "speed-up (95% CI)",
                "between repeats",
                "narrow enough",
            )
        ),
        tuple(
            (
                r.domain,
                r.method,
                r.prompts,
                r.repeats,
                _number(r.speedup, suffix="x")
                + (f" [{r.lo:.2f}, {r.hi:.2f}]" if math.isfinite(r.lo) else ""),
                f"{r.repeat_share:.0%}" if math.isfinite(r.repeat_share) else "-",
                verdict(r),
            )
            for r in rows
        ),
        "decode speed-up from each prompt's median time over repeats, method and plain paired by "
        "repeat; prompts and repeats are crossed (what a repeat brings, such as its freshly "
        "started servers, is common to all its prompts), so each is resampled whole and the two "
        "variances add (t interval); between repeats: the repeats' share of that variance. "
        "Prompts or repeats needed: what brings that variance down to the target's.",
    )


def checks_document(
    chosen: BenchPrompts,
    cells: Sequence[PredictedCell],
    precision: Sequence[SpeedupPrecision],
) -> dict:
    """The bench record's part on what it confirms: which prompts were held out, and
    :func:`conclusions_document`."""
    return {
        "held_out": {
            "tuning_runs": list(chosen.tuned.runs),
            "provenance": "policy source" if chosen.tuned.known else "none",
            "in_sample_allowed": chosen.in_sample,
            "in_sample_prompts": sorted(chosen.in_sample_ids),
        },
        **conclusions_document(cells, precision),
    }


def conclusions_document(
    cells: Sequence[PredictedCell], precision: Sequence[SpeedupPrecision]
) -> dict:
    """What a bench concludes from its runs: predicted against measured per cell, and each
    interval's width against the ±5% asked for (concluded again from the same runs by
    ``scripts/bench_conclude.py --update``)."""
    return {
        "predicted_vs_measured": [
            {
                **{k: v for k, v in dataclasses.asdict(c).items() if k != "predicted"},
                "predicted_tokens_per_step": (
                    c.predicted.tokens_per_step.to_dict()
                    if c.predicted and c.predicted.tokens_per_step
                    else None
                ),
                "predicted_speedup": c.predicted.speedup if c.predicted else None,
                "held_out_interval": list(c.tokens_interval) if c.tokens_interval else None,
                "tokens_inside": c.tokens_inside,
            }
            for c in cells
        ],
        "precision": [
            {**dataclasses.asdict(r), "half_width": r.half_width, "narrow_enough": r.narrow_enough}
            for r in precision
        ],
    }
