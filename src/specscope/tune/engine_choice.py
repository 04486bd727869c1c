"""One chooser for the settings of an engine that runs its own decoding (llama-server): per
domain, and over all the traffic for the uniform entry, the candidate of highest predicted decode
speed-up over plain (if that exceeds ``min_speedup``, else plain).

A candidate's cell is predicted one of two ways, and says which (:attr:`Cell.how`):

- **priced** (:data:`PRICED`): tokens per step replayed from the measurement run's records (a
  chain of K of the draft model, with a ``p_min`` stop rule), over a step time that the engine's
  step model prices (:class:`specscope.serving.llamacpp.costs.ServerStepModel`); such a setting
  need not have run at all;
- **timed** (:data:`~specscope.tune.predict.TIMED`): what the candidate did through the engine on
  the tuning prompts (:func:`specscope.serving.llamacpp.backend.time_candidates`, as bench
  rows): the decode speed-up over plain with the bench's interval (prompts resampled within
  domains) and the tokens per step it decoded; the engine's model-free lookups, which are C++
  that specscope does not replay.

A priced candidate that was also timed keeps that timing beside its prediction
(:attr:`Cell.timed_speedup`: an in-sample check, never what chooses).

A domain leaves the uniform choice for its own best candidate only where that candidate is
faster than the uniform one in the domain with 95% confidence (:class:`RouteTest`): both timed
on the tuning prompts, their decode speeds are compared paired by prompt (prompts resampled); a
priced one is set against the other by their intervals, without pairing. An engine serves each
setting from its own server (llama-server takes no speculation setting per request), so a route
must pay for a server: a lead inside the noise of a few tuning prompts does not. specscope's own
decoder switches trees per request at no cost, and ``tune`` routes on the point estimate.

It does not run anything (the engines do) or write policy files (the engine's command does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..analysis.bench_stats import BenchRun, rows_against, summarize_bench
from ..analysis.stats import ClusterBootstrap, ratio
from ..records import ALL_DOMAINS
from .predict import TIMED, Prediction

PLAIN = "plain"
PRICED = "replayed tokens per step over the engine's step model"


def _rounded(x: float) -> float | None:
    """A figure as a policy file holds it: 4 decimals, or null where it is not finite."""
    return round(x, 4) if math.isfinite(x) else None


@dataclass(frozen=True)
class Cell:
    """One candidate in one domain (or ``ALL_DOMAINS``): its predicted speed-up, and how."""

    candidate: str
    domain: str
    prompts: int
    speedup: float  # decode speed-up over plain
    lo: float  # its 95% interval (prompts resampled within domains)
    hi: float
    tokens_per_step: Prediction  # as the engine counts them (the prefill's token one step)
    decode_tokens_per_s: float  # timed: on the tuning prompts; priced: nan
    exact: bool | None  # every output equal to plain's (None: not run)
    replay: Prediction | None = None  # timed: the tokens per step the run's records replay to
    how: str = TIMED  # TIMED or PRICED
    timed_speedup: float = math.nan  # priced: the speed-up timed on the tuning prompts, if run
    step_s: float = math.nan  # priced: the step model's seconds per decoding step

    def to_dict(self) -> dict:
        r = _rounded
        return {
            "candidate": self.candidate,
            "domain": self.domain,
            "prompts": self.prompts,
            "predicted_speedup": r(self.speedup),
            "interval": [r(self.lo), r(self.hi)],
            "tokens_per_step": self.tokens_per_step.to_dict(),
            "decode_tokens_per_s": r(self.decode_tokens_per_s),
            "exact": self.exact,
            **({"replay": self.replay.to_dict()} if self.replay else {}),
            "how": self.how,
            **({"timed_speedup": r(self.timed_speedup)} if self.how == PRICED else {}),
        }


@dataclass(frozen=True)
class RouteTest:
    """A domain's best candidate against the uniform choice in that domain: decode speed over
    the uniform's, with a 95% interval; the route is taken only where the interval is above 1.
    Too few prompts for an interval (one per domain): not testable, and the point estimate
    decides, as it would without the test."""

    domain: str
    best: str
    uniform: str
    ratio: float
    lo: float
    hi: float
    paired: bool  # paired by prompt; else from the two candidates' own intervals

    @property
    def testable(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def pays(self) -> bool:
        return self.lo > 1 if self.testable else self.ratio > 1

    @property
    def sentence(self) -> str:
        how = "paired by prompt" if self.paired else "from the two intervals"
        if not self.testable:
            interval, why = "", " (not testable: too few prompts; the point estimate decides)"
        else:
            interval = f" [{self.lo:.3f}, {self.hi:.3f}]"
            why = "" if self.pays else " (the lead is inside the interval)"
        verdict = f"routed to {self.best}" if self.pays else f"kept {self.uniform}"
        return (
            f"{self.domain}: {self.best} against {self.uniform} {self.ratio:.3f}x{interval} "
            f"({how}): {verdict}{why}"
        )

    def to_dict(self) -> dict:
        r = _rounded
        return {
            "domain": self.domain,
            "best": self.best,
            "uniform": self.uniform,
            "ratio": r(self.ratio),
            "interval": [r(self.lo), r(self.hi)],
            "paired": self.paired,
            "testable": self.testable,
            "routed": self.pays,
        }


@dataclass(frozen=True)
class EngineChoice:
    """Each domain's candidate, the uniform one, every cell they were chosen from, and the test
    behind each domain whose best candidate is not the uniform one."""

    per_domain: dict[str, str]
    uniform: str
    cells: tuple[Cell, ...] = field(default=())
    route_tests: tuple[RouteTest, ...] = field(default=())

    def cell(self, candidate: str, domain: str) -> Cell:
        for c in self.cells:
            if (c.candidate, c.domain) == (candidate, domain):
                return c
        raise KeyError((candidate, domain))


def tokens_per_step(
    runs: Sequence[BenchRun], n_boot: int = 2000, seed: int = 0
) -> dict[tuple[str, str], Prediction]:
    """(method, domain or ``ALL_DOMAINS``) -> output tokens over decoding steps, with a 95%
    interval (prompts resampled within domains)."""
    prompts = list(dict.fromkeys(r.prompt_id for r in runs))
    column = {p: i for i, p in enumerate(prompts)}
    domain_of = {r.prompt_id: r.domain for r in runs}
    strata = np.array([domain_of[p] for p in prompts])
    boot = ClusterBootstrap.draw(strata, n_boot, seed)
    out = {}
    for method in dict.fromkeys(r.method for r in runs):
        sums = np.zeros((len(prompts), 2))
        for r in runs:
            if r.method == method and r.steps:
                sums[column[r.prompt_id]] += (len(r.tokens), r.steps)
        for domain in [*dict.fromkeys(strata), ALL_DOMAINS]:
            keep = np.flatnonzero((strata == domain) | (domain == ALL_DOMAINS))
            totals = boot.subset(keep).total(sums[keep])
            reps = ratio(totals[:, 0], totals[:, 1])
            e = boot.subset(keep).estimate(reps, prompts=len(keep), strata=len(set(strata[keep])))
            if math.isfinite(e.value):
                out[(method, str(domain))] = Prediction(
                    e.value, e.lo, e.hi, TIMED, prompts=len(keep)
                )
    return out


def timed_cells(
    runs: Sequence[BenchRun],
    replays: Mapping[tuple[str, str], Prediction] | None = None,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[Cell, ...]:
    """Every candidate's cell per domain and pooled, from bench rows on the tuning prompts;
    ``replays``: (candidate, domain) -> the replayed tokens per step, where the records hold it."""
    replays = replays or {}
    tps = tokens_per_step(runs, n_boot, seed)
    return tuple(
        Cell(
            r.method,
            r.domain,
            r.prompts,
            r.speedup,
            1.0 if r.method == PLAIN else r.speedup_lo,
            1.0 if r.method == PLAIN else r.speedup_hi,
            tps.get((r.method, r.domain), Prediction(1.0, method=TIMED)),
            r.decode_tokens_per_s,
            r.exact,
            replays.get((r.method, r.domain)),
        )
        for r in summarize_bench(runs, n_boot, seed)
    )


def route_test(
    best: Cell,
    uniform: Cell,
    runs: Sequence[BenchRun] = (),
    n_boot: int = 2000,
    seed: int = 0,
) -> RouteTest:
    """``best`` against ``uniform`` in ``best``'s domain (module docstring): paired by prompt
    where ``runs`` time both there (``uniform`` plain: ``best``'s own interval, which is paired
    with plain), else the ratio of the point predictions within the ratio of the intervals' far
    ends."""
    domain = best.domain
    if uniform.candidate == PLAIN or best.candidate == PLAIN:
        mine = best if uniform.candidate == PLAIN else uniform
        ratio_, lo, hi = mine.speedup, mine.lo, mine.hi
        if best.candidate == PLAIN:
            ratio_, lo, hi = 1 / ratio_, 1 / hi, 1 / lo
        return RouteTest(
            domain, best.candidate, uniform.candidate, ratio_, lo, hi, best.how == TIMED
        )
    both = best.how == uniform.how == TIMED
    in_domain = [r for r in runs if r.domain == domain]
    if both and {best.candidate, uniform.candidate} <= {r.method for r in in_domain}:
        row = rows_against(in_domain, best.candidate, uniform.candidate, n_boot, seed)[domain]
        return RouteTest(
            domain, best.candidate, uniform.candidate, row.speedup, row.speedup_lo,
            row.speedup_hi, True,
        )  # fmt: skip
    return RouteTest(
        domain,
        best.candidate,
        uniform.candidate,
        best.speedup / uniform.speedup,
        best.lo / uniform.hi,
        best.hi / uniform.lo,
        False,
    )


def choose(
    cells: Sequence[Cell],
    min_speedup: float = 1.0,
    runs: Sequence[BenchRun] = (),
    n_boot: int = 2000,
    seed: int = 0,
) -> EngineChoice:
    """Over all domains, the uniform entry: the candidate of highest predicted speed-up if that
    exceeds ``min_speedup``, else plain; per domain, the same, kept only where it beats the
    uniform one in that domain (:func:`route_test`, ``runs``: the timed candidates' runs on the
    tuning prompts), else the uniform one."""

    def best(domain: str) -> str:
        mine = [c for c in cells if c.domain == domain and c.candidate != PLAIN]
        top = max(mine, key=lambda c: c.speedup, default=None)
        return top.candidate if top is not None and top.speedup > min_speedup else PLAIN

    def cell(candidate: str, domain: str) -> Cell:
        return next(c for c in cells if (c.candidate, c.domain) == (candidate, domain))

    uniform = best(ALL_DOMAINS)
    domains = list(dict.fromkeys(c.domain for c in cells if c.domain != ALL_DOMAINS))
    per_domain, tests = {}, []
    for d in domains:
        top = best(d)
        per_domain[d] = top
        if top != uniform:
            test = route_test(cell(top, d), cell(uniform, d), runs, n_boot, seed)
            tests.append(test)
            per_domain[d] = top if test.pays else uniform
    return EngineChoice(per_domain, uniform, tuple(cells), tuple(tests))
