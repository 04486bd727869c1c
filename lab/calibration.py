"""Calibration of the findings' verdicts on synthetic runs whose truth is known.

A verdict is only worth its error rates. This module draws many synthetic runs (the paper's tree,
prompt-level random effects; :mod:`lab.synthetic`) from worlds where each claim of the paper is known
to be true or false, analyses each run exactly as ``specscope analyze`` does, and counts the
verdicts: the share of "holds" where the claim is false is the false-positive rate, where it is
true the power. It also measures how often the 95% interval of a domain's mean alpha covers the
true mean at small numbers of prompts per domain.

The stratified verdicts (each claim checked within every sibling rank, ``analyze --stratify``) are
calibrated the same way on worlds where the claim holds at every rank, and on Simpson's-paradox
worlds where it holds pooled (or at rank 0) but runs the other way at rank 1
(:data:`STRATIFIED_TRUTH`).

The drafter comparison ("drafter A accepts more than B in a domain", :mod:`specscope.analysis.drafters`) is
calibrated on pairs of synthetic drafters measured on the same prompts whose tau is known: equal
at every prompt (alike, or a lookup that proposes in only some steps but whose longer chains make
up for it), or apart by a known amount (:data:`DRAFTER_WORLDS`).

A bench's speed-up intervals are calibrated on synthetic benches whose prompts and repeats are
crossed, with and without an effect common to each repeat's prompts
(:func:`speedup_interval_coverage`), and its check of a prediction of no width (every tuning
prompt decoded alike) on prompts that differ with known chances (:func:`none_differed_false_alarms`).
Its regret verdict ("the chosen candidate gives up 3% or less of the best one's speed") is
calibrated on synthetic benches of known regret (:func:`regret_verdict_rates`).

``tests/test_calibration.py`` runs a small version in CI; the full table of docs/calibration.md comes from
``python -m lab.calibration`` (from a checkout's root). Nothing here reads a model.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from lab.synthetic import (
    DomainProfile,
    DrafterProfile,
    chain_expected_length,
    drafter_rates,
    synthetic_drafter_tables,
    synthetic_requests,
    synthetic_tables,
)
from specscope.analysis.bench_stats import BenchRun, regrets, speedup_precision, summarize_bench
from specscope.analysis.drafters import DrafterComparison, compare_drafters
from specscope.analysis.effects import check_stratifier
from specscope.analysis.findings import Verdict
from specscope.analysis.prepare import ALL, Records, prepare
from specscope.analysis.results import Analysis, Settings
from specscope.analysis.stats import ClusterBootstrap, held_out_interval, none_differed_p, ratio
from specscope.analysis.stepwise import analyze_ingested
from specscope.analysis.tables import analyze_records, stratified_analysis
from specscope.records import Run

DOMAINS = ("chat", "code", "math", "reasoning")


def _same(profile: DomainProfile) -> dict[str, DomainProfile]:
    return {d: profile for d in DOMAINS}


FLAT = DomainProfile(0.55, 0.24, 1.0)


@dataclass(frozen=True)
class World:
    """Parameters of :func:`synthetic_tables` that fix what is true."""

    description: str
    profiles: dict[str, DomainProfile] = field(default_factory=lambda: _same(FLAT))
    depth_effect: float = 0.0
    entropy_effect: float = 0.0
    prompt_sd: float = 0.35
    second_depth_effect: float = 0.0  # the same effects on the rank-1 token's log-odds
    second_entropy_effect: float = 0.0
    shared_context: bool = False  # siblings share their target entropy (as real siblings do)


WORLDS = {
    "null": World("no effect of domain, depth or entropy"),
    "heterogeneous": World(
        "no effect, prompts very unlike each other (prompt sd 1.0 logits)", prompt_sd=1.0
    ),
    "domain": World(
        "domains differ (top-token odds 0.70 / 0.60 / 0.45 / 0.55)",
        profiles={
            "chat": DomainProfile(0.70, 0.28, 1.0),
            "code": DomainProfile(0.60, 0.25, 1.0),
            "math": DomainProfile(0.45, 0.20, 1.0),
            "reasoning": DomainProfile(0.55, 0.24, 1.0),
        },
    ),
    "depth": World("acceptance rises with depth (+0.6 logits per depth)", depth_effect=0.6),
    "entropy": World("acceptance falls with entropy (ρ about −0.2)", entropy_effect=2.0),
    "paradox": World(
        "chat has the highest entropy and the highest acceptance",
        profiles={"chat": DomainProfile(0.70, 0.28, 1.3), **{d: FLAT for d in DOMAINS[1:]}},
    ),
    "chat_above_one": World(
        "chat's E[L] about 1.15, the others' about 0.93",
        profiles={
            "chat": DomainProfile(0.75, 0.30, 1.0),
            **{d: DomainProfile(0.42, 0.20, 1.0) for d in DOMAINS[1:]},
        },
    ),
    "no_acceptance": World(
        "the target never accepts a draft token (tau = 1)",
        profiles=_same(DomainProfile(1e-9, 0.0, 1.0)),
    ),
    # worlds where an effect holds at every sibling rank (the stratified claims are true)
    "entropy_every_rank": World(
        "acceptance falls with entropy at rank 0 and at rank 1",
        entropy_effect=2.0,
        second_entropy_effect=8.0,
        shared_context=True,
    ),
    "entropy_simpson": World(
        "acceptance falls with entropy at rank 0, rises at rank 1 (siblings share the entropy)",
        entropy_effect=2.0,
        shared_context=True,
    ),
    "depth_every_rank": World(
        "acceptance rises with depth at rank 0 and at rank 1",
        depth_effect=0.6,
        second_depth_effect=1.5,
    ),
    "domain_every_rank": World(
        "domains differ at rank 0 and at rank 1",
        profiles={
            "chat": DomainProfile(0.70, 0.60, 1.0),
            "code": DomainProfile(0.60, 0.30, 1.0),
            "math": DomainProfile(0.45, 0.10, 1.0),
            "reasoning": DomainProfile(0.55, 0.20, 1.0),
        },
    ),
    "paradox_every_rank": World(
        "chat has the highest entropy and acceptance at every rank",
        profiles={"chat": DomainProfile(0.70, 0.80, 1.3), **{d: FLAT for d in DOMAINS[1:]}},
    ),
}

# For each claim: the worlds where it is true, and where it is false.
TRUTH: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "task_type_over_depth": (("domain",), ("null", "heterogeneous", "depth")),
    "task_type_over_depth_greedy": (("domain",), ("null", "heterogeneous", "depth")),
    "only_chat_above_one": (("chat_above_one",), ("null", "domain")),
    "rises_with_depth": (("depth",), ("null", "heterogeneous", "domain")),
    "rises_with_depth_top1_chain": (("depth",), ("null", "heterogeneous", "domain")),
    "rises_with_depth_greedy_chain": (("depth",), ("null", "heterogeneous", "domain")),
    "rho_negative": (("entropy",), ("null",)),
    "rho_weak_range": (("entropy",), ("null",)),
    "chat_paradox": (("paradox",), ("null", "domain")),
    "below_one_no_speedup": (("no_acceptance",), ("chat_above_one",)),
}


# The same for each claim checked within every sibling rank (its stratified verdict). Simpson
# worlds: "entropy", "depth" and "paradox" have their effect at rank 0 and the opposite one at
# rank 1, so the claim is false within rank 1 ("entropy_simpson" rather than "entropy", whose
# siblings are drawn with unrelated entropies). below_one_no_speedup is never stratified (tau is a
# per-step figure: the stratified verdict is always "not testable").
STRATIFIED = "sibling_rank"
STRATIFIED_TRUTH: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "task_type_over_depth": (("domain_every_rank",), ("null", "depth_every_rank")),
    "task_type_over_depth_greedy": (("domain_every_rank",), ("null", "depth_every_rank")),
    "only_chat_above_one": ((), ("null",)),
    "rises_with_depth": (("depth_every_rank",), ("null", "depth", "domain_every_rank")),
    "rises_with_depth_top1_chain": (("depth", "depth_every_rank"), ("null",)),
    "rises_with_depth_greedy_chain": (("depth", "depth_every_rank"), ("null",)),
    "rho_negative": (("entropy_every_rank",), ("null", "entropy_simpson")),
    "rho_weak_range": ((), ("null", "entropy_simpson")),
    "chat_paradox": (("paradox_every_rank",), ("null", "paradox")),
}


def synthetic_records(world: World, prompts_per_domain: int, seed: int, steps: int = 32) -> Records:
    """The prepared records of one synthetic run of ``world``."""
    nodes, step_table, prompts = synthetic_tables(
        prompts_per_domain=prompts_per_domain,
        steps=steps,
        seed=seed,
        profiles=world.profiles,
        depth_effect=world.depth_effect,
        entropy_effect=world.entropy_effect,
        prompt_sd=world.prompt_sd,
        second_depth_effect=world.second_depth_effect,
        second_entropy_effect=world.second_entropy_effect,
        shared_context=world.shared_context,
    )
    run = Run(
        Path(f"synthetic-{seed}"),
        {"run_id": "calibration", "status": "complete"},
        nodes.to_pandas(),
        step_table.to_pandas(),
        prompts.to_pandas(),
    )
    return prepare(run)


def simulate(
    world: World,
    prompts_per_domain: int,
    seed: int,
    steps: int = 32,
    settings: Settings | None = None,
    stratify: str | None = None,
) -> Analysis:
    """Analyse one synthetic run of ``world`` (stratified by ``stratify`` if given)."""
    rec = synthetic_records(world, prompts_per_domain, seed, steps)
    return analyze_records(rec, settings or Settings(n_boot=200, seed=seed), stratify)


def verdict_rates(
    prompts_per_domain: int = 10,
    reps: int = 40,
    steps: int = 32,
    worlds: tuple[str, ...] | None = None,
    n_boot: int = 200,
    min_prompts: int | None = None,
    stratified: bool = False,
) -> pd.DataFrame:
    """One row per (claim, world): whether the claim is true there, and the share of each verdict.

    ``stratified``: count the verdicts after stratifying by sibling rank instead (claims named
    "<claim> (by sibling_rank)", truth from :data:`STRATIFIED_TRUTH`).
    """
    truth = STRATIFIED_TRUTH if stratified else TRUTH
    if worlds is None:
        worlds = tuple(dict.fromkeys(w for t, f in truth.values() for w in t + f))
    counts: dict[tuple[str, str], dict[Verdict, int]] = {}
    for name in worlds:
        for r in range(reps):
            settings = Settings(n_boot=n_boot, seed=r)
            if min_prompts is not None:
                settings = Settings(n_boot=n_boot, seed=r, min_prompts=min_prompts)
            rec = synthetic_records(WORLDS[name], prompts_per_domain, 1000 * r + 7, steps)
            if stratified:  # the strata's findings alone: the whole run's analysis is not counted
                found = stratified_analysis(rec, settings, check_stratifier(rec, STRATIFIED))
            else:
                found = analyze_records(rec, settings, None)
            for f in found.findings:
                counts.setdefault((f.key, name), {v: 0 for v in Verdict})[f.verdict] += 1
    rows = []
    for (key, name), c in counts.items():
        true_in, false_in = truth.get(key, ((), ()))
        if name not in true_in + false_in:
            continue
        claim = f"{key} (by {STRATIFIED})" if stratified else key
        rows.append(_rate_row(claim, name, name in true_in, prompts_per_domain, c))
    return pd.DataFrame(rows).sort_values(["claim", "claim is", "world"], ignore_index=True)


def _rate_row(claim: str, world: str, true: bool, prompts_per_domain: int, counts: dict) -> dict:
    """One row of a verdict-rate table: the share of each verdict over the runs counted."""
    total = sum(counts.values())
    return {
        "claim": claim,
        "world": world,
        "claim is": "true" if true else "false",
        "prompts per domain": prompts_per_domain,
        "runs": total,
        **{v.value: counts[v] / total for v in Verdict},
    }


def summary(rates: pd.DataFrame) -> pd.DataFrame:
    """Per claim: the worst false-positive rate over the worlds where it is false, and the power."""
    rows = []
    for key, g in rates.groupby("claim", sort=False):
        false, true = g[g["claim is"] == "false"], g[g["claim is"] == "true"]
        worst = false.loc[false[Verdict.HOLDS.value].idxmax()] if len(false) else None
        rows.append(
            {
                "claim": key,
                "false positives (holds where false)": (
                    f"{worst[Verdict.HOLDS.value]:.3f} ({worst['world']})"
                    if worst is not None
                    else ""
                ),
                "power (holds where true)": ", ".join(
                    f"{r[Verdict.HOLDS.value]:.3f} ({r['world']})" for _, r in true.iterrows()
                ),
                "'does not hold' where true": ", ".join(
                    f"{r[Verdict.FAILS.value]:.3f}" for _, r in true.iterrows()
                ),
            }
        )
    return pd.DataFrame(rows)


def interval_coverage(
    prompts_per_domain: tuple[int, ...] = (2, 3, 5, 10),
    reps: int = 100,
    steps: int = 32,
    n_boot: int = 200,
) -> pd.DataFrame:
    """How often the 95% interval of a domain's mean alpha covers the true mean (null world)."""
    world = WORLDS["null"]
    truth_run = simulate(world, 1500, seed=99, steps=steps, settings=Settings(n_boot=0))
    truth = next(r.mean.value for r in truth_run.paper.table1 if r.domain == ALL)
    rows = []
    for n in prompts_per_domain:
        hits = total = 0
        for r in range(reps):
            a = simulate(
                world, n, seed=500 + r, steps=steps, settings=Settings(n_boot=n_boot, seed=r)
            )
            for row in a.paper.table1:
                if row.domain != ALL and row.mean.has_interval:
                    hits += row.mean.lo <= truth <= row.mean.hi
                    total += 1
        rows.append(
            {
                "prompts per domain": str(n),
                "intervals": str(total),
                "coverage": hits / total if total else np.nan,
            }
        )
    return pd.DataFrame(rows)


# --- a prediction checked on held-out prompts -------------------------------------------------------


def decoding_prompts(n: int, rng: np.random.Generator, depth: int = 4) -> np.ndarray:
    """``n`` synthetic prompts decoded with a chain of ``depth``: per prompt, its positions
    (accepted tokens + 1, summed over steps) and its steps, ``(n, 2)``. Each prompt accepts each
    next chain token with its own probability (:data:`MODEL`'s 0.70, with prompt effects of sd
    0.35 on the log-odds) and decodes 8 to 40 steps: the population of
    :func:`held_out_coverage`."""
    logit = np.log(MODEL.accept / (1 - MODEL.accept)) + rng.normal(0, 0.35, size=n)
    accept = 1 / (1 + np.exp(-logit))
    steps = rng.integers(8, 41, size=n)
    out = np.empty((n, 2))
    for i in range(n):
        runs = rng.random((steps[i], depth)) < accept[i]
        accepted = np.where(runs.all(axis=1), depth, np.argmin(runs, axis=1))
        out[i] = accepted.sum() + steps[i], steps[i]
    return out


def held_out_coverage(
    fitted: int = 30,
    held_out: int = 20,
    trials: int = 400,
    n_boot: int = 400,
    seed: int = 0,
    population: np.ndarray | None = None,
) -> dict[str, float]:
    """How often a held-out figure falls in a prediction's interval, where the prediction's
    prompts and the held-out ones come from one population (so it should, 95% of the time).

    Each trial draws ``fitted`` prompts (the tuning prompts) and ``held_out`` others, gives the
    tokens per step of the first with its 95% interval (the bootstrap of
    :mod:`specscope.analysis.stats`) and checks the second's against that interval (the tuning
    mean's, which bounds the population's figure) and against
    :func:`~specscope.analysis.stats.held_out_interval` (widened for a sample of ``held_out``).
    ``population``: per-prompt (positions, steps) to draw both from without replacement (a
    measured run's prompts); without it, fresh synthetic prompts
    (:func:`decoding_prompts`)."""
    rng = np.random.default_rng(seed)
    boot = ClusterBootstrap.draw(np.zeros(fitted), n_boot, seed)
    inside = {"tuning interval": 0, "held-out interval": 0}
    for _ in range(trials):
        if population is None:
            tune, new = decoding_prompts(fitted, rng), decoding_prompts(held_out, rng)
        else:
            pick = rng.permutation(len(population))
            tune, new = population[pick[:fitted]], population[pick[fitted : fitted + held_out]]
        totals = boot.total(tune)
        e = boot.estimate(ratio(totals[:, 0], totals[:, 1]), prompts=fitted)
        measured = new[:, 0].sum() / new[:, 1].sum()
        lo, hi = held_out_interval(e.value, e.lo, e.hi, fitted, held_out)
        inside["tuning interval"] += e.lo <= measured <= e.hi
        inside["held-out interval"] += lo <= measured <= hi
    return {name: hits / trials for name, hits in inside.items()}


def _synthetic_run(method: str, prompt: str, domain: str, times: tuple, time_s: float):
    """A synthetic bench run: 64 tokens decoded after a first token at 0.5 s, ``times`` the
    seconds of each repeat, ``time_s`` what stands for them (their mean or median)."""
    return BenchRun(
        method, prompt, domain, "", (1,) * 65, 65, time_s, 0.5, times, (0.5,) * len(times)
    )


def speedup_interval_coverage(
    prompts: int = 20,
    repeats: int = 3,
    sd_prompt: float = 0.02,
    sd_repeat: float = 0.013,
    sd_noise: float = 0.01,
    trials: int = 400,
    n_boot: int = 400,
    seed: int = 0,
    speedup: float = 1.1,
) -> dict[str, float]:
    """How often a bench's 95% speed-up intervals hold the true speed-up, on benches of known
    truth where prompts and repeats are crossed.

    Each trial times ``prompts`` prompts x ``repeats`` repeats of plain and one method: plain
    takes T_i (prompt i's length) times exp(u_r + e), the method T_i / (``speedup`` exp(w_i))
    times exp(v_r + e'), with w ~ N(0, ``sd_prompt``) the prompt's own speed-up, u and v ~
    N(0, ``sd_repeat``) what a repeat brings to every prompt it times (freshly started
    servers), e and e' ~ N(0, ``sd_noise``) each request's own. The true speed-up (infinitely
    many prompts and repeats) is ``speedup`` exp(-sd_prompt² / 2). Returns the coverage of the
    bench table's interval (:func:`~specscope.analysis.bench_stats.summarize_bench`) with the repeats
    hidden (prompts resampled alone, as before repeats were resampled) and shown, and of the
    precision table's (:func:`~specscope.analysis.bench_stats.speedup_precision`)."""
    rng = np.random.default_rng(seed)
    truth = speedup * np.exp(-(sd_prompt**2) / 2)
    hits = {"prompts alone": 0, "prompts and repeats": 0, "precision table": 0}
    for _ in range(trials):
        length = rng.uniform(2.0, 6.0, prompts)
        own = speedup * np.exp(rng.normal(0, sd_prompt, prompts))
        u, v = rng.normal(0, sd_repeat, (2, repeats))
        runs = []
        for i in range(prompts):
            for method, base, shift in (("plain", length[i], u), ("chain", length[i] / own[i], v)):
                times = tuple(0.5 + base * np.exp(shift + rng.normal(0, sd_noise, repeats)))
                runs.append(_synthetic_run(method, f"p{i}", "code", times, float(np.mean(times))))
        hidden = [dataclasses.replace(r, repeat_times_s=(), repeat_first_token_s=()) for r in runs]
        boot_seed = int(rng.integers(1 << 30))
        for name, these in (("prompts alone", hidden), ("prompts and repeats", runs)):
            row = next(r for r in summarize_bench(these, n_boot, boot_seed) if r.method == "chain")
            hits[name] += row.speedup_lo <= truth <= row.speedup_hi
        (p,) = speedup_precision(runs, n_boot=n_boot, seed=boot_seed)
        hits["precision table"] += p.lo <= truth <= p.hi
    return {name: n / trials for name, n in hits.items()}


# regret worlds: the chosen candidate's true speed, that of 7 others (true regret
# max(0, 1 - chosen / others)), and whether "the regret is 3% or less" is true there
REGRET_WORLDS = {
    "ahead by 10% (0%)": (1.0, 0.9, True),
    "equal (0%)": (1.0, 1.0, True),
    "at the bound (3%)": (0.97, 1.0, True),
    "just above (4%)": (0.96, 1.0, False),
    "above (6%)": (0.94, 1.0, False),
    "far above (10%)": (0.90, 1.0, False),
}


def synthetic_bench(
    speeds: Mapping[str, float],
    prompts: int,
    repeats: int,
    rng: np.random.Generator,
    sd_prompt: float = 0.06,
    sd_repeat: float = 0.013,
    sd_noise: float = 0.05,
    domain: str = "code",
) -> list:
    """One bench of known truth: each method decodes at its ``speeds``. Each prompt i has
    a length T_i and each candidate there its own speed-up exp(w_ij), w ~ N(0, ``sd_prompt``);
    each candidate's repeat r brings exp(v_jr), v ~ N(0, ``sd_repeat``) (its freshly started
    server, common to its prompts), and each request its own exp(e), e ~ N(0, ``sd_noise``).
    The effects have the same distribution for every candidate, so the true speed of one over
    another is the ratio of their ``speeds``."""
    length = rng.uniform(2.0, 6.0, prompts)
    runs = []
    for method, speed in speeds.items():
        shift = rng.normal(0, sd_repeat, repeats)
        own = speed * np.exp(rng.normal(0, sd_prompt, prompts))
        for i in range(prompts):
            times = tuple(
                0.5 + length[i] / own[i] * np.exp(shift + rng.normal(0, sd_noise, repeats))
            )
            runs.append(
                _synthetic_run(method, f"{domain}{i}", domain, times, float(np.median(times)))
            )
    return runs


def regret_verdict_rates(
    prompts: int = 20,
    repeats: int = 3,
    candidates: int = 8,
    trials: int = 200,
    n_boot: int = 400,
    seed: int = 0,
    **effects: float,
) -> pd.DataFrame:
    """How often a bench's regret verdict (:func:`~specscope.analysis.bench_stats.regrets`: "the chosen
    candidate gives up 3% or less of the best one's speed") says "holds" and "does not hold" in
    the worlds of :data:`REGRET_WORLDS`: where the claim is false, "holds" is a false positive;
    where it is true, "does not hold" is one. ``effects``: :func:`synthetic_bench`'s sds."""
    rng = np.random.default_rng(seed)
    rows = []
    for world, (speed, other, true) in REGRET_WORLDS.items():
        said = Counter()
        for _ in range(trials):
            others = {"plain": other, **{f"other{j}": other for j in range(1, candidates - 1)}}
            runs = synthetic_bench({"chosen": speed, **others}, prompts, repeats, rng, **effects)
            table = summarize_bench(runs, n_boot=0)
            (r,) = regrets(
                table, runs, {"code": "chosen"}, n_boot=n_boot, seed=int(rng.integers(1 << 30))
            )
            said[r.verdict.split(":")[0]] += 1
        rows.append(
            {
                "world": world,
                "claim true": true,
                "prompts": prompts,
                "repeats": repeats,
                "holds": said["holds"] / trials,
                "does not hold": said["does not hold"] / trials,
                "not testable": said["not testable"] / trials,
                "false positives": (said["does not hold"] if true else said["holds"]) / trials,
            }
        )
    return pd.DataFrame(rows)


def speedup_coverage_table(trials: int = 400, n_boot: int = 400, prompts: int = 20) -> pd.DataFrame:
    """:func:`speedup_interval_coverage` at 1, 2, 3 and 5 repeats, without a repeat effect and
    with the 1.3% one measured between llama-server's repeats on this project's CPU."""
    rows = []
    for sd_repeat in (0.0, 0.013):
        for repeats in (1, 2, 3, 5):
            cover = speedup_interval_coverage(
                prompts, repeats, sd_repeat=sd_repeat, trials=trials, n_boot=n_boot, seed=repeats
            )
            rows.append({"repeat effect sd": sd_repeat, "repeats": repeats, **cover})
    return pd.DataFrame(rows)


def none_differed_false_alarms(
    fitted: int = 20,
    new: int = 20,
    share: float = 0.05,
    new_share: float | None = None,
    trials: int = 20_000,
    seed: int = 0,
) -> dict[str, float]:
    """How often a bench calls a prediction of no width wrong (:func:`~specscope.analysis.stats.
    none_differed_p` under 5%), where each prompt decodes otherwise than the common figure with
    chance ``share`` among the tuning prompts and ``new_share`` (default: the same, one
    population) among the held-out ones. "no width": the share of trials in which no tuning
    prompt differed (the others give the prediction an interval of width, checked as any);
    "called outside, of those" and "of all trials": the false-alarm rate where the shares are
    equal (the test is exact over all trials; of those of no width it is higher where such a
    tuning sample is a rare, unrepresentative draw), the power where ``new_share`` is larger."""
    rng = np.random.default_rng(seed)
    new_share = share if new_share is None else new_share
    tune = rng.binomial(fitted, share, trials)
    held = rng.binomial(new, new_share, trials)
    counted = held[tune == 0]
    p = {k: none_differed_p(fitted, new, k) for k in np.unique(counted)}
    outside = sum(p[k] < 0.05 for k in counted)
    return {
        "no width": len(counted) / trials,
        "called outside, of those": outside / max(len(counted), 1),
        "of all trials": outside / trials,
    }


def none_differed_table(trials: int = 20_000) -> pd.DataFrame:
    """:func:`none_differed_false_alarms` at 20 tuning and 20 held-out prompts, over shares of
    differing prompts from rare to common, one population and held-out shares larger by 0.2 and
    0.35 (what ``ngram-mod`` drafting from earlier requests did to 7 of 20)."""
    rows = []
    for share in (0.01, 0.05, 0.1, 0.2):
        for gap in (0.0, 0.2, 0.35):
            rate = none_differed_false_alarms(
                20, 20, share, share + gap, trials, seed=int(share * 100)
            )
            rows.append({"tuning share": share, "held-out share": share + gap, **rate})
    return pd.DataFrame(rows)


# --- the drafter comparison -----------------------------------------------------------------------

MODEL = DrafterProfile(0.70)  # a chain of 4, each node accepted with odds 0.70 at an average prompt
LOOKUP_PROPOSE_SD = 0.3  # sd of a lookup's proposal log-odds across prompts


def _lookup(matches: str) -> DrafterProfile:
    """A prompt-lookup drafter: proposes in 75% of steps (by prompt), a chain of 8 point masses
    whose acceptance is solved to give ``matches``'s expected tau at every prompt."""
    return DrafterProfile(matches=matches, propose=0.75, depth=8, point_mass=True)


@dataclass(frozen=True)
class DrafterWorld:
    """Synthetic drafters measured on the same prompts, of which ``pair`` is compared ("the
    first accepts more than the second"); another only serves as the reference a lookup matches."""

    description: str
    drafters: dict[str, DrafterProfile]
    prompt_sd: float = 0.35
    pair: tuple[str, str] = ("A", "B")


DRAFTER_WORLDS = {
    "equal": DrafterWorld(
        "two drafters alike: chains of 4, acceptance odds 0.70 (tau 2.78 both)",
        {"A": MODEL, "B": MODEL},
    ),
    "equal_heterogeneous": DrafterWorld(
        "the same, prompts very unlike each other (prompt sd 1.0 logits)",
        {"A": MODEL, "B": MODEL},
        prompt_sd=1.0,
    ),
    "equal_lookup": DrafterWorld(
        "a draft model and a lookup that proposes in 75% of steps, with the same expected tau at "
        "every prompt",
        {"A": MODEL, "B": _lookup("A")},
    ),
    "behind": DrafterWorld(
        "A behind B: odds 0.62 vs 0.70 (tau 2.41 vs 2.78)",
        {"A": DrafterProfile(0.62), "B": MODEL},
    ),
    "ahead_small": DrafterWorld(
        "A ahead of B by 0.15 tokens per pass: odds 0.70 vs 0.67 (tau 2.78 vs 2.63)",
        {"A": MODEL, "B": DrafterProfile(0.67)},
    ),
    "ahead": DrafterWorld(
        "A ahead of B by 0.28 tokens per pass: odds 0.70 vs 0.64 (tau 2.78 vs 2.50)",
        {"A": MODEL, "B": DrafterProfile(0.64)},
    ),
    "ahead_of_lookup": DrafterWorld(
        "A ahead by 0.28 of a lookup with the expected tau of odds 0.64 at every prompt",
        {"A": MODEL, "reference": DrafterProfile(0.64), "B": _lookup("reference")},
    ),
}

# "A accepts more than B" per domain and over all domains: worlds where it is true, and false.
_TRUE = ("ahead_small", "ahead", "ahead_of_lookup")
_FALSE = ("equal", "equal_heterogeneous", "equal_lookup", "behind")
DRAFTER_TRUTH = {
    "drafter_accepts_more (per domain)": (_TRUE, _FALSE),
    "drafter_accepts_more (All)": (_TRUE, _FALSE),
}


def true_taus(world: DrafterWorld, draws: int = 200_000, seed: int = 0) -> dict[str, float]:
    """Each drafter's expected tau over the world's population of prompts (Monte Carlo)."""
    rng = np.random.default_rng(seed)
    effect = rng.normal(0, world.prompt_sd, size=draws)
    rates = drafter_rates(world.drafters, effect, rng, LOOKUP_PROPOSE_SD)
    return {
        label: 1 + float(np.mean(propose * chain_expected_length(accept, d.depth)))
        for (label, (propose, accept)), d in zip(rates.items(), world.drafters.values())
    }


def simulate_drafters(
    world: DrafterWorld,
    prompts_per_domain: int,
    seed: int,
    steps: int = 32,
    settings: Settings | None = None,
) -> DrafterComparison:
    """Compare the pair of drafters of one synthetic measurement of ``world``."""
    tables = synthetic_drafter_tables(
        world.drafters,
        prompts_per_domain=prompts_per_domain,
        steps=steps,
        seed=seed,
        prompt_sd=world.prompt_sd,
        propose_sd=LOOKUP_PROPOSE_SD,
        run_id=f"calibration-{seed}",
    )
    runs = [
        Run(
            Path(f"synthetic-{seed}-{i}"),
            {"run_id": f"calibration-{seed}-{i}", "status": "complete"},
            *(t.to_pandas() for t in tables[label]),
        )
        for i, label in enumerate(world.pair)
    ]
    return compare_drafters(runs, settings or Settings(n_boot=200, seed=seed))


def drafter_verdict_rates(
    prompts_per_domain: int = 10,
    reps: int = 40,
    steps: int = 32,
    worlds: tuple[str, ...] | None = None,
    n_boot: int = 200,
    min_prompts: int | None = None,
) -> pd.DataFrame:
    """One row per (claim, world), as :func:`verdict_rates`: the share of each verdict on "A
    accepts more than B" in each domain ("per domain": 4 verdicts per run) and over all domains."""
    worlds = worlds or tuple(DRAFTER_WORLDS)
    rows = []
    for name in worlds:
        counts = {key: {v: 0 for v in Verdict} for key in DRAFTER_TRUTH}
        for r in range(reps):
            settings = Settings(n_boot=n_boot, seed=r)
            if min_prompts is not None:
                settings = Settings(n_boot=n_boot, seed=r, min_prompts=min_prompts)
            c = simulate_drafters(
                DRAFTER_WORLDS[name], prompts_per_domain, 1000 * r + 7, steps, settings
            )
            for v in c.verdicts:
                scope = "All" if v.domain == ALL else "per domain"
                counts[f"drafter_accepts_more ({scope})"][v.verdict] += 1
        for key, c in counts.items():
            true_in, _ = DRAFTER_TRUTH[key]
            rows.append(_rate_row(key, name, name in true_in, prompts_per_domain, c))
    return pd.DataFrame(rows).sort_values(["claim", "claim is", "world"], ignore_index=True)


def _print_drafter_rates(prompts: list[int], reps: int, steps: int) -> None:
    for n in prompts:
        rates = drafter_verdict_rates(n, reps, steps)
        print(
            f"\n## Drafter comparison: {n} prompts per domain, {reps} runs per world, "
            f"{steps} steps\n"
        )
        print(summary(rates).to_markdown(index=False))
        print()
        print(rates.to_markdown(index=False, floatfmt=".3f"))
    print("\n## Drafter comparison below the minimum: verdicts forced at 2 and 5 prompts\n")
    for n in (2, 5):
        forced = drafter_verdict_rates(n, reps, steps, min_prompts=0)
        print(f"\n{n} prompts per domain:\n")
        print(summary(forced).to_markdown(index=False))


# --- the domain difference of an ingested run (specscope.analysis.stepwise) ------------------------


def ingested_verdict_rate(
    means: dict[str, float], prompts: int, reps: int, n_boot: int = 400, seed: int = 0
) -> float:
    """How often the domain-difference finding of an ingested run says "holds" on synthetic
    logs whose domains' mean acceptance is ``means``."""
    rng = np.random.default_rng(seed)
    return float(
        np.mean(
            [
                analyze_ingested(
                    {}, synthetic_requests(rng, means, prompts), n_boot=n_boot, seed=r
                ).finding.verdict
                == "holds"
                for r in range(reps)
            ]
        )
    )


def _print_ingested_rates() -> None:
    for n in (10, 20):
        null = ingested_verdict_rate({d: 0.5 for d in ("a", "b", "c", "d")}, n, 1000, seed=1)
        power = ingested_verdict_rate({"a": 0.4, "b": 0.5, "c": 0.5, "d": 0.6}, n, 300, seed=2)
        print(
            f"{n} prompts per domain: false positives {null:.3f} (nominal 0.05), "
            f"power at acceptance 0.4/0.5/0.5/0.6 {power:.3f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200, help="synthetic runs per world")
    parser.add_argument(
        "--prompts",
        type=int,
        nargs="+",
        default=[10, 50],
        help="prompts per domain (one table each)",
    )
    parser.add_argument("--steps", type=int, default=32, help="generation steps per prompt")
    parser.add_argument(
        "--stratified-only",
        action="store_true",
        help="only the verdicts stratified by sibling rank",
    )
    parser.add_argument(
        "--bench-only",
        action="store_true",
        help="only the coverage of the bench's speed-up intervals (prompts x repeats)",
    )
    parser.add_argument(
        "--drafters-only",
        action="store_true",
        help="only the drafter comparison (drafter A accepts more than B)",
    )
    parser.add_argument(
        "--ingested-only",
        action="store_true",
        help="only an ingested run's domain difference (specscope analyze of engine logs)",
    )
    args = parser.parse_args(argv)
    pd.set_option("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60)
    if args.ingested_only:
        _print_ingested_rates()
        return
    if args.drafters_only:
        _print_drafter_rates(args.prompts, args.reps, args.steps)
        return
    if args.bench_only:
        _print_bench_coverage(args.reps)
        return
    for n in args.prompts:
        for stratified in (True,) if args.stratified_only else (False, True):
            rates = verdict_rates(n, args.reps, args.steps, stratified=stratified)
            what = ", stratified by sibling rank" if stratified else ""
            print(
                f"\n## {n} prompts per domain, {args.reps} runs per world, {args.steps} "
                f"steps{what}\n"
            )
            print(summary(rates).to_markdown(index=False))
            print()
            print(rates.to_markdown(index=False, floatfmt=".3f"))
    if args.stratified_only:
        return
    print("\n## below the minimum: verdicts forced at 2 and 5 prompts per domain\n")
    for n in (2, 5):
        forced = verdict_rates(n, args.reps, args.steps, min_prompts=0)
        print(f"\n{n} prompts per domain:\n")
        print(summary(forced).to_markdown(index=False))
    print("\n## coverage of the 95% interval of a domain's mean alpha (null world)\n")
    print(
        interval_coverage(reps=max(args.reps // 2, 20), steps=args.steps).to_markdown(
            index=False, floatfmt=".3f"
        )
    )
    _print_drafter_rates(args.prompts, args.reps, args.steps)
    _print_bench_coverage(args.reps)


def _print_bench_coverage(reps: int) -> None:
    print("\n## coverage of the bench's 95% speed-up intervals, 20 prompts x repeats\n")
    print(speedup_coverage_table(trials=max(reps, 100)).to_markdown(index=False, floatfmt=".3f"))
    print("\n## the regret verdict (3% or less), 8 candidates, 20 prompts x repeats\n")
    table = pd.concat(
        [regret_verdict_rates(20, r, trials=max(reps, 100), seed=r) for r in (1, 2, 3)]
    )
    print(table.to_markdown(index=False, floatfmt=".3f"))
    print("\n## a prediction of no width called outside, 20 tuning and 20 held-out prompts\n")
    print(none_differed_table().to_markdown(index=False, floatfmt=".3f"))


if __name__ == "__main__":
    main()
