"""One predictor of tokens per step for ``tune``: the recorded trees replayed as greedy decoding
(:mod:`specscope.analysis.replay`) for every candidate the measured tree holds, with a
prompt-resampled interval; the acceptance vector (:meth:`AcceptanceVector.expected_tau`) only for
a tree deeper or wider than measured, and that prediction is labelled extrapolated.

An extrapolation is the vector's expected tau of the whole tree times replay over vector on the
part of the tree the records hold (the vector's tau is a mean over positions, which overstates
decoding; the factor carries the measured overstatement over to the deeper tree, an assumption
that the label names). Without a measured part (no node of the tree recorded) it is the vector's
tau alone.

It does not time anything (:mod:`.costs`) or choose (:mod:`.policy`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, Field

from ..analysis.prepare import ALL
from ..analysis.replay import (
    MeasuredTree,
    Replay,
    ReplayCounts,
    ReplayRecords,
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
            **(
                {"decode_tokens_per_step": round(self.decode_tokens_per_step, 4)}
                if math.isfinite(self.decode_tokens_per_step)
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, data, where: str) -> Prediction:
        """A domain entry's ``prediction`` table (:class:`PredictionRecord`), checked."""
        read = parse(PredictionRecord, data, where, PolicyError, "prediction")
        lo, hi = read.interval if read.interval is not None else (math.nan, math.nan)
        try:
            return cls(
                read.tokens_per_step,
                lo,
                hi,
                read.method,
                decode_tokens_per_step=read.decode_tokens_per_step,
                prompts=read.prompts,
            )
        except PolicyError as e:
            raise PolicyError(f"{where}: {e}") from None


class PredictionRecord(BaseModel):
    """A prediction as a policy file holds it (:meth:`Prediction.to_dict`): its schema."""

    model_config = INPUT
    tokens_per_step: Annotated[float, Field(ge=1, allow_inf_nan=False)]
    interval: tuple[float, float] | None = None  # [lo, hi]; null: none
    method: str
    prompts: Annotated[int, Field(ge=0)] = 0
    decode_tokens_per_step: float = math.nan


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

    def counts(self, shape: TreeShape) -> ReplayCounts:
        key = shape.paths
        if key not in self._counts:
            self._counts[key] = replay_prompts(self.records, Subtree(shape), self.prefill_drafts)
        return self._counts[key]

    def predict(self, shape: TreeShape, domain: str) -> Prediction:
        """The point prediction (no interval): replayed where the records hold ``shape``."""
        name = ALL if domain == ALL_DOMAINS else domain
        if not self.records.holds(shape):
            share = self._measured.ratios(self.records, "proposals", "steps")[name]
            tau = self.vectors[domain].expected_tau(shape) * self._scale(shape, domain)
            return Prediction(tau, method=EXTRAPOLATED, proposal_rate=share)
        counts = self.counts(shape)
        tau = counts.ratios(self.records, "positions", "steps")[name]
        share = counts.ratios(self.records, "proposals", "steps")[name]
        later = counts.after_first()
        return Prediction(
            tau,
            proposal_rate=share,
            decode_tokens_per_step=later.ratios(self.records, "positions", "steps")[name],
            decode_proposal_rate=later.ratios(self.records, "proposals", "steps")[name],
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

    def with_interval(self, shape: TreeShape, domain: str) -> Prediction:
        """:meth:`predict` with the replay's interval (an extrapolation has none)."""
        point = self.predict(shape, domain)
        if point.extrapolated:
            return point
        key = shape.paths
        if key not in self._figures:  # one bootstrap per tree gives every domain's interval
            self._figures[key] = estimate(self.records, self.counts(shape), self.settings)[0]
        row = self._figures[key].row(ALL if domain == ALL_DOMAINS else domain)
        tokens = row.tokens_per_step
        return dataclasses.replace(
            point, tokens_per_step=tokens.value, lo=tokens.lo, hi=tokens.hi, prompts=row.prompts
        )
