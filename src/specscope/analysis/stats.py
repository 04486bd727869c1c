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

Intervals are percentile intervals of the B replicates. An interval is left undefined (shown as
"—") when the point estimate is undefined, when fewer than two prompts stand behind it (a cluster
bootstrap of one cluster has no spread to measure), or when more than half of the replicates leave
the statistic undefined (a cell that most resamples do not reach).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

EMPTY = "—"  # how an undefined value is shown, everywhere


@dataclass(frozen=True)
class Estimate:
    """A figure with its confidence interval; NaN marks what is undefined, never a number."""

    value: float
    lo: float = math.nan
    hi: float = math.nan
    n: int = 0  # observations behind the figure (nodes or steps)
    prompts: int = 0  # prompts behind the figure (the bootstrap's clusters)

    @property
    def defined(self) -> bool:
        return math.isfinite(self.value)

    @property
    def has_interval(self) -> bool:
        return self.defined and math.isfinite(self.lo) and math.isfinite(self.hi)

    def contains(self, x: float) -> bool:
        return self.has_interval and self.lo <= x <= self.hi

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


def nan_estimate(n: int = 0, prompts: int = 0) -> Estimate:
    return Estimate(math.nan, n=n, prompts=prompts)


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
    def draw(cls, strata: np.ndarray, n_boot: int, seed: int,
             confidence: float = 0.95) -> ClusterBootstrap:
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
                    len(cols), np.full(len(cols), 1.0 / len(cols)), size=n_boot)
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

    def estimates(self, reps: np.ndarray, n: np.ndarray | int = 0,
                  prompts: np.ndarray | int = 0) -> np.ndarray:
        """Turn ``(B + 1, *shape)`` replicates into an object array of :class:`Estimate`."""
        reps = np.asarray(reps, dtype=float)
        shape = reps.shape[1:]
        n = np.broadcast_to(np.asarray(n), shape)
        prompts = np.broadcast_to(np.asarray(prompts), shape)
        value = reps[0]
        lo = np.full(shape, np.nan)
        hi = np.full(shape, np.nan)
        # Stratified by domain, resamples never vary where every domain has a single prompt:
        # then there is no interval to give.
        if self.n_boot and np.any(self.weights[1:] != 1):
            boot = reps[1:]
            finite = np.isfinite(boot).mean(axis=0)
            ok = np.isfinite(value) & (finite >= 0.5) & (prompts >= 2)
            if ok.any():
                tail = (1 - self.confidence) / 2
                q = np.nanquantile(boot[:, ok], [tail, 1 - tail], axis=0)
                lo[ok], hi[ok] = q[0], q[1]
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            out[idx] = Estimate(float(value[idx]), float(lo[idx]), float(hi[idx]),
                                int(n[idx]), int(prompts[idx]))
        return out

    def estimate(self, reps: np.ndarray, n: int = 0, prompts: int = 0) -> Estimate:
        """One :class:`Estimate` from ``(B + 1,)`` replicates."""
        return self.estimates(np.asarray(reps, dtype=float)[:, None], n, prompts)[0]


# --- estimators: each returns (B + 1,) replicates, row 0 the point estimate -------------------------

def _per_prompt(prompt: np.ndarray, n_prompts: int, *values: np.ndarray) -> np.ndarray:
    """(P, k) per-prompt sums of each of ``values`` (a value of None counts rows)."""
    return np.stack([np.bincount(prompt, weights=v, minlength=n_prompts) for v in values], axis=1)


def pearson_reps(boot: ClusterBootstrap, prompt: np.ndarray, x: np.ndarray,
                 y: np.ndarray) -> np.ndarray:
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


def spearman_reps(boot: ClusterBootstrap, prompt: np.ndarray, x: np.ndarray | Ranked,
                  y: np.ndarray | Ranked, n_bins: int = 32) -> np.ndarray:
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


def eta_squared_reps(boot: ClusterBootstrap, prompt: np.ndarray, x: np.ndarray,
                     levels: np.ndarray, n_levels: int) -> np.ndarray:
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


def eta_squared_prompt_reps(boot: ClusterBootstrap, prompt: np.ndarray,
                            x: np.ndarray) -> np.ndarray:
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
