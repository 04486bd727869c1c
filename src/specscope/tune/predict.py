"""One predictor of tokens per step for ``tune``: the recorded trees replayed as greedy decoding
(:mod:`specscope.analysis.replay`) for every candidate the measured tree holds, with a
prompt-resampled interval; the acceptance vector (:meth:`AcceptanceVector.expected_tau`) only for
a tree deeper or wider than measured, and that prediction is labelled extrapolated.

An extrapolation is the vector's expected tau of the whole tree times replay over vector on the
part of the tree the records hold (the vector's tau is a mean over positions, which overstates
decoding; the factor carries the measured overstatement over to the deeper tree, an assumption
that the label names). Without a measured part (no node of the tree recorded) it is the vector's
tau alone.

A stop rule (:class:`Stop`) on a tree the records hold is replayed the same way
(:class:`~specscope.analysis.replay.StopRule`: each recorded tree cut at the first node failing
it), never extrapolated; the replay also gives what its steps cost, the shares of steps by nodes
verified and by draft levels fed (:meth:`.costs.CostModel.stopped_step_time` prices them).

It does not time anything (:mod:`.costs`) or choose (:mod:`.policy`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import BaseModel, Field

from ..analysis.prepare import ALL
from ..analysis.replay import (
    MeasuredTree,
    Replay,
    ReplayCounts,
    ReplayRecords,
    StopRule,
    Subtree,
    estimate,
)
from ..analysis.replay import replay_counts as replay_prompts
from ..analysis.results import Settings
from ..analysis.stats import held_out_interval
from ..records import ALL_DOMAINS
from ..schemas import INPUT, parse
from ..trees import TreeShape
from .acceptance import AcceptanceVector, PolicyError

REPLAY = "replay"
EXTRAPOLATED = "extrapolated (acceptance vector)"
TIMED = "timed on the tuning prompts"  # a backend's own decoding (specscope.tune.engine_choice)
METHODS = (REPLAY, EXTRAPOLATED, TIMED)

# the stop rules tune weighs, per signal the node records hold: a node is drafted while its draft
# probability is at least the threshold, or the entropy (nats) of the draft distribution it is
# drawn from at most it
STOP_GRID = {
    "p_draft": (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8),
    "draft_entropy": (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0),
}


@dataclass(frozen=True)
class Stop:
    """A policy entry's per-node stop rule: a node whose ``signal`` fails ``threshold`` is not
    drafted, nor are its descendants (``p_draft``: below it, llama.cpp's ``p_min``;
    ``draft_entropy``: above it). Both are the draft's own, known before the target runs."""

    __pydantic_config__ = INPUT  # a policy entry's "stop" (specscope.schemas)
    signal: str
    threshold: float

    def __post_init__(self) -> None:
        if self.signal not in STOP_GRID:
            raise PolicyError(
                f"stop signal {self.signal!r} is unknown; known: {', '.join(STOP_GRID)}"
            )
        probability = self.signal == "p_draft"
        if not (0 < self.threshold <= 1 if probability else 0 <= self.threshold < math.inf):
            allowed = "a probability in (0, 1]" if probability else "an entropy >= 0 (nats)"
            raise PolicyError(f"stop threshold of {self.signal} is {allowed}, got {self.threshold}")

    @property
    def decode_args(self) -> dict[str, float]:
        """The rule as the decoder's ``generate`` and the replay's ``StopRule`` take it."""
        return {("p_min" if self.signal == "p_draft" else "h_max"): self.threshold}

    @property
    def label(self) -> str:
        return f"{self.signal} {'>=' if self.signal == 'p_draft' else '<='} {self.threshold:g}"


@dataclass(frozen=True)
class Prediction:
    """Predicted tokens per decoding step of one tree in one domain, and how it was obtained."""

    tokens_per_step: float
    lo: float = math.nan  # the interval (prompts resampled within domains); NaN: none
    hi: float = math.nan
    method: str = REPLAY
    proposal_rate: float = 1.0  # share of decoding steps in which the drafter proposes
    # the same after each prompt's first step (what a decode speed after the first token is made
    # of; NaN: not known, the whole output's stand in)
    decode_tokens_per_step: float = math.nan
    decode_proposal_rate: float = math.nan
    prompts: int = 0  # the prompts the interval resampled (0: not recorded)
    # after the first step, the shares of steps by nodes verified and by draft levels fed (a
    # replay's; empty: not known): what a stop rule's steps cost
    verified: tuple[float, ...] = ()
    fed: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise PolicyError(
                f"prediction method {self.method!r} is unknown; known: {', '.join(METHODS)}"
            )

    @property
    def extrapolated(self) -> bool:
        return self.method == EXTRAPOLATED

    def held_out(self, prompts: int, fitted: int = 0) -> tuple[float, float] | None:
        """The interval a mean over ``prompts`` held-out prompts falls in
        (:func:`~specscope.analysis.stats.held_out_interval`), from the prompts behind this
        prediction (``fitted`` where it does not record them); None without an interval or a
        prompt count."""
        fitted = self.prompts or fitted
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)) or fitted < 1 or prompts < 1:
            return None
        return held_out_interval(self.tokens_per_step, self.lo, self.hi, fitted, prompts)

    def speed_terms(self) -> tuple[float, float]:
        """Tokens per step and proposal rate after the first token, which a predicted decode
        speed-up is made of (the whole output's where those are not known)."""
        share = self.decode_proposal_rate
        if not math.isfinite(self.decode_tokens_per_step):
            return self.tokens_per_step, self.proposal_rate
        return self.decode_tokens_per_step, share if math.isfinite(share) else self.proposal_rate

    def to_dict(self) -> dict:
        interval = None
        if math.isfinite(self.lo) and math.isfinite(self.hi):
            interval = [round(self.lo, 4), round(self.hi, 4)]
        return {
            "tokens_per_step": round(self.tokens_per_step, 4),
            "interval": interval,
            "method": self.method,
            **({"prompts": self.prompts} if self.prompts else {}),
        }

    @classmethod
    def from_dict(cls, data, where: str) -> Prediction:
        """A domain entry's ``prediction`` table (:class:`PredictionRecord`), checked."""
        read = parse(PredictionRecord, data, where, PolicyError, "prediction")
        lo, hi = read.interval if read.interval is not None else (math.nan, math.nan)
        try:
            return cls(read.tokens_per_step, lo, hi, read.method, prompts=read.prompts)
        except PolicyError as e:
            raise PolicyError(f"{where}: {e}") from None


class PredictionRecord(BaseModel):
    """A prediction as a policy file holds it (:meth:`Prediction.to_dict`): its schema."""

    model_config = INPUT
    tokens_per_step: Annotated[float, Field(ge=1, allow_inf_nan=False)]
    interval: tuple[float, float] | None = None  # [lo, hi]; null: none
    method: str
    prompts: Annotated[int, Field(ge=0)] = 0
    decode_tokens_per_step: float = math.nan  # files written before: read, not used


class Predictor:
    """Tokens per step of candidate trees for one drafter's measurement run, per domain
    (``ALL_DOMAINS`` pooled). Replays are computed once per tree and shared by every domain.
    ``prefill_drafts``: the replay's convention (:mod:`specscope.analysis.replay`); False counts
    steps as specscope's decoder does (a plain prefill pass, trees from the second token on)."""

    def __init__(
        self,
        records: ReplayRecords,
        vectors: dict[str, AcceptanceVector],
        settings: Settings | None = None,
        prefill_drafts: bool = True,
    ):
        self.records = records
        self.vectors = vectors
        self.settings = settings or Settings()
        self.prefill_drafts = prefill_drafts
        self._counts: dict[tuple, ReplayCounts] = {}
        self._figures: dict[tuple, Replay] = {}  # tree paths -> the replay's estimate
        self._measured = replay_prompts(records, MeasuredTree(), prefill_drafts)

    def counts(self, shape: TreeShape, stop: Stop | None = None) -> ReplayCounts:
        key = (shape.paths, stop)
        if key not in self._counts:
            rule = Subtree(shape) if stop is None else StopRule(Subtree(shape), **stop.decode_args)
            self._counts[key] = replay_prompts(self.records, rule, self.prefill_drafts)
        return self._counts[key]

    def stops(self, shape: TreeShape) -> list[Stop]:
        """The stop rules of :data:`STOP_GRID`, on the signals the node records hold, that cut
        ``shape`` somewhere decoding goes (none for a tree the records do not hold)."""
        signals = self.records.signals
        if not self.records.has_nodes or not self.records.holds(shape):
            return []
        whole = self.counts(shape).drafted.sum()
        grid = [Stop(k, t) for k in STOP_GRID if k in signals for t in STOP_GRID[k]]
        grid = [s for s in grid if not np.isnan(signals[s.signal]).any()]
        return [s for s in grid if self.counts(shape, s).drafted.sum() < whole]

    def predict(self, shape: TreeShape, domain: str, stop: Stop | None = None) -> Prediction:
        """The point prediction (no interval): replayed where the records hold ``shape``."""
        name = ALL if domain == ALL_DOMAINS else domain
        if not self.records.holds(shape):
            share = self._measured.ratios(self.records, "proposals", "steps")[name]
            tau = self.vectors[domain].expected_tau(shape) * self._scale(shape, domain)
            return Prediction(tau, method=EXTRAPOLATED, proposal_rate=share)
        counts = self.counts(shape, stop)
        tau = counts.ratios(self.records, "positions", "steps")[name]
        share = counts.ratios(self.records, "proposals", "steps")[name]
        later = counts.after_first()
        return Prediction(
            tau,
            proposal_rate=share,
            decode_tokens_per_step=later.ratios(self.records, "positions", "steps")[name],
            decode_proposal_rate=later.ratios(self.records, "proposals", "steps")[name],
            verified=tuple(later.drafted_mix(self.records)[name]),
            fed=tuple(later.drafted_mix(self.records, fed=True)[name]),
        )

    def _scale(self, shape: TreeShape, domain: str) -> float:
        """Replayed over the vector's tokens per step of the part of ``shape`` the records hold
        (1 when they hold none of it)."""
        if self.records.has_nodes:
            known = set(self.records.paths)
            inside = [p for p in shape.paths if p in known]  # parent-closed: so is shape
        else:
            inside = [p for p in shape.paths if not any(p)][: self.records.spine_depth]
        if not inside:
            return 1.0
        part = TreeShape.from_paths(inside)
        vector = self.vectors[domain].expected_tau(part)
        return self.predict(part, domain).tokens_per_step / vector if vector > 0 else 1.0

    def with_interval(self, shape: TreeShape, domain: str, stop: Stop | None = None) -> Prediction:
        """:meth:`predict` with the replay's interval (an extrapolation has none)."""
        point = self.predict(shape, domain, stop)
        if point.extrapolated:
            return point
        key = (shape.paths, stop)
        if key not in self._figures:  # one bootstrap per tree gives every domain's interval
            self._figures[key] = estimate(self.records, self.counts(shape, stop), self.settings)[0]
        row = self._figures[key].row(ALL if domain == ALL_DOMAINS else domain)
        tokens = row.tokens_per_step
        return dataclasses.replace(
            point, tokens_per_step=tokens.value, lo=tokens.lo, hi=tokens.hi, prompts=row.prompts
        )
