"""The routed method's prediction: what a domain's prompts decode when a router sends each to the
entry of the domain it picks.

A bench's ``routed`` method routes every prompt with the rule router, and a prompt sent to
another domain decodes with that domain's drafter, tree and backend. A domain's own entry
predicts only the prompts that stay. :func:`routed_predictions` routes the tuning prompts the same
way and replays each with the entry it is sent to (:class:`~.predict.Predictor`'s counts, per
prompt), so that the routed cell is predicted as it runs, with the router's mistakes in it:

- tokens per step of a domain's prompts as routed, with an interval that resamples them;
- the predicted speed-up: their tokens after the first over their time, each prompt's steps
  priced by the cost model of the entry it is sent to (a step's cost is linear in whether the
  drafter proposed, so a prompt's time is its steps at its own proposal rate);
- how many of the domain's prompts went where (``sent``).

Written by ``tune`` to the policy file's ``routed`` table; ``bench`` sets its routed cells against
it. It does not choose anything (:mod:`.policy`) or time anything (:mod:`.costs`).
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..analysis.replay import ReplayCounts, ReplayRecords
from ..analysis.results import Settings
from ..analysis.stats import ClusterBootstrap, ratio
from ..records import ALL_DOMAINS
from ..trees import TreeShape
from .costs import CostModel
from .predict import REPLAY, Prediction, Predictor, Stop
from .router import RuleRouter, prompt_text

ROUTER = "rules"  # the router a routed prediction assumes: the bench's default


@dataclass(frozen=True)
class Destination:
    """A domain's chosen entry as a prompt routed to it decodes: its tree (None: plain), the
    predictor whose records and step count chose it, its backend, cost model and stop rule."""

    shape: TreeShape | None
    predictor: Predictor
    costs: CostModel
    backend: str = "specscope"
    stop: Stop | None = None

    @functools.cached_property
    def counts(self) -> tuple[ReplayCounts, ReplayCounts]:
        """Every prompt's replay counts under this entry, whole and after the first step."""
        counts = self.predictor.counts(self.shape, self.stop)
        return counts, counts.after_first()


@dataclass(frozen=True)
class RoutedPrediction:
    """One domain's prompts as routed: where they went, tokens per step and speed-up."""

    sent: dict[str, int]  # destination domain -> prompts of this domain sent there
    prediction: Prediction
    speedup: float

    def to_dict(self) -> dict:
        return {
            "sent": dict(self.sent),
            "prediction": self.prediction.to_dict(),
            "predicted_speedup": round(self.speedup, 4),
        }


def prompt_texts(prompts: pd.DataFrame) -> dict[str, str]:
    """Prompt id -> the text a router reads (:func:`~.router.prompt_text`: the user turns), from
    a run's prompts table; empty if it holds no messages."""
    if prompts is None or "messages_json" not in prompts:
        return {}
    return {
        str(row.prompt_id): prompt_text(json.loads(row.messages_json))
        for row in prompts[["prompt_id", "messages_json"]].itertuples()
    }


def _prompt_figures(
    dest: Destination, index: int, length: int
) -> tuple[float, float, float, float]:
    """One prompt under ``dest``: output tokens, decoding steps, tokens after the first step,
    and their time in plain tokens (what plain decoding of one token costs)."""
    if dest.shape is None:
        return length, length, length - 1, length - 1
    counts, later = dest.counts
    steps = float(later.steps[index])
    if dest.backend == "transformers":
        step = dest.costs.assisted_step_time(len(dest.shape))
    elif dest.stop is not None and steps:  # its steps by nodes verified and draft levels fed
        verified, fed = (x[index] / steps for x in (later.drafted_steps, later.fed_steps))
        step = dest.costs.stopped_step_time(dest.shape, verified, fed)
    else:
        share = later.proposals[index] / steps if steps else 1.0
        step = dest.costs.step_time(dest.shape, share)
    return (
        float(counts.positions[index]),
        float(counts.steps[index]),
        float(later.positions[index]),
        steps * step / dest.costs.plain_token_s,
    )


def routed_predictions(
    population: ReplayRecords,
    texts: Mapping[str, str],
    destinations: Mapping[str, Destination],
    settings: Settings | None = None,
    router: RuleRouter | None = None,
) -> dict[str, RoutedPrediction]:
    """Per domain of ``population`` (the tuning prompts): each prompt routed by ``router`` on
    its text (``texts``: prompt id -> the text the router reads) and replayed with the entry of
    the domain it is sent to (``destinations``; a domain without an entry: the uniform one,
    ``ALL_DOMAINS``). Empty when a prompt's text or records are missing (nothing to predict
    from)."""
    router = router or RuleRouter()
    settings = settings or Settings()
    index = {
        d: {p: i for i, p in enumerate(dest.predictor.records.prompt_ids)}
        for d, dest in destinations.items()
    }
    rows = []  # (domain, destination, figures)
    for p, prompt_id in enumerate(population.prompt_ids):
        if prompt_id not in texts:
            return {}
        routed = router.classify(texts[prompt_id])
        to = routed if routed in destinations else ALL_DOMAINS
        if to not in destinations or prompt_id not in index[to]:
            return {}
        domain = population.domains[population.prompt_domain[p]]
        length = int(population.lengths[p])
        rows.append(
            (domain, routed, _prompt_figures(destinations[to], index[to][prompt_id], length))
        )
    out = {}
    for domain in population.domains:
        mine = [(to, f) for d, to, f in rows if d == domain]
        figures = np.array([f for _, f in mine])
        boot = ClusterBootstrap.draw(
            np.zeros(len(mine)), settings.n_boot, settings.seed, settings.confidence
        )
        totals = boot.total(figures[:, :2])
        tokens = boot.estimate(ratio(totals[:, 0], totals[:, 1]), prompts=len(mine))
        prediction = Prediction(
            tokens.value,
            tokens.lo,
            tokens.hi,
            REPLAY,
            decode_tokens_per_step=float(
                figures[:, 2].sum() / max(1, figures[:, 1].sum() - len(mine))
            ),
            prompts=len(mine),
        )
        speedup = float(figures[:, 2].sum() / figures[:, 3].sum())
        out[domain] = RoutedPrediction(dict(Counter(to for to, _ in mine)), prediction, speedup)
    return out
