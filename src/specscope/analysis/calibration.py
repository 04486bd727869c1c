"""Calibration of the findings' verdicts on synthetic runs whose truth is known.

A verdict is only worth its error rates. This module draws many synthetic runs (the paper's tree,
prompt-level random effects; :mod:`.synthetic`) from worlds where each claim of the paper is known
to be true or false, analyses each run exactly as ``specscope analyze`` does, and counts the
verdicts: the share of "holds" where the claim is false is the false-positive rate, where it is
true the power. It also measures how often the 95% interval of a domain's mean alpha covers the
true mean at small numbers of prompts per domain.

The stratified verdicts (each claim checked within every sibling rank, ``analyze --stratify``) are
calibrated the same way on worlds where the claim holds at every rank, and on Simpson's-paradox
worlds where it holds pooled (or at rank 0) but runs the other way at rank 1
(:data:`STRATIFIED_TRUTH`).

``tests/test_calibration.py`` runs a small version in CI; the full table of the README comes from
``python -m specscope.analysis.calibration``. Nothing here reads a model.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..records import Run
from .findings import Verdict
from .prepare import ALL, prepare
from .results import Analysis, Settings
from .synthetic import DomainProfile, synthetic_tables
from .tables import analyze_records

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


def simulate(
    world: World,
    prompts_per_domain: int,
    seed: int,
    steps: int = 32,
    settings: Settings | None = None,
    stratify: str | None = None,
) -> Analysis:
    """Analyse one synthetic run of ``world`` (stratified by ``stratify`` if given)."""
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
    return analyze_records(prepare(run), settings or Settings(n_boot=200, seed=seed), stratify)


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
            a = simulate(
                WORLDS[name],
                prompts_per_domain,
                seed=1000 * r + 7,
                steps=steps,
                settings=settings,
                stratify=STRATIFIED if stratified else None,
            )
            found = (
                a.stratification.findings
                if stratified and a.stratification is not None
                else ()
                if stratified
                else a.findings
            )
            for f in found:
                counts.setdefault((f.key, name), {v: 0 for v in Verdict})[f.verdict] += 1
    rows = []
    for (key, name), c in counts.items():
        true_in, false_in = truth.get(key, ((), ()))
        if name not in true_in + false_in:
            continue
        total = sum(c.values())
        claim = f"{key} (by {STRATIFIED})" if stratified else key
        rows.append(
            {
                "claim": claim,
                "world": name,
                "claim is": "true" if name in true_in else "false",
                "prompts per domain": prompts_per_domain,
                "runs": total,
                **{v.value: c[v] / total for v in Verdict},
            }
        )
    return pd.DataFrame(rows).sort_values(["claim", "claim is", "world"], ignore_index=True)


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
    args = parser.parse_args(argv)
    pd.set_option("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60)
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


if __name__ == "__main__":
    main()
