"""A scorecard of acceptance predictors: how well each signal in a run's records, and learned
combinations of them, predict greedy acceptance, scored as DeepSpec scores a confidence head.

Four targets, all read from the node records:

- ``node``: a node's greedy acceptance (its token is the target's greedy token at its context),
  over every node of every tree, as one pool (one draft position). In a tree with siblings this
  pool is dominated by the tree's design: a sibling of lower rank is rarely the target's token,
  and siblings share one context (so one target entropy);
- ``rank0``: the same label over the draft's first choices only (sibling rank 0), one pool: how
  well a signal ranks acceptance where the sibling rank cannot (left out when every node has
  rank 0: it is then the ``node`` target);
- ``edge``: the same label over the top-1 chain's nodes whose parent path was accepted (roots
  included), one pool: the edges a chain's stop rule decides on, the conditional acceptance a
  speculation budget acts on;
- ``prefix``: the acceptance of each draft position's prefix along the top-1 chain, DeepSpec's
  per-position target. For the chain node at depth d (draft position d - 1), the label is 1 when
  the chain's nodes at depths 1..d are all greedy-accepted (the verifier would emit all d
  tokens). The prediction is, as DeepSpec's ``cumprod_pred``, the product over depths 1..d of a
  per-node probability of acceptance given that the prefix before it was accepted: each
  predictor's per-node probability is fitted on chain nodes whose parent path was accepted
  (``eligible``), from the signals at that node only.

Predictors. Each signal (draft probability, draft entropy, sibling rank, depth, position in the
output, domain; and, known only after the target's pass, target entropy, top-1 probability and
margin, KL(target || draft) and the strict-greedy certificate's slack, certificate minus KL) is
turned into a probability by a monotone map fitted on training prompts only (isotonic regression,
its direction chosen on the training prompts; domain: the training prompts' acceptance rate per
domain). The draft probability is also scored as it is (``as is``: the probability llama.cpp's
``p_min`` thresholds). Two learned combinations (scikit-learn's HistGradientBoostingClassifier)
use all draft-side signals, and all signals. Every fitted predictor is fitted on prompts disjoint
from those it is scored on: prompt-grouped K-fold (GroupKFold), so every prompt is scored out of
fold. Target probability, target rank, p_target and alpha are never signals: they define the label.

Metrics: those of deepseek-ai/DeepSpec, ``deepspec/eval/dspark/confidence_head.py``
(``PerPositionConfidenceMetrics``, ``summarize_confidence_row``) and the bin counts of
``deepspec/eval/dspark/evaluator.py`` (20 coarse, 1000 fine), read at commit
afdfa7c9382a3341a3e6f17756dd816da79f132c:

- predictions are clamped to [1e-8, 1 - 1e-8];
- ECE: 20 equal-width bins over [0, 1] (bin = floor(p * 20), clamped to 0..19); the sum over bins
  of (rows in the bin) * |mean predicted - mean observed|, over all rows;
- AUROC: from histograms of the predictions of accepted and rejected rows over 1000 equal-width
  bins: pairs where the accepted row's bin is higher, plus half the pairs in the same bin, over
  (accepted x rejected) pairs. This is scikit-learn's ``roc_auc_score`` of the predictions
  rounded down to 1/1000 (the tests check it). For one signal on the node target the map is
  monotone, so the AUROC is the signal's own, up to the ties of the fitted map;
- Brier score: the mean of (p - y)^2 (scikit-learn's ``brier_score_loss``);
- each metric per draft position, then summarised as DeepSpec does: the mean over positions
  weighted by the rows at each position (AUROC: over the positions where it is defined);
- the reliability diagram: per coarse bin, mean predicted, mean observed and rows.

Intervals: a prompt-clustered bootstrap that resamples prompts within domains
(:class:`specscope.analysis.stats.ClusterBootstrap`), vectorised: every metric is a function of
per-prompt bin sums, so all resamples are one matrix product. The out-of-fold predictions are
held fixed: the interval covers the sampling of the scored prompts, not the refitting of the maps.
On synthetic chain runs of known truth (``synthetic.synthetic_predictor_tables``, 30 prompts of 16
steps, 30 repetitions) the 95% intervals covered the true AUROC, ECE and Brier score of the
draft probability as is 93-97% of the time, of the prefix target 90-93%, and the true AUROC of
the fitted map 83% (its fitting variance is not in the interval).

Certificates enter as what they are, a sufficient condition for acceptance: per criterion (and
tree width), their precision (certified steps accepted, or covered) and the fraction of accepted
(covered) steps they certify, over all steps and per bin of the target's margin, from the
columns :func:`specscope.analysis.certify.certify_steps` reads (nothing is recomputed).

This module reads records only; it draws nothing (see ``scorecard_plots``), writes no files and
does not choose a drafting policy: it says which draft-side signal ranks prefix acceptance best.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.isotonic import IsotonicRegression
from sklearn.model_selection import GroupKFold
from threadpoolctl import threadpool_limits

from ..errors import SpecscopeError
from ..records import Run
from .certify import (
    DEFAULT_MARGIN_BINS,
    StepClusters,
    certify_steps,
    check_margin_bins,
    criterion_order,
    flag_column,
    margin_bin_codes,
    margin_bin_labels,
)
from .prepare import ALL, Records
from .render import Column, Grid
from .replay import StopRule, estimate, index_records, replay_counts, top_chain
from .results import Settings
from .stats import ClusterBootstrap, Estimate, bounded, ratio

N_BINS = 20  # DeepSpec's CONFIDENCE_NUM_BINS: the ECE and the reliability diagram
N_FINE_BINS = 1000  # DeepSpec's CONFIDENCE_NUM_FINE_BINS: the AUROC histograms
EPS_PROB = 1e-8  # DeepSpec's clamp of predictions

NODE, RANK0, EDGE, PREFIX = "node", "rank0", "edge", "prefix"
TARGETS = (NODE, RANK0, EDGE, PREFIX)
DRAFT, TARGET = "draft", "target"  # a signal's side: known before the target's pass, or after
AS_IS = " (as is)"
LEARNED_DRAFT, LEARNED_ALL = "learned: draft side", "learned: all signals"


class ScorecardError(SpecscopeError, ValueError):
    """Records or settings the scorecard cannot score (too few prompts, no signal, no label)."""


@dataclass(frozen=True)
class Signal:
    """A per-node signal: the first column, minus the second when two are named."""

    name: str
    columns: tuple[str, ...]
    side: str  # DRAFT or TARGET
    categorical: bool = False
    probability: bool = False  # already a probability: also scored as is

    def values(self, nodes: pd.DataFrame) -> np.ndarray:
        if self.categorical:
            return pd.factorize(nodes[self.columns[0]].astype(str), sort=True)[0].astype(float)
        x = nodes[self.columns[0]].to_numpy(np.float64)
        return x - nodes[self.columns[1]].to_numpy(np.float64) if len(self.columns) > 1 else x


SIGNALS: tuple[Signal, ...] = (
    Signal("draft probability", ("p_draft",), DRAFT, probability=True),
    Signal("draft entropy", ("draft_entropy",), DRAFT),
    Signal("sibling rank", ("sibling_rank",), DRAFT),
    Signal("depth", ("depth",), DRAFT),
    Signal("position", ("step",), DRAFT),
    Signal("domain", ("domain",), DRAFT, categorical=True),
    Signal("target entropy", ("target_entropy",), TARGET),
    Signal("target top-1 probability", ("target_top1_prob",), TARGET),
    Signal("target margin", ("target_margin",), TARGET),
    Signal("KL(target || draft)", ("kl_target_draft",), TARGET),
    Signal("greedy certificate slack", ("cert_greedy", "kl_target_draft"), TARGET),
)
SIGNALS_BY_NAME = {s.name: s for s in SIGNALS}


@dataclass(frozen=True)
class ScorecardSettings:
    """How a scorecard is computed; recorded with it."""

    n_boot: int = 500  # each resample holds 1000-bin AUROC histograms per position
    seed: int = 0
    confidence: float = 0.95
    folds: int = 5  # prompt-grouped folds of the out-of-fold fits
    margin_bins: tuple[float, ...] = DEFAULT_MARGIN_BINS
    learned: bool = True  # fit the learned combinations (the slowest part)


# --- DeepSpec's metrics, from bin sums ----------------------------------------------------------


@dataclass(frozen=True)
class BinSums:
    """Sums behind DeepSpec's metrics, per (leading index: prompt or resample, position, bin)."""

    count: np.ndarray  # (L, K, N_BINS) rows per coarse bin
    pred: np.ndarray  # (L, K, N_BINS) sum of predictions
    observed: np.ndarray  # (L, K, N_BINS) sum of labels
    positive: np.ndarray  # (L, K, N_FINE_BINS) accepted rows per fine bin
    negative: np.ndarray  # (L, K, N_FINE_BINS) rejected rows per fine bin
    squared: np.ndarray  # (L, K) sum of (p - y)^2

    def totals(self, boot: ClusterBootstrap) -> BinSums:
        """The sums of every resample: leading index prompt -> resample (row 0: the sample)."""
        return BinSums(*(boot.total(getattr(self, f)) for f in _BIN_FIELDS))

    def compact(self) -> BinSums:
        """The same sums without the fine bins no row falls in (the AUROC does not change)."""
        used = (self.positive + self.negative).sum(axis=(0, 1)) > 0
        return BinSums(
            self.count,
            self.pred,
            self.observed,
            self.positive[..., used],
            self.negative[..., used],
            self.squared,
        )

    def __add__(self, other: BinSums) -> BinSums:
        return BinSums(*(getattr(self, f) + getattr(other, f) for f in _BIN_FIELDS))


_BIN_FIELDS = ("count", "pred", "observed", "positive", "negative", "squared")


def bin_sums(
    prob: np.ndarray, label: np.ndarray, cluster: np.ndarray, position: np.ndarray, shape: tuple
) -> BinSums:
    """Per (cluster, position) bin sums of predictions ``prob`` of 0/1 ``label``s; ``shape`` is
    (clusters, positions)."""
    p = np.clip(np.asarray(prob, dtype=np.float64), EPS_PROB, 1.0 - EPS_PROB)
    y = np.asarray(label, dtype=np.float64)
    L, K = shape
    cell = np.asarray(cluster, dtype=np.int64) * K + np.asarray(position, dtype=np.int64)
    coarse = cell * N_BINS + np.minimum((p * N_BINS).astype(np.int64), N_BINS - 1)
    fine = cell * N_FINE_BINS + np.minimum((p * N_FINE_BINS).astype(np.int64), N_FINE_BINS - 1)

    def count(index: np.ndarray, bins: int, weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(index, weights=weights, minlength=L * K * bins).reshape(L, K, bins)

    return BinSums(
        count(coarse, N_BINS),
        count(coarse, N_BINS, p),
        count(coarse, N_BINS, y),
        count(fine, N_FINE_BINS, y),
        count(fine, N_FINE_BINS, 1.0 - y),
        count(cell, 1, (p - y) ** 2)[..., 0],
    )


@dataclass(frozen=True)
class MetricArrays:
    """DeepSpec's metrics per (leading index, position), and their position summaries."""

    rows: np.ndarray  # (L, K)
    auroc: np.ndarray  # (L, K)
    brier: np.ndarray
    ece: np.ndarray
    mean_pred: np.ndarray
    mean_observed: np.ndarray

    def summary(self, name: str) -> np.ndarray:
        """(L,) ``summarize_confidence_row``: the rows-weighted mean over defined positions."""
        values = getattr(self, name)
        w = np.where(np.isfinite(values), self.rows, 0.0)
        return ratio((np.nan_to_num(values) * w).sum(axis=-1), w.sum(axis=-1))


def metrics_of(sums: BinSums) -> MetricArrays:
    """ECE, AUROC, Brier score, mean prediction and mean label from bin sums (any leading shape)."""
    rows = sums.count.sum(axis=-1)
    ece = ratio(np.abs(sums.pred - sums.observed).sum(axis=-1), rows)
    pos, neg = sums.positive, sums.negative
    below = np.cumsum(neg, axis=-1) - neg
    pairs = np.einsum("...f,...f->...", pos, below + 0.5 * neg)
    n_pairs = pos.sum(axis=-1) * neg.sum(axis=-1)
    return MetricArrays(
        rows,
        ratio(pairs, n_pairs),
        ratio(sums.squared, rows),
        ece,
        ratio(sums.pred.sum(axis=-1), rows),
        ratio(sums.observed.sum(axis=-1), rows),
    )


@dataclass(frozen=True)
class Metrics:
    """DeepSpec's summary metrics of one sample (no interval)."""

    auroc: float
    brier: float
    ece: float
    rows: int


def deepspec_metrics(
    prob: np.ndarray, label: np.ndarray, position: np.ndarray | None = None
) -> Metrics:
    """DeepSpec's summary AUROC, Brier and ECE of predictions ``prob`` of 0/1 ``label`` (per
    ``position`` then the rows-weighted mean over positions; all rows one position if None)."""
    position = np.zeros(len(label), np.int64) if position is None else np.asarray(position)
    K = int(position.max(initial=0)) + 1
    m = metrics_of(bin_sums(prob, label, np.zeros(len(label), np.int64), position, (1, K)))
    return Metrics(
        float(m.summary("auroc")[0]),
        float(m.summary("brier")[0]),
        float(m.summary("ece")[0]),
        len(label),
    )


# --- out-of-fold predictions ----------------------------------------------------------------------

Fitter = Callable[[np.ndarray, np.ndarray], Callable[[np.ndarray], np.ndarray]]


def _constant(y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    rate = float(y.mean()) if len(y) else 0.5
    return lambda x: np.full(len(x), rate)


def fit_isotonic(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A monotone map of one signal to P(accept), its direction chosen on the training rows."""
    model = IsotonicRegression(increasing="auto", out_of_bounds="clip", y_min=0.0, y_max=1.0)
    with warnings.catch_warnings():  # "auto" warns when the direction is uncertain: so be it
        warnings.simplefilter("ignore")
        model.fit(x[:, 0], y)
    return lambda z: model.predict(z[:, 0])


def fit_rates(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """P(accept) per level of a categorical signal (codes), the overall rate for unseen levels."""
    codes = x[:, 0].astype(np.int64)
    size = int(codes.max(initial=-1)) + 1
    rates = ratio(np.bincount(codes, y, size), np.bincount(codes, minlength=size))
    overall = float(y.mean()) if len(y) else 0.5

    def predict(z: np.ndarray) -> np.ndarray:
        c = z[:, 0].astype(np.int64)
        seen = (c < size) & (c >= 0)
        out = np.full(len(c), overall)
        out[seen] = np.nan_to_num(rates[c[seen]], nan=overall)
        return out

    return predict


def _one_thread(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    with threadpool_limits(1):
        return f(x)


def boosted(categorical: tuple[bool, ...]) -> Fitter:
    """Gradient-boosted trees on several signals (scikit-learn, log loss: calibrated scores)."""

    def fit(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        if len(np.unique(y)) < 2:
            return _constant(y)
        model = HistGradientBoostingClassifier(
            max_iter=100,
            learning_rate=0.1,
            max_depth=3,
            min_samples_leaf=100,
            l2_regularization=1.0,
            categorical_features=list(categorical) if any(categorical) else None,
            early_stopping=False,
            random_state=0,
        )
        with threadpool_limits(1):  # small data: OpenMP threads only contend on a busy machine
            model.fit(x, y)
        return lambda z: _one_thread(model.predict_proba, z)[:, 1]

    return fit


def out_of_fold(
    fitter: Fitter,
    x: np.ndarray,
    y: np.ndarray,
    prompt: np.ndarray,
    fit_rows: np.ndarray,
    folds: int,
) -> np.ndarray:
    """Each row's prediction by a model fitted on the ``fit_rows`` of the other folds' prompts."""
    pred = np.empty(len(y))
    for train, test in GroupKFold(n_splits=folds).split(x, y, prompt):
        train = train[fit_rows[train]]
        fit = fitter if len(train) else lambda x, y: _constant(y)  # nothing to fit: 0.5
        pred[test] = fit(x[train], y[train])(x[test])
    return pred


# --- the rows each target scores -----------------------------------------------------------------


@dataclass(frozen=True)
class TargetRows:
    """The node rows one target scores, with its labels and what its per-node models fit on."""

    name: str
    rows: np.ndarray  # node row indices
    label: np.ndarray  # (N,) 0/1
    position: np.ndarray  # (N,) 0-based draft position
    n_positions: int
    fit_rows: np.ndarray  # (N,) bool: rows the per-node models are fitted on
    node_label: np.ndarray  # (N,) the per-node label the models fit (greedy acceptance)
    tree: np.ndarray  # (N,) the tree (prompt, step) of each row, for the chain's product

    def combine(self, q: np.ndarray) -> np.ndarray:
        """Per-node probabilities -> the target's prediction (prefix: the product along the chain)."""
        if self.name != PREFIX:
            return q
        order = np.lexsort((self.position, self.tree))
        frame = pd.DataFrame({"tree": self.tree[order], "q": q[order]})
        out = np.empty(len(q))
        out[order] = frame.groupby("tree", sort=False)["q"].cumprod().to_numpy()
        return out


def target_rows(records: Records, name: str) -> TargetRows:
    """One target's rows (see the module docstring): ``node``, ``rank0``, ``edge`` or ``prefix``."""
    nodes = records.nodes
    tree = nodes.prompt * (int(nodes.step.max(initial=0)) + 1) + nodes.step
    if name in (NODE, RANK0, EDGE):
        if name == NODE:
            rows = np.arange(len(nodes))
        elif name == RANK0:
            rows = np.flatnonzero(nodes.rank == 0)
        else:
            rows = np.flatnonzero(nodes.on_chain & nodes.eligible)
        label = nodes.greedy[rows]
        position = np.zeros(len(rows), np.int64)
        fit_rows = np.ones(len(rows), bool)
    elif name == PREFIX:
        rows = np.flatnonzero(nodes.on_chain)
        label = nodes.path_accepted[rows].astype(np.float64)
        position = nodes.depth[rows] - 1
        fit_rows = nodes.eligible[rows]
    else:
        raise ScorecardError(f"unknown target {name!r}; allowed: {', '.join(TARGETS)}")
    return TargetRows(
        name,
        rows,
        np.asarray(label, dtype=np.float64),
        position,
        int(position.max(initial=0)) + 1,
        fit_rows,
        nodes.greedy[rows],
        tree[rows],
    )


# --- the scorecard --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Predictor:
    """A predictor of acceptance: one signal (fitted map, or as is), or a learned combination."""

    name: str
    side: str  # DRAFT: usable before the target's pass; TARGET: needs it
    kind: str  # "map", "as is" or "learned"


@dataclass(frozen=True)
class ScoreRow:
    """One predictor's DeepSpec metrics on one target, one domain (or All), one position (or all:
    DeepSpec's rows-weighted summary over positions)."""

    target: str
    predictor: str
    side: str
    domain: str
    position: int | None  # 0-based draft position; None: the summary over positions
    rows: int
    prompts: int
    observed: float  # mean label (the base rate)
    predicted: float  # mean prediction
    auroc: Estimate
    brier: Estimate
    ece: Estimate


@dataclass(frozen=True)
class ReliabilityBin:
    lo: float
    hi: float
    predicted: float  # mean prediction in the bin
    observed: float  # mean label in the bin
    rows: int


@dataclass(frozen=True)
class Reliability:
    """A predictor's reliability diagram on one target, all domains, all positions pooled."""

    target: str
    predictor: str
    bins: tuple[ReliabilityBin, ...]  # non-empty bins only, as DeepSpec lists them
    ece: float


@dataclass(frozen=True)
class StopSignal:
    """The draft-side signal that ranks prefix acceptance best, and how sure that is."""

    signal: str
    auroc: Estimate
    runner_up: str
    runner_up_auroc: Estimate
    difference: Estimate  # AUROC(signal) - AUROC(runner-up), paired over the same resamples

    @property
    def distinguished(self) -> bool:
        """The difference's interval excludes 0: the best is better than the runner-up."""
        return self.difference.has_interval and self.difference.lo > 0


@dataclass(frozen=True)
class CertificateRow:
    """A criterion's certificate as a sufficient condition, over steps of one domain and margin bin."""

    domain: str
    criterion: str
    margin: str  # the margin bin, or "all"
    steps: int
    precision: Estimate  # P(accepted (covered) | certified): 1 when the certificate is sound
    certified_share: Estimate  # P(certified | accepted (covered))


@dataclass(frozen=True)
class Scorecard:
    """The scorecard of a run: every predictor on each target, per domain and pooled."""

    settings: ScorecardSettings
    domains: tuple[str, ...]
    predictors: tuple[Predictor, ...]
    rows: tuple[ScoreRow, ...]
    reliability: tuple[Reliability, ...]
    stop_signal: StopSignal | None
    certificates: tuple[CertificateRow, ...]
    notes: tuple[str, ...]

    def row(
        self, target: str, predictor: str, domain: str = ALL, position: int | None = None
    ) -> ScoreRow | None:
        for r in self.rows:
            if (r.target, r.predictor, r.domain, r.position) == (
                target,
                predictor,
                domain,
                position,
            ):
                return r
        return None

    def best(self, target: str, side: str | None = None) -> ScoreRow | None:
        """The pooled summary row with the highest AUROC (of one side's predictors, or any)."""
        rows = [
            r
            for r in self.rows
            if r.target == target
            and r.domain == ALL
            and r.position is None
            and (side is None or r.side == side)
            and r.auroc.defined
        ]
        return max(rows, key=lambda r: r.auroc.value, default=None)


def _usable_signals(nodes: pd.DataFrame) -> tuple[list[Signal], list[str]]:
    """The signals the records hold with a finite value at every node, and notes on the rest."""
    usable, notes = [], []
    for s in SIGNALS:
        missing = [c for c in s.columns if c not in nodes.columns or nodes[c].isna().all()]
        if missing:
            notes.append(f"{s.name}: left out, the records have no {' or '.join(missing)}")
            continue
        bad = int((~np.isfinite(s.values(nodes))).sum()) if not s.categorical else 0
        if bad:
            notes.append(f"{s.name}: left out, {bad} nodes have no finite value")
            continue
        usable.append(s)
    return usable, notes


@dataclass(frozen=True)
class _Scored:
    """A predictor's predictions on one target, and its bootstrap replicates of the metrics."""

    predictor: Predictor
    per_domain: tuple[MetricArrays, ...]  # (B + 1, K) per domain
    pooled: MetricArrays  # (B + 1, K)
    pooled_sums: BinSums  # row 0: the sample's sums (for the reliability diagram)


def _score(
    predictor: Predictor,
    prob: np.ndarray,
    t: TargetRows,
    records: Records,
    boot: ClusterBootstrap,
) -> _Scored:
    prompt = records.nodes.prompt[t.rows]
    sums = bin_sums(prob, t.label, prompt, t.position, (records.n_prompts, t.n_positions)).compact()
    per_domain, pooled = [], None
    for g in range(len(records.domains)):
        cols = np.flatnonzero(records.prompt_domain == g)
        sub = BinSums(*(getattr(sums, f)[cols] for f in _BIN_FIELDS)).totals(boot.subset(cols))
        per_domain.append(sub)
        pooled = sub if pooled is None else pooled + sub
    return _Scored(predictor, tuple(metrics_of(s) for s in per_domain), metrics_of(pooled), pooled)


_METRICS = ("auroc", "brier", "ece")


def _score_rows(
    s: _Scored, t: TargetRows, records: Records, boot: ClusterBootstrap
) -> list[ScoreRow]:
    """The summary and per-position rows of one scored predictor, per domain and pooled."""
    present = np.zeros((records.n_prompts, t.n_positions), bool)
    present[records.nodes.prompt[t.rows], t.position] = True
    present = np.column_stack([present.any(axis=1), present])  # column 0: any position
    labels = [*records.domains, ALL]
    out = []
    for g, (label, m) in enumerate(zip(labels, (*s.per_domain, s.pooled), strict=True)):
        in_domain = np.ones(records.n_prompts, bool) if label == ALL else records.prompt_domain == g
        strata = len(np.unique(records.prompt_domain[in_domain & present[:, 0]]))
        # (B + 1, 1 + K, metric): the summary over positions, then each position
        reps = np.stack(
            [np.column_stack([m.summary(name), getattr(m, name)]) for name in _METRICS], axis=-1
        )
        rows = np.concatenate([[m.rows[0].sum()], m.rows[0]]).astype(np.int64)
        prompts = (present & in_domain[:, None]).sum(axis=0)
        ests = boot.estimates(reps, rows[:, None], prompts[:, None], max(strata, 1))
        means = [
            np.concatenate([[m.summary(n)[0]], getattr(m, n)[0]])
            for n in ("mean_observed", "mean_pred")
        ]
        for j in np.flatnonzero(rows > 0):
            out.append(
                ScoreRow(
                    t.name,
                    s.predictor.name,
                    s.predictor.side,
                    label,
                    None if j == 0 else int(j - 1),
                    int(rows[j]),
                    int(prompts[j]),
                    float(means[0][j]),
                    float(means[1][j]),
                    *(bounded(e) for e in ests[j]),
                )
            )
    return out


def _reliability(s: _Scored, target: str) -> Reliability:
    count = s.pooled_sums.count[0].sum(axis=0)
    pred = s.pooled_sums.pred[0].sum(axis=0)
    observed = s.pooled_sums.observed[0].sum(axis=0)
    bins = tuple(
        ReliabilityBin(
            b / N_BINS, (b + 1) / N_BINS, pred[b] / count[b], observed[b] / count[b], int(count[b])
        )
        for b in range(N_BINS)
        if count[b] > 0
    )
    total = count.sum()
    ece = float(np.abs(pred - observed).sum() / total) if total else math.nan
    return Reliability(target, s.predictor.name, bins, ece)


def _varies(x: np.ndarray, position: np.ndarray) -> bool:
    """Whether a signal takes more than one value at some position (else it ranks nothing:
    sibling rank and depth on the top-1 chain)."""
    order = np.lexsort((x, position))
    x, position = x[order], position[order]
    return bool(((x[1:] != x[:-1]) & (position[1:] == position[:-1])).any())


def _predictions(
    signals: list[Signal],
    nodes: pd.DataFrame,
    t: TargetRows,
    records: Records,
    folds: int,
    learned: bool,
    notes: list[str],
) -> list[tuple[Predictor, np.ndarray]]:
    """Every predictor's out-of-fold prediction of the target's label, one per target row
    (signals that rank nothing on the target are left out, with a line in ``notes``)."""
    prompt = records.nodes.prompt[t.rows]
    values = {s.name: s.values(nodes)[t.rows] for s in signals}
    out = []
    for s in signals:
        if not _varies(values[s.name], t.position):
            notes.append(f"{t.name}: {s.name} is constant at each draft position, left out")
            continue
        x = values[s.name][:, None]
        fitter = fit_rates if s.categorical else fit_isotonic
        q = out_of_fold(fitter, x, t.node_label, prompt, t.fit_rows, folds)
        out.append((Predictor(s.name, s.side, "map"), t.combine(q)))
        if s.probability:
            q = np.clip(values[s.name], 0.0, 1.0)
            out.append((Predictor(s.name + AS_IS, s.side, "as is"), t.combine(q)))
    if learned:
        draft_side = [s for s in signals if s.side == DRAFT]
        for name, side, chosen in (
            (LEARNED_DRAFT, DRAFT, draft_side),
            (LEARNED_ALL, TARGET, signals),
        ):
            if len(chosen) < 2 or (side == TARGET and len(chosen) == len(draft_side)):
                continue  # one signal, or no target-side signal to add
            x = np.column_stack([values[s.name] for s in chosen])
            fitter = boosted(tuple(s.categorical for s in chosen))
            q = out_of_fold(fitter, x, t.node_label, prompt, t.fit_rows, folds)
            out.append((Predictor(name, side, "learned"), t.combine(q)))
    return out


def _stop_signal(
    scored: list[_Scored], boot: ClusterBootstrap, records: Records
) -> StopSignal | None:
    """The draft-side single signal with the highest pooled prefix AUROC, against the runner-up."""
    single = [s for s in scored if s.predictor.side == DRAFT and s.predictor.kind == "map"]
    ranked = sorted(
        (s for s in single if math.isfinite(s.pooled.summary("auroc")[0])),
        key=lambda s: -s.pooled.summary("auroc")[0],
    )
    if len(ranked) < 2:
        return None
    G, P = len(records.domains), records.n_prompts
    rows = int(ranked[0].pooled.rows[0].sum())
    a, b = (s.pooled.summary("auroc") for s in ranked[:2])
    return StopSignal(
        ranked[0].predictor.name,
        bounded(boot.estimate(a, rows, P, G)),
        ranked[1].predictor.name,
        bounded(boot.estimate(b, rows, P, G)),
        boot.estimate(a - b, rows, P, G),
    )


def certificate_rows(
    run: Run, settings: ScorecardSettings
) -> tuple[list[CertificateRow], list[str]]:
    """Each certificate's precision and certified share of accepted steps, over all steps and per
    target-margin bin, per domain and over all (from the columns ``certify`` reads)."""
    steps, _, notes = certify_steps(run)
    names = sorted(
        (c[5:] for c in steps.columns if c.startswith("cert_")),
        key=lambda n: (n.startswith("tree_m"), criterion_order(n)),
    )
    if not names:
        return [], [*notes, "no certificate columns in the records: no certificate table"]
    clusters = StepClusters.of(steps, settings.n_boot, settings.seed, settings.confidence)
    edges = check_margin_bins(settings.margin_bins)
    has_margin = "target_margin" in steps and not steps["target_margin"].isna().all()
    codes = (
        margin_bin_codes(steps["target_margin"].to_numpy(np.float64), edges) if has_margin else None
    )
    labels = margin_bin_labels(edges)
    domain = steps["domain"].astype(str).to_numpy()
    out = []
    for name in names:
        ok_col = f"tree_covered_m{name[6:]}" if name.startswith("tree_m") else f"accept_{name}"
        flag_col = flag_column(name)
        if ok_col not in steps or flag_col not in steps:
            notes.append(f"{name}: no {ok_col} or {flag_col} column, left out")
            continue
        ok = steps[ok_col].astype("float64").to_numpy(np.float64)
        cert = steps[flag_col].astype("float64").to_numpy(np.float64)
        flags = np.column_stack([np.where(cert == 1, ok, np.nan), np.where(ok == 1, cert, np.nan)])
        for label in [ALL, *sorted(set(domain))]:
            keep = np.ones(len(steps), bool) if label == ALL else domain == label
            cells = [("all", np.where(keep, 0, -1), 1)]
            if codes is not None:
                cells.append(("bins", np.where(keep, codes, -1), len(labels)))
            for kind, cell, n_cells in cells:
                ests, counts = clusters.fractions(flags, cell, n_cells)
                for b in range(n_cells):
                    out.append(
                        CertificateRow(
                            label,
                            name,
                            "all" if kind == "all" else labels[b],
                            int(counts[b]),
                            ests[b, 0],
                            ests[b, 1],
                        )
                    )
    return out, notes


def scorecard(records: Records, settings: ScorecardSettings | None = None) -> Scorecard:
    """The scorecard of a run's records (:func:`specscope.analysis.prepare`)."""
    settings = settings or ScorecardSettings()
    if settings.folds < 2:
        raise ScorecardError(
            f"folds must be at least 2 (prompt-grouped K-fold), got {settings.folds}"
        )
    if records.n_prompts < settings.folds:
        raise ScorecardError(
            f"{records.n_prompts} prompts cannot be split into {settings.folds} prompt-disjoint "
            f"folds: give at most {records.n_prompts} folds, or a run with more prompts"
        )
    nodes = records.run.nodes
    signals, notes = _usable_signals(nodes)
    if not signals:
        raise ScorecardError("the records hold none of the signals: " + "; ".join(notes))
    boot = ClusterBootstrap.draw(
        records.prompt_domain, settings.n_boot, settings.seed, settings.confidence
    )
    rows, reliability, predictors, prefix_scored = [], [], {}, []
    for target in TARGETS:
        if target == RANK0 and not (records.nodes.rank != 0).any():
            notes.append(f"{RANK0}: every node has sibling rank 0 (the {NODE} target), left out")
            continue
        t = target_rows(records, target)
        if not t.fit_rows.any():
            notes.append(f"{target}: no node to fit on, left out")
            continue
        for predictor, prob in _predictions(
            signals, nodes, t, records, settings.folds, settings.learned, notes
        ):
            predictors[predictor.name] = predictor
            s = _score(predictor, prob, t, records, boot)
            rows.extend(_score_rows(s, t, records, boot))
            reliability.append(_reliability(s, target))
            if target == PREFIX:
                prefix_scored.append(s)
    certificates, cert_notes = certificate_rows(records.run, settings)
    return Scorecard(
        settings,
        records.domains,
        tuple(predictors.values()),
        tuple(rows),
        tuple(reliability),
        _stop_signal(prefix_scored, boot, records),
        tuple(certificates),
        tuple(notes + cert_notes),
    )


# --- a stop rule on the best signal, replayed ----------------------------------------------------

STOP_RULE_SIGNALS = {"draft probability": "p_min", "draft entropy": "h_max"}  # what replay's
# StopRule can stop on
STOP_SHARES = (0.05, 0.1, 0.2, 0.3)  # thresholds: the signal's values that stop at these shares
# of the chain's nodes (p_min: the share-quantile; h_max: the (1 - share)-quantile)


@dataclass(frozen=True)
class StopRuleRow:
    """Decoded tokens per step of the top-1 chain under one stop rule, one domain (or All)."""

    rule: str  # the candidate's label ("top-1 chain" alone, or with its stop rule)
    threshold: float  # NaN: no rule
    domain: str
    tokens_per_step: Estimate
    proposal_share: Estimate  # decoding steps that drafted at least one node


def stop_rule_rows(
    run: Run, card: Scorecard, shares: tuple[float, ...] = STOP_SHARES
) -> tuple[str, list[StopRuleRow]]:
    """The top-1 chain replayed as greedy decoding under stop rules on the draft-side signal a
    stop rule can read (:class:`specscope.analysis.replay.StopRule`: draft probability or draft
    entropy) that ranks prefix acceptance best on ``card``, at thresholds that fail the given
    ``shares`` of the chain's nodes, beside the chain without a rule; all from one bootstrap
    (paired). Returns the signal and the rows. Tokens per step only: a shorter draft also costs
    less drafting, which a replay does not time."""
    rows = [card.row(PREFIX, name) for name in STOP_RULE_SIGNALS]
    rows = [r for r in rows if r is not None and r.auroc.defined]
    if not rows:
        raise ScorecardError(
            "the scorecard has no prefix score of the draft probability or the draft entropy, "
            "the signals a replayed stop rule can read"
        )
    signal = max(rows, key=lambda r: r.auroc.value).predictor
    rec = index_records(run)
    chain = top_chain(rec.spine_depth)
    on_chain = np.isin(rec.node_path, rec.path_index(chain.shape.paths))
    values = rec.signals[SIGNALS_BY_NAME[signal].columns[0]][on_chain]
    kind = STOP_RULE_SIGNALS[signal]
    cuts = sorted({float(np.quantile(values, q if kind == "p_min" else 1.0 - q)) for q in shares})
    candidates = [chain, *(StopRule(chain, **{kind: c}) for c in cuts)]
    s = card.settings
    replays = estimate(
        rec,
        tuple(replay_counts(rec, c) for c in candidates),
        Settings(n_boot=s.n_boot, seed=s.seed, confidence=s.confidence),
    )
    out = [
        StopRuleRow(rp.candidate, t, r.domain, r.tokens_per_step, r.proposal_share)
        for rp, t in zip(replays, [math.nan, *cuts], strict=True)
        for r in rp.rows
    ]
    return signal, out


def stop_rule_grid(signal: str, rows: list[StopRuleRow]) -> Grid:
    """Tokens per step of the top-1 chain under each stop rule, per domain (columns)."""
    domains = list(dict.fromkeys(r.domain for r in rows))
    rules = list(dict.fromkeys(r.rule for r in rows))
    cell = {(r.rule, r.domain): r.tokens_per_step for r in rows}
    return Grid(
        "scorecard_stop_rules",
        f"Decoded tokens per step of the top-1 chain, stopped on the {signal}",
        (Column("candidate"), *(Column(d) for d in domains)),
        tuple((rule, *(cell[rule, d] for d in domains)) for rule in rules),
        "The recorded trees' top-1 chain replayed as greedy decoding, drafting stopped before "
        "the first node past the threshold (each threshold set so that a given share of the "
        "chain's nodes fails it). Tokens per step only; drafting time is not counted. Intervals: prompts "
        "resampled within domains, the same resamples for every rule.",
    )


# --- tables ---------------------------------------------------------------------------------------

_TARGET_TEXT = {
    NODE: "greedy acceptance of a node (all nodes)",
    RANK0: "greedy acceptance of the draft's first choices (nodes of sibling rank 0)",
    EDGE: "greedy acceptance of the top-1 chain's nodes whose parent path was accepted",
    PREFIX: "acceptance of each draft position's prefix along the top-1 chain "
    "(DeepSpec's summary over positions)",
}
_METRIC_NOTE = (
    "Metrics as DeepSpec's confidence_head.py computes them: AUROC from 1000-bin histograms, "
    "ECE over 20 equal-width bins, Brier score; prefix: per position, then the rows-weighted mean. "
    "Fitted predictors scored out of fold (prompt-grouped K-fold). side: draft = known before the "
    "target's pass, target = needs it. Intervals: prompt-clustered bootstrap within domains."
)


def scores_grid(card: Scorecard, target: str, domain: str = ALL) -> Grid:
    """Every predictor's AUROC, Brier and ECE on one target, one domain (or All)."""
    rows = sorted(
        (r for r in card.rows if r.target == target and r.domain == domain and r.position is None),
        key=lambda r: -r.auroc.value if r.auroc.defined else math.inf,
    )
    suffix = "" if domain == ALL else f"_{domain}"
    return Grid(
        f"scorecard_{target}{suffix}",
        f"Predictors of {_TARGET_TEXT[target]} ({domain})",
        (
            Column("predictor"),
            Column("side"),
            Column("rows"),
            Column("prompts"),
            Column("observed"),
            Column("predicted"),
            Column("AUROC"),
            Column("Brier"),
            Column("ECE"),
        ),
        tuple(
            (
                r.predictor,
                r.side,
                r.rows,
                r.prompts,
                r.observed,
                r.predicted,
                r.auroc,
                r.brier,
                r.ece,
            )
            for r in rows
        ),
        _METRIC_NOTE,
    )


def domains_grid(card: Scorecard, target: str, metric: str = "auroc") -> Grid:
    """One metric of every predictor on one target, per domain and pooled."""
    labels = [*card.domains, ALL]
    names = [p.name for p in card.predictors]
    table = []
    for name in names:
        cells = [card.row(target, name, d) for d in labels]
        if all(c is None for c in cells):
            continue
        table.append((name, *(getattr(c, metric) if c is not None else None for c in cells)))
    return Grid(
        f"scorecard_{target}_{metric}_by_domain",
        f"{metric.upper()} of predictors of {_TARGET_TEXT[target]}, per domain",
        (Column("predictor"), *(Column(d) for d in labels)),
        tuple(table),
        _METRIC_NOTE,
    )


def certificates_grid(card: Scorecard, domain: str = ALL) -> Grid:
    """Each certificate's precision and certified share of accepted steps, by margin bin."""
    return Grid(
        "scorecard_certificates" + ("" if domain == ALL else f"_{domain}"),
        f"Certificates as a sufficient condition for acceptance ({domain})",
        (
            Column("criterion"),
            Column("margin"),
            Column("steps"),
            Column("precision"),
            Column("certified share of accepted"),
        ),
        tuple(
            (r.criterion, r.margin, r.steps, r.precision, r.certified_share)
            for r in card.certificates
            if r.domain == domain
        ),
        "precision: accepted (tree_m: covered) steps among certified ones; certified share: "
        "certified steps among accepted (covered) ones. margin: target top-1 minus top-2 "
        "probability at the step's root context. Intervals: prompt-clustered bootstrap.",
    )


def scorecard_grids(card: Scorecard) -> list[Grid]:
    """The scorecard's tables: pooled scores per target, AUROC per domain, certificates."""
    grids = []
    for target in TARGETS:
        if any(r.target == target for r in card.rows):
            grids += [scores_grid(card, target), domains_grid(card, target)]
    if card.certificates:
        grids.append(certificates_grid(card))
    return grids
