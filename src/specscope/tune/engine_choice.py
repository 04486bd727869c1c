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

It does not run anything (the engines do) or write policy files (the engine's command does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..analysis.stats import ClusterBootstrap, ratio
from ..records import ALL_DOMAINS
from .bench import BenchRun, summarize_bench
from .predict import TIMED, Prediction

PLAIN = "plain"
PRICED = "replayed tokens per step over the engine's step model"


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
        def r(x: float) -> float | None:
            return round(x, 4) if math.isfinite(x) else None

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
class EngineChoice:
    """Each domain's candidate, the uniform one, and every cell they were chosen from."""

    per_domain: dict[str, str]
    uniform: str
    cells: tuple[Cell, ...] = field(default=())

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
                out[(method, str(domain))] = Prediction(e.value, e.lo, e.hi, TIMED)
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


def choose(cells: Sequence[Cell], min_speedup: float = 1.0) -> EngineChoice:
    """Per domain, and over all domains for the uniform entry, the candidate of highest
    predicted speed-up if that exceeds ``min_speedup``, else plain."""

    def best(domain: str) -> str:
        mine = [c for c in cells if c.domain == domain and c.candidate != PLAIN]
        top = max(mine, key=lambda c: c.speedup, default=None)
        return top.candidate if top is not None and top.speedup > min_speedup else PLAIN

    domains = list(dict.fromkeys(c.domain for c in cells if c.domain != ALL_DOMAINS))
    return EngineChoice({d: best(d) for d in domains}, best(ALL_DOMAINS), tuple(cells))
