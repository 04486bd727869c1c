"""Estimates with prompt-clustered bootstrap intervals, and the estimators built on them.

Nodes of one prompt are not independent: they share a context, a topic and a trajectory. Every
interval in specscope therefore comes from a bootstrap that resamples whole *prompts*, with
replacement, within each domain (the domains are the design's strata: a run draws a fixed number of
prompts per domain, so a resample keeps that number).

The bootstrap is vectorised. Every statistic here is a function of per-prompt sums (sums of values,
of squares, of cross products, counts, joint rank-bin counts), so the statistic of a resample only
needs those sums weighted by how often each prompt was drawn. All resamples at once are one matrix
product with a ``(B + 1) x P`` weight matrix: row 0 is all ones (the sample itself, which gives the
point estimate by the very same code path) and rows 1..B hold multinomial draw counts.

Intervals are t intervals with a bootstrap standard error, built to stay honest at the sample
sizes people run (2 to 50 prompts per domain): ``value ± t(df) * se``, where ``se`` is the standard
deviation of the B replicates scaled by ``n / (n - 1)`` (a bootstrap of ``n`` clusters
underestimates the variance by that factor), ``n`` the prompts per stratum behind the figure and
``df`` = prompts - strata behind it. With many prompts this is the usual normal interval; with 2
prompts per domain it is the classic two-sample t interval, wide as it must be (percentile
intervals covered the truth about half the time there). The tests in ``tests/test_calibration.py``
measure the coverage. An interval is left undefined (shown as "—") when the point estimate is
undefined, when df < 1 (a cluster bootstrap of one cluster per stratum has no spread to measure),
or when more than half of the replicates leave the statistic undefined (a cell that most
resamples do not reach). Every :class:`Estimate` keeps its ``se`` and ``df`` so that tests at
other levels (one-sided, multiplicity-corrected) use the same figures. A bench's timings vary with
the repeat as well as the prompt (the two crossed): :func:`with_repeats` adds the repeats'
variance to a prompt-resampled interval.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps
from scipy.special import stdtrit

EMPTY = "—"  # how an undefined value is shown, everywhere


@dataclass(frozen=True)
class Estimate:
    """A figure with its confidence interval; NaN marks what is undefined, never a number."""

    value: float
    lo: float = math.nan
    hi: float = math.nan
    n: int = 0  # observations behind the figure (nodes or steps)
    prompts: int = 0  # prompts behind the figure (the bootstrap's clusters)
    se: float = math.nan  # standard error (bootstrap, small-sample corrected)
    df: float = math.nan  # degrees of freedom of the t reference: prompts - strata

    @property
    def defined(self) -> bool:
        return math.isfinite(self.value)

    @property
    def has_interval(self) -> bool:
        return self.defined and math.isfinite(self.lo) and math.isfinite(self.hi)

    def contains(self, x: float) -> bool:
        return self.has_interval and self.lo <= x <= self.hi

    @property
    def testable(self) -> bool:
        return self.defined and math.isfinite(self.se) and math.isfinite(self.df) and self.df >= 1

    def p_above(self, x: float = 0.0) -> float:
        """One-sided p-value of "the true value exceeds x" (small: evidence that it does)."""
        if not self.testable:
            return math.nan
        if self.se == 0:
            return 0.0 if self.value > x else 1.0
        return float(sps.t.sf((self.value - x) / self.se, self.df))

    def p_below(self, x: float = 0.0) -> float:
        """One-sided p-value of "the true value is below x"."""
        if not self.testable:
            return math.nan
        if self.se == 0:
            return 0.0 if self.value < x else 1.0
        return float(sps.t.cdf((self.value - x) / self.se, self.df))

    def interval(self, confidence: float) -> tuple[float, float]:
        """The t interval at another ``confidence`` (a Bonferroni-adjusted one, say); NaN where
        the figure is not testable."""
        if not self.testable:
            return math.nan, math.nan
        half = float(sps.t.ppf(0.5 + confidence / 2, self.df)) * self.se
        return self.value - half, self.value + half

    def format(self, digits: int = 3, interval: bool = True, signed: bool = False) -> str:
        if not self.defined:
            return EMPTY
        fmt = f"{{:{'+' if signed else ''}.{digits}f}}"
        text = fmt.format(self.value)
        if interval and self.has_interval:
            text += f" [{fmt.format(self.lo)}, {fmt.format(self.hi)}]"
        return text

    def __str__(self) -> str:
        return self.format()


def bounded(e: Estimate, lo: float = 0.0, hi: float = 1.0) -> Estimate:
    """``e`` with its interval cut to [lo, hi], the range the quantity can take (a share)."""
    if not e.has_interval:
        return e
    return dataclasses.replace(e, lo=max(e.lo, lo), hi=min(e.hi, hi))


def nan_estimate(n: int = 0, prompts: int = 0) -> Estimate:
    return Estimate(math.nan, n=n, prompts=prompts)


def held_out_interval(
    value: float, lo: float, hi: float, fitted: int, new: int
) -> tuple[float, float]:
    """Where the same figure measured on ``new`` other prompts of the population falls, at the
    confidence of [lo, hi], an interval of ``value`` from ``fitted`` prompts.

    [lo, hi] bounds the population's figure; a figure of ``new`` other prompts also varies with
    the prompts drawn, by as much again at ``new`` = ``fitted``. The two samples' variances add,
    so each side widens by sqrt(1 + fitted / new) (a t interval's ``t * se`` becomes
    ``t * se * sqrt(1 + fitted / new)``). A 95% [lo, hi] of 30 tuning prompts held the figure of
    20 others in 79% of random splits (synthetic prompts and shipped runs alike), the widened
    interval in 94 to 96% (:func:`lab.calibration.held_out_coverage`)."""
    if fitted < 1 or new < 1:
        raise ValueError(f"prompt counts must be 1 or more, got fitted={fitted}, new={new}")
    widen = math.sqrt(1 + fitted / new)
    return value - (value - lo) * widen, value + (hi - value) * widen


def none_differed_p(fitted: int, new: int, differing: int) -> float:
    """Whether ``new`` prompts of which ``differing`` decoded otherwise than ``fitted`` prompts
    that all decoded alike can come from one population: Fisher's exact test (one-sided), the
    chance that, of all ``fitted + new`` prompts, the ``differing`` ones all fall among the new.

    A prediction whose every tuning prompt gave the same figure (a lookup that drafted nothing
    anyone accepted: 1.00 tokens per step each) has an interval of no width, and a held-out
    mean off it by any amount lies outside; what such a sample tells is how many prompts the
    figure misses, at most about 3 in ``fitted`` (the rule of three). At 20 and 20 prompts, 4
    differing give 0.053, 5 give 0.024. Exact under exchangeability: its false alarms stay under
    the level asked for (:func:`lab.calibration.none_differed_false_alarms`)."""
    if fitted < 1 or new < 1 or not 0 <= differing <= new:
        raise ValueError(f"need fitted, new >= 1 and 0 <= differing <= new, got {fitted}, {new}, "
                         f"{differing}")  # fmt: skip
    return float(
        sps.fisher_exact([[0, fitted], [differing, new - differing]], alternative="less").pvalue
    )


def with_repeats(
    e: Estimate, repeat_reps: np.ndarray, repeats: int, confidence: float = 0.95
) -> Estimate:
    """``e``, a figure whose interval resamples prompts, with what varies between repeats added.

    A bench times every prompt in every repeat, and what a repeat brings (the servers started
    for it, the machine's state while it ran) is common to all of its prompts: prompts and
    repeats are crossed, and resampling the prompts alone misses the repeats' variance (95%
    intervals held the truth 59% of the time at 3 repeats with a 1.3% repeat effect,
    :func:`lab.calibration.speedup_interval_coverage`). ``repeat_reps``: the
    figure's ``(B + 1,)`` replicates with the prompts kept and whole repeats drawn with
    replacement. The two variances add (each scaled by n / (n - 1)); the t interval takes the
    Welch-Satterthwaite degrees of freedom. One repeat has no variance to measure: ``e`` as it
    is."""
    if repeats < 2 or not e.defined or not math.isfinite(e.se):
        return e
    var_p = e.se**2
    var_r = float(np.nanvar(np.asarray(repeat_reps, float)[1:], ddof=1)) * repeats / (repeats - 1)
    var = var_p + var_r
    if var == 0:
        return dataclasses.replace(e, lo=e.value, hi=e.value, se=0.0)
    df = var**2 / (var_p**2 / e.df + var_r**2 / (repeats - 1))
    half = float(sps.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(var)
    return dataclasses.replace(e, lo=e.value - half, hi=e.value + half, se=math.sqrt(var), df=df)


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, NaN where den is 0 (an empty cell), without warnings."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


@dataclass(frozen=True)
class ClusterBootstrap:
    """Resampling weights over prompts: ``weights[0]`` is all ones, ``weights[1:]`` draw counts."""

    weights: np.ndarray  # (B + 1, P)
    confidence: float = 0.95

    @classmethod
    def draw(
        cls, strata: np.ndarray, n_boot: int, seed: int, confidence: float = 0.95
    ) -> ClusterBootstrap:
        """Multinomial resamples of the prompts of each stratum (domain), all from one seed."""
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {confidence}")
        if n_boot < 0:
            raise ValueError(f"n_boot must be >= 0, got {n_boot}")
        strata = np.asarray(strata)
        weights = np.ones((n_boot + 1, len(strata)))
        rng = np.random.default_rng(seed)
        for stratum in np.unique(strata):  # sorted: the draw order is fixed by the seed alone
            cols = np.flatnonzero(strata == stratum)
            if n_boot:
                weights[1:, cols] = rng.multinomial(
                    len(cols), np.full(len(cols), 1.0 / len(cols)), size=n_boot
                )
        return cls(weights, confidence)

    @property
    def n_boot(self) -> int:
        return self.weights.shape[0] - 1

    @property
    def n_prompts(self) -> int:
        return self.weights.shape[1]

    def subset(self, prompts: np.ndarray) -> ClusterBootstrap:
        """The same resamples restricted to some prompts (columns), e.g. one domain's."""
        return ClusterBootstrap(self.weights[:, prompts], self.confidence)

    def total(self, per_prompt: np.ndarray) -> np.ndarray:
        """Weighted sums over prompts: ``(P, *shape) -> (B + 1, *shape)``; row 0 is the plain sum."""
        per_prompt = np.asarray(per_prompt, dtype=float)
        flat = per_prompt.reshape(per_prompt.shape[0], -1)
        return (self.weights @ flat).reshape((self.weights.shape[0],) + per_prompt.shape[1:])

    def estimates(
        self,
        reps: np.ndarray,
        n: np.ndarray | int = 0,
        prompts: np.ndarray | int = 0,
        strata: np.ndarray | int = 1,
    ) -> np.ndarray:
        """Turn ``(B + 1, *shape)`` replicates into an object array of :class:`Estimate`.

        ``prompts`` and ``strata`` say how many prompts, from how many domains, stand behind each
        figure: they set the small-sample correction and the t interval's degrees of freedom.
        """
        # Stratified by domain, resamples never vary where every domain has a single prompt:
        # then there is no interval to give.
        return interval_estimates(
            reps, bool(np.any(self.weights[1:] != 1)), self.confidence, n, prompts, strata
        )

    def estimate(self, reps: np.ndarray, n: int = 0, prompts: int = 0, strata: int = 1) -> Estimate:
        """One :class:`Estimate` from ``(B + 1,)`` replicates."""
        return self.estimates(np.asarray(reps, dtype=float)[:, None], n, prompts, strata)[0]


@dataclass(frozen=True)
class DomainCells:
    """The bootstrap's totals of per-prompt sums over each domain's prompts, then over all."""

    boot: ClusterBootstrap
    totals: np.ndarray  # (B + 1, G + 1, columns); row 0 the sample's own
    prompts: np.ndarray  # (G + 1, columns): prompts with a non-zero sum in the cell
    strata: np.ndarray  # (G + 1, columns): domains with such prompts

    @classmethod
    def of(cls, boot: ClusterBootstrap, per_prompt: np.ndarray, codes: np.ndarray) -> DomainCells:
        onehot = np.eye(int(codes.max()) + 1)[codes]  # (P, G)
        by_domain = boot.total(per_prompt[:, None, :] * onehot[:, :, None])
        present = (per_prompt > 0).astype(float)
        prompts_in = onehot.T @ present
        return cls(
            boot,
            np.concatenate([by_domain, by_domain.sum(axis=1, keepdims=True)], axis=1),
            np.vstack([prompts_in, present.sum(axis=0)]),
            np.vstack([np.minimum(prompts_in, 1), (prompts_in > 0).sum(axis=0)]),
        )

    def mean(self, num: slice, den: slice) -> np.ndarray:
        """Replicates (B + 1, G + 1, k) of the ratio of two columns' totals."""
        return ratio(self.totals[:, :, num], self.totals[:, :, den])

    def estimates(self, reps: np.ndarray, den: slice) -> np.ndarray:
        """Estimates of ``reps`` over the observations and prompts of the ``den`` columns."""
        n, prompts, strata = self.totals[0, :, den], self.prompts[:, den], self.strata[:, den]
        return self.boot.estimates(reps, n, prompts, strata)


def interval_estimates(
    reps: np.ndarray,
    varies: bool,
    confidence: float = 0.95,
    n: np.ndarray | int = 0,
    prompts: np.ndarray | int = 0,
    strata: np.ndarray | int = 1,
) -> np.ndarray:
    """:meth:`ClusterBootstrap.estimates` from the replicates alone: ``varies`` says whether any
    resample differs from the sample (for replicates drawn without keeping the weights)."""
    reps = np.asarray(reps, dtype=float)
    shape = reps.shape[1:]
    n = np.broadcast_to(np.asarray(n), shape)
    prompts = np.broadcast_to(np.asarray(prompts), shape).astype(float)
    strata = np.broadcast_to(np.maximum(np.asarray(strata), 1), shape).astype(float)
    value = reps[0]
    se = np.full(shape, np.nan)
    df = prompts - strata
    if varies and reps.shape[0] >= 3:
        boot = reps[1:]
        finite = np.isfinite(boot)
        ok = np.isfinite(value) & (finite.mean(axis=0) >= 0.5) & (df >= 1)
        if ok.any():
            per_stratum = prompts[ok] / strata[ok]
            sd = np.nanstd(boot[:, ok], axis=0, ddof=1)
            se[ok] = sd * np.sqrt(per_stratum / (per_stratum - 1))
    # the t quantile (scipy.stats.t.ppf without its argument checks: the same values, 30x faster)
    half = stdtrit(np.where(df >= 1, df, 1), 0.5 + confidence / 2) * se
    lo, hi = value - half, value + half
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(shape):
        out[idx] = Estimate(
            float(value[idx]),
            float(lo[idx]),
            float(hi[idx]),
            int(n[idx]),
            int(prompts[idx]),
            float(se[idx]),
            float(df[idx]) if math.isfinite(se[idx]) else math.nan,
        )
    return out


# --- estimators: each returns (B + 1,) replicates, row 0 the point estimate -------------------------


def _per_prompt(prompt: np.ndarray, n_prompts: int, *values: np.ndarray) -> np.ndarray:
    """(P, k) per-prompt sums of each of ``values`` (a value of None counts rows)."""
    return np.stack([np.bincount(prompt, weights=v, minlength=n_prompts) for v in values], axis=1)


def pearson_reps(
    boot: ClusterBootstrap, prompt: np.ndarray, x: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """Pearson r of x and y, from per-prompt moment sums (exact for every resample)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) == 0:
        return np.full(boot.n_boot + 1, np.nan)
    x = x - x.mean()  # centring keeps the moment formula free of cancellation
    y = y - y.mean()
    sums = boot.total(_per_prompt(prompt, boot.n_prompts, None, x, y, x * x, y * y, x * y))
    n, sx, sy, sxx, syy, sxy = sums.T
    mx, my = ratio(sx, n), ratio(sy, n)
    cov = ratio(sxy, n) - mx * my
    var = (ratio(sxx, n) - mx * mx) * (ratio(syy, n) - my * my)
    return ratio(cov, np.sqrt(np.clip(var, 0, None)))


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(), y - y.mean()
    den = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / den if den > 0 else math.nan


@dataclass(frozen=True)
class Ranked:
    """A variable's average ranks (ties averaged) and rank-bin codes, from one sort."""

    ranks: np.ndarray  # 1-based average ranks
    bins: np.ndarray  # rank-bin code of each value, 0..n_bins-1
    n_bins: int

    @classmethod
    def of(cls, values: np.ndarray, n_bins: int = 32) -> Ranked:
        """Each distinct value its own bin if there are at most n_bins, else n_bins quantile
        bins of the ranks; tied values share a rank and so always share a bin."""
        values = np.asarray(values, dtype=float)
        n = len(values)
        binary = (values == 0) | (values == 1)
        if n and binary.all():  # 0/1 data (greedy_accept): no sort needed
            n0 = int((values == 0).sum())
            ranks = np.where(values == 0, (n0 + 1) / 2, n0 + (n - n0 + 1) / 2)
            dense, n_unique = values.astype(np.int64), 2
        else:
            order = np.argsort(values)
            sorted_values = values[order]
            new = np.empty(n, bool)
            new[:1] = True
            new[1:] = sorted_values[1:] != sorted_values[:-1]
            dense_sorted = np.cumsum(new) - 1
            counts = np.bincount(dense_sorted)
            average = np.cumsum(counts) - counts + (counts + 1) / 2
            ranks, dense = np.empty(n), np.empty(n, np.int64)
            ranks[order] = average[dense_sorted]
            dense[order] = dense_sorted
            n_unique = len(counts)
        if n_unique <= n_bins:
            return cls(ranks, dense, n_unique)
        codes = np.minimum(((ranks - 0.5) * n_bins / n).astype(np.int64), n_bins - 1)
        used = np.bincount(codes, minlength=n_bins) > 0
        remap = np.cumsum(used) - 1
        return cls(ranks, remap[codes], int(used.sum()))


def spearman_reps(
    boot: ClusterBootstrap,
    prompt: np.ndarray,
    x: np.ndarray | Ranked,
    y: np.ndarray | Ranked,
    n_bins: int = 32,
) -> np.ndarray:
    """Spearman rho of x and y; row 0 exact, rows 1.. from rank bins (see below).

    The point estimate is the exact Spearman rho (Pearson r of average ranks, ties averaged). A
    resample re-ranks its own data, so its ranks differ from the sample's: each resample's rho is
    computed from per-prompt joint counts of ``n_bins`` x ``n_bins`` rank bins (exact when a
    variable has at most ``n_bins`` distinct values), with each bin's midrank recomputed from the
    resample's own counts. Binning shrinks |rho| by about 1 / n_bins**2 (0.1% at 32 bins); the
    replicates are shifted by the sample's (exact - binned) difference to remove even that.
    ``x`` and ``y`` may be given already ranked (:class:`Ranked`) to share the work.
    """
    rx = x if isinstance(x, Ranked) else Ranked.of(x, n_bins)
    ry = y if isinstance(y, Ranked) else Ranked.of(y, n_bins)
    if len(rx.ranks) < 2:
        return np.full(boot.n_boot + 1, np.nan)
    exact = _pearson(rx.ranks, ry.ranks)
    kx, ky = rx.n_bins, ry.n_bins
    cell = (prompt.astype(np.int64) * kx + rx.bins) * ky + ry.bins
    joint = np.bincount(cell, minlength=boot.n_prompts * kx * ky).reshape(boot.n_prompts, kx * ky)
    counts = boot.total(joint).reshape(-1, kx, ky)  # (B + 1, kx, ky)
    cx, cy = counts.sum(axis=2), counts.sum(axis=1)
    n = cx.sum(axis=1)
    mid_x = np.cumsum(cx, axis=1) - cx / 2  # a bin's midrank (up to a constant shift)
    mid_y = np.cumsum(cy, axis=1) - cy / 2
    mx, my = ratio((cx * mid_x).sum(1), n), ratio((cy * mid_y).sum(1), n)
    cov = ratio(np.einsum("bij,bi,bj->b", counts, mid_x, mid_y), n) - mx * my
    vx = ratio((cx * mid_x**2).sum(1), n) - mx**2
    vy = ratio((cy * mid_y**2).sum(1), n) - my**2
    rho = ratio(cov, np.sqrt(np.clip(vx * vy, 0, None)))
    rho = rho + (exact - rho[0])
    rho[0] = exact
    return rho


def eta_squared_reps(
    boot: ClusterBootstrap, prompt: np.ndarray, x: np.ndarray, levels: np.ndarray, n_levels: int
) -> np.ndarray:
    """Variance share of x explained by a factor: eta^2 = SS_between / SS_total (one-way ANOVA)."""
    x = np.asarray(x, dtype=float)
    if len(x) == 0:
        return np.full(boot.n_boot + 1, np.nan)
    x = x - x.mean()
    cell = prompt.astype(np.int64) * n_levels + levels
    size = boot.n_prompts * n_levels
    sums = boot.total(np.bincount(cell, weights=x, minlength=size).reshape(-1, n_levels))
    counts = boot.total(np.bincount(cell, minlength=size).reshape(-1, n_levels))
    squares = boot.total(np.bincount(prompt, weights=x * x, minlength=boot.n_prompts))
    s_all, n_all = sums.sum(axis=1), counts.sum(axis=1)
    grand = ratio(s_all**2, n_all)
    between = np.nansum(ratio(sums**2, counts), axis=1) - grand
    return ratio(between, squares - grand)


def eta_squared_prompt_reps(
    boot: ClusterBootstrap, prompt: np.ndarray, x: np.ndarray
) -> np.ndarray:
    """Variance share of x explained by the prompt (a resampled prompt counts as a new prompt)."""
    x = np.asarray(x, dtype=float)
    if len(x) == 0:
        return np.full(boot.n_boot + 1, np.nan)
    x = x - x.mean()
    per = _per_prompt(prompt, boot.n_prompts, x, None, x * x)
    between_p = np.nan_to_num(ratio(per[:, 0] ** 2, per[:, 1]))
    s, n, q, between = boot.total(np.column_stack([per, between_p])).T
    grand = ratio(s**2, n)
    return ratio(between - grand, q - grand)


def explained_share_reps(
    boot: ClusterBootstrap,
    prompt: np.ndarray,
    strata: np.ndarray,
    x: np.ndarray,
    levels: np.ndarray,
    n_levels: int,
) -> np.ndarray:
    """Noise-corrected share of the variance of x explained by a factor (an unbiased eta^2).

    eta^2 = sum_k w_k (m_k - m)^2 / Var(x), with w_k the share of observations at level k and m_k
    their mean, is biased upward: the level means are estimates, and their noise adds
    ``sum_k w_k Var(m_k - m)`` to the numerator. For a prompt-level factor (domain) that noise is
    the prompt-to-prompt variance, large with few prompts; for a within-prompt factor (depth) it
    is small. Comparing raw eta^2 of the two therefore favours the prompt-level factor even when
    neither has any effect. Here the noise term is estimated from the prompt-clustered (and
    domain-stratified) covariance of the level means and subtracted, so the share is about 0, of
    either sign, when the factor has no effect: ``sum_k w_k S_kk - w' S w`` with S the sandwich
    covariance of the level means, ``S = sum_h n_h / (n_h - 1) sum_{p in h} (u_p - ubar_h)
    (u_p - ubar_h)'`` and ``u_pk = (s_pk - m_k n_pk) / n_k``.

    ``prompt`` indexes the bootstrap's columns, ``strata`` gives each column's stratum (domain).
    """
    x = np.asarray(x, dtype=float)
    if len(x) == 0:
        return np.full(boot.n_boot + 1, np.nan)
    x = x - x.mean()
    P, K = boot.n_prompts, n_levels
    cell = prompt.astype(np.int64) * K + levels
    s = np.bincount(cell, weights=x, minlength=P * K).reshape(P, K)
    c = np.bincount(cell, minlength=P * K).reshape(P, K).astype(float)
    sq = np.bincount(prompt, weights=x * x, minlength=P)
    outer = np.concatenate(
        [np.einsum("pk,pj->pkj", a, b).reshape(P, K * K) for a, b in ((s, s), (s, c), (c, c))],
        axis=1,
    )
    S, C = boot.total(s), boot.total(c)  # (B + 1, K)
    total = C.sum(axis=1)
    m = np.nan_to_num(ratio(S, C))
    w = ratio(C, total[:, None])
    grand = (w * m).sum(axis=1)
    raw = (w * (m - grand[:, None]) ** 2).sum(axis=1)
    var_x = ratio(boot.total(sq), total) - grand**2

    cov = np.zeros((boot.n_boot + 1, K, K))
    for h in np.unique(strata):
        cols = np.flatnonzero(strata == h)
        n_h = len(cols)
        if n_h < 2:
            continue
        sub = boot.subset(cols)
        o = sub.total(outer[cols]).reshape(-1, 3, K, K)
        ss, sc, cc = o[:, 0], o[:, 1], o[:, 2]
        # sum_p w_p (s_pk - m_k c_pk)(s_pj - m_j c_pj)
        mk, mj = m[:, :, None], m[:, None, :]
        raw_uu = ss - mj * sc - mk * np.swapaxes(sc, 1, 2) + mk * mj * cc
        u_h = sub.total(s[cols]) - m * sub.total(c[cols])  # (B + 1, K): sum_p w_p (s - m c)
        centred = raw_uu - np.einsum("bk,bj->bkj", u_h, u_h) / n_h
        cov += n_h / (n_h - 1) * centred
    cov = cov / np.where(C > 0, C, 1.0)[:, :, None] / np.where(C > 0, C, 1.0)[:, None, :]
    noise = (w * np.diagonal(cov, axis1=1, axis2=2)).sum(axis=1) - np.einsum(
        "bk,bkj,bj->b", w, cov, w
    )
    return ratio(raw - noise, var_x)
