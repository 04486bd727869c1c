"""Choosing among settings a backend timed on the tuning prompts: the chooser for an engine whose
step time specscope does not model pass by pass (llama-server: its two models share the cores,
and its model-free lookups are C++ specscope does not run).

Every candidate (plain among them) ran on the same tuning prompts through the backend
(:func:`specscope.serving.llamacpp.backend.time_candidates` for llama-server), as bench rows; its
prediction for held-out prompts of a domain is what it did on the tuning prompts of that domain:
the decode speed-up over plain with the bench's interval (prompts resampled within domains), and
the tokens per step it decoded. Where the measurement run's records hold the candidate (a chain
of K of the draft model, with a ``p_min`` stop rule), the replayed tokens per step stand beside it
(:class:`TimedCell.replay`), on the same prompts. Per domain the candidate of highest predicted
speed-up above ``min_speedup`` is chosen (else plain), and the uniform one from all the tuning
traffic together.

It does not run anything (the backends do) or write policy files (the backend's command does).
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


@dataclass(frozen=True)
class TimedCell:
    """One candidate in one domain (or ``ALL_DOMAINS``), as timed on the tuning prompts."""

    candidate: str
    domain: str
    prompts: int
    speedup: float  # decode speed-up over plain, same prompts
    lo: float  # its 95% interval (prompts resampled within domains)
    hi: float
    tokens_per_step: Prediction  # as decoded by the backend (the prefill's token one step)
    decode_tokens_per_s: float
    exact: bool  # every output equal to plain's
    replay: Prediction | None = None  # tokens per step replayed from the run's records

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
        }


@dataclass(frozen=True)
class TimedChoice:
    """Each domain's candidate, the uniform one, and every cell they were chosen from."""

    per_domain: dict[str, str]
    uniform: str
    cells: tuple[TimedCell, ...] = field(default=())

    def cell(self, candidate: str, domain: str) -> TimedCell:
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
) -> tuple[TimedCell, ...]:
    """Every candidate's cell per domain and pooled, from bench rows on the tuning prompts;
    ``replays``: (candidate, domain) -> the replayed tokens per step, where the records hold it."""
    replays = replays or {}
    tps = tokens_per_step(runs, n_boot, seed)
    return tuple(
        TimedCell(
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


def choose_timed(cells: Sequence[TimedCell], min_speedup: float = 1.0) -> TimedChoice:
    """Per domain, and over all domains for the uniform entry, the candidate of highest
    speed-up on the tuning prompts if that exceeds ``min_speedup``, else plain."""

    def best(domain: str) -> str:
        mine = [c for c in cells if c.domain == domain and c.candidate != PLAIN]
        top = max(mine, key=lambda c: c.speedup, default=None)
        return top.candidate if top is not None and top.speedup > min_speedup else PLAIN

    domains = list(dict.fromkeys(c.domain for c in cells if c.domain != ALL_DOMAINS))
    return TimedChoice({d: best(d) for d in domains}, best(ALL_DOMAINS), tuple(cells))
