"""Acceptance criteria and their exact KL certificates (docs/theory.md).

Let p be the target distribution at a context, x0 = argmax p (the first index among maxima) and q
the draft distribution; the draft proposes argmax q. Every criterion here accepts a token x iff
x lies in an upper level set of p, so its rejection region R(p) is a lower level set. The
certificate of a criterion is

    C(p) = min { KL(p || q) : some maximiser of q lies in R(p) },

so that KL(p || q) < C(p) implies that every maximiser of q, and so argmax q, is accepted,
whatever q is. Ties are resolved against acceptance everywhere: a drafter with several maximisers
counts as proposing the worst of them (this makes the minimum attained), strict greedy accepts
only the first maximiser of p, and top-m keeps exactly m tokens (the first m in a stable
descending sort of p). KL is KL(target || draft) in nats.

The minimum has a closed form by pooling: the best rejected token is the most likely one, y = x_(r)
(sorted position r); the minimiser q* sets y and the top tokens whose mass exceeds the pooled mean
to that common mean and leaves q* = p elsewhere. The tree certificate C_m (is x0 among the drafter's
top-m candidates?) pools x0 with the weakest of its m strongest rivals; C_m <= log(m + 1).

Everything is vectorised over a batch of contexts: p is [B, V] (or [V]); the work is O(V) per row
plus a top-k over the few sorted positions the pooling needs. Inputs may be numpy arrays or torch
tensors (any device); arithmetic is float64.

The ``certify`` section at the end turns recorded runs into the report of ``specscope certify``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from specscope.errors import SpecscopeError

if TYPE_CHECKING:
    pass

Array = np.ndarray | torch.Tensor | Sequence[float] | Sequence[Sequence[float]]

SUM_ATOL = 1e-3  # how far a row of p may sum from 1 before it is rejected (then renormalised)


# --- inputs -------------------------------------------------------------------------------------

def _as_probs(x: Array, name: str, atol: float = SUM_ATOL) -> tuple[torch.Tensor, bool]:
    """Validate a probability vector or batch; return it as [B, V] float64 rows summing to 1.

    The bool says whether the input was a single vector ([V]), so results can be squeezed back.
    """
    t = x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x, np.float64))
    if t.device.type not in ("cpu", "cuda"):
        t = t.cpu()
    t = t.to(torch.float64)
    if t.ndim not in (1, 2):
        raise ValueError(f"{name}: expected shape [V] or [B, V], got {tuple(t.shape)}")
    if t.shape[-1] == 0:
        raise ValueError(f"{name}: empty vocabulary (last dimension is 0)")
    single = t.ndim == 1
    t = t.reshape(-1, t.shape[-1])
    if t.numel() and not bool(((t >= 0) & (t < math.inf)).all()):  # one pass; NaN fails too
        if torch.isnan(t).any():
            raise ValueError(f"{name}: contains NaN")
        if torch.isinf(t).any():
            raise ValueError(f"{name}: contains infinite entries")
        raise ValueError(f"{name}: has negative entries (min {t.min().item():.3g})")
    sums = t.sum(-1)
    bad = (sums - 1).abs() > atol
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{name}: each row must sum to 1 (within {atol}); row {i} sums to "
                         f"{sums[i].item():.6g}")
    return t / sums[:, None], single


def _out(x: torch.Tensor, single: bool) -> np.ndarray:
    a = x.cpu().numpy()
    return a[0] if single else a


class Target:
    """A validated batch of target distributions p [B, V] (float64) and the statistics that the
    criteria share, each computed at most once."""

    def __init__(self, p: torch.Tensor):
        self.p = p

    @cached_property
    def _top1(self) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = self.p.max(-1)  # first maximiser
        return values, indices

    @property
    def p0(self) -> torch.Tensor:  # [B]
        return self._top1[0]

    @property
    def x0(self) -> torch.Tensor:  # [B] long
        return self._top1[1]

    @cached_property
    def neg_entropy(self) -> torch.Tensor:  # [B]: sum p log p (exact; Medusa uses log(p + 1e-5))
        return torch.xlogy(self.p, self.p).sum(-1)

    def kl(self, q: torch.Tensor) -> torch.Tensor:  # [B]: KL(p || q), +inf where q = 0 < p
        return self.neg_entropy - torch.xlogy(self.p, q).sum(-1)


def kl_divergence(p: Array, q: Array, atol: float = SUM_ATOL) -> np.ndarray:
    """KL(p || q) in nats per row ([B] or a scalar array); +inf where q = 0 < p."""
    pt, single = _as_probs(p, "p", atol)
    qt = _as_draft(q, pt, atol)
    return _out(Target(pt).kl(qt), single)


def _as_draft(q: Array, p: torch.Tensor, atol: float) -> torch.Tensor:
    qt, _ = _as_probs(q, "q", atol)
    if qt.shape != p.shape:
        raise ValueError(f"q: shape {tuple(qt.shape)} differs from p's {tuple(p.shape)}")
    return qt.to(p.device)


# --- criteria -----------------------------------------------------------------------------------

class Criterion:
    """An acceptance criterion whose accepted set is an upper level set of p (ties: see module doc).

    Subclasses give ``n_accepted`` (how many tokens are accepted; they are the first ones in a
    stable descending sort of p), ``accepts`` (the test for given tokens) and ``margin_bound``.
    """

    name: ClassVar[str]

    def n_accepted(self, d: Target) -> torch.Tensor:  # -> [B] long
        raise NotImplementedError

    def accepts(self, d: Target, tokens: torch.Tensor) -> torch.Tensor:  # [B] -> [B] bool
        raise NotImplementedError

    def margin_bound(self, margin: np.ndarray) -> np.ndarray:
        """A lower bound on C(p) that depends only on the margin p0 - p1 (and the parameter)."""
        raise NotImplementedError


class _Threshold(Criterion):
    """Accept x iff p(x) >= threshold(p) (or > when ``strict``)."""

    strict: ClassVar[bool] = False

    def threshold(self, d: Target) -> torch.Tensor:  # [B]
        raise NotImplementedError

    def _test(self, mass: torch.Tensor, thr: torch.Tensor) -> torch.Tensor:
        return mass > thr if self.strict else mass >= thr

    def n_accepted(self, d: Target) -> torch.Tensor:
        return self._test(d.p, self.threshold(d)[:, None]).sum(1)

    def accepts(self, d: Target, tokens: torch.Tensor) -> torch.Tensor:
        return self._test(d.p.gather(1, tokens[:, None])[:, 0], self.threshold(d))


@dataclass(frozen=True)
class Greedy(Criterion):
    """Strict greedy: accept only x0 = argmax p (a token tied with x0 is rejected)."""

    name: ClassVar[str] = "greedy"

    def n_accepted(self, d: Target) -> torch.Tensor:
        return torch.ones_like(d.x0)

    def accepts(self, d: Target, tokens: torch.Tensor) -> torch.Tensor:
        return tokens == d.x0

    def margin_bound(self, margin: np.ndarray) -> np.ndarray:
        return _phi(margin)


@dataclass(frozen=True)
class Additive(_Threshold):
    """Additive relaxation: accept x iff p(x) >= p(x0) - t, with t in [0, 1]."""

    t: float = 0.1
    name: ClassVar[str] = "additive"

    def __post_init__(self) -> None:
        if not 0.0 <= self.t <= 1.0:
            raise ValueError(f"t: the additive slack must be in [0, 1], got {self.t}")

    def threshold(self, d: Target) -> torch.Tensor:
        return d.p0 - self.t

    def margin_bound(self, margin: np.ndarray) -> np.ndarray:
        d, t = np.asarray(margin, np.float64), self.t
        # Delta > t: x1 itself is rejected. Delta <= t: x1 is accepted, so p0 + p_y <= 1 - p1;
        # no token can be rejected when t >= (1 + Delta) / 2.
        s = (2.0 + 2.0 * d - t) / 3.0
        inside = np.where(t < (1.0 + d) / 2.0, perspective(t, s), np.inf)
        return np.where(d > t, _phi(d), inside)


@dataclass(frozen=True)
class Multiplicative(_Threshold):
    """Multiplicative relaxation: accept x iff p(x) >= a * p(x0), with a in (0, 1]."""

    a: float = 0.5
    name: ClassVar[str] = "multiplicative"

    def __post_init__(self) -> None:
        if not 0.0 < self.a <= 1.0:
            raise ValueError(f"a: the multiplicative factor must be in (0, 1], got {self.a}")

    def threshold(self, d: Target) -> torch.Tensor:
        return self.a * d.p0

    def margin_bound(self, margin: np.ndarray) -> np.ndarray:
        d = np.asarray(margin, np.float64)
        r = (1.0 - self.a) / (1.0 + self.a)
        s = np.minimum(1.0, d / r) if r > 0 else np.ones_like(d)
        return perspective(d, s)


@dataclass(frozen=True)
class TopM(Criterion):
    """Top-m relaxation: accept the m most likely tokens of p (exactly m; ties by token index)."""

    m: int = 2
    name: ClassVar[str] = "top_m"

    def __post_init__(self) -> None:
        if isinstance(self.m, bool) or int(self.m) != self.m or self.m < 1:
            raise ValueError(f"m: top-m needs an integer m >= 1, got {self.m}")

    def n_accepted(self, d: Target) -> torch.Tensor:
        return torch.full_like(d.x0, min(self.m, d.p.shape[1]))

    def accepts(self, d: Target, tokens: torch.Tensor) -> torch.Tensor:
        p = d.p
        pt = p.gather(1, tokens[:, None])
        idx = torch.arange(p.shape[1], device=p.device)
        rank = ((p > pt) | ((p == pt) & (idx < tokens[:, None]))).sum(1)  # stable descending
        return rank < self.m

    def margin_bound(self, margin: np.ndarray) -> np.ndarray:
        d = np.asarray(margin, np.float64)
        return perspective(d, (2.0 + (self.m - 1) * d) / (self.m + 1))


@dataclass(frozen=True)
class Entropy(_Threshold):
    """Medusa's typical acceptance: accept x iff p(x) > min(eps, delta * exp(-H(p))).

    Medusa's defaults are posterior_threshold = eps = 0.09 and posterior_alpha = delta = 0.3.
    """

    eps: float = 0.09
    delta: float = 0.3
    name: ClassVar[str] = "entropy"
    strict: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ValueError(f"eps: the entropy criterion's threshold must be > 0, got {self.eps}")
        if not (self.delta > 0 and math.isfinite(self.delta)):
            raise ValueError(f"delta: the entropy criterion's factor must be > 0, got {self.delta}")

    def threshold(self, d: Target) -> torch.Tensor:
        return torch.clamp(self.delta * torch.exp(d.neg_entropy), max=self.eps)

    def margin_bound(self, margin: np.ndarray) -> np.ndarray:
        d = np.asarray(margin, np.float64)
        s = np.minimum(1.0, d + 2.0 * self.eps)
        if self.delta < 1:
            s = np.minimum(s, d * (1.0 + self.delta) / (1.0 - self.delta))
            return perspective(d, s)
        return np.where(d > self.eps, perspective(d, s), 0.0)  # else x0 itself may be rejected


@dataclass(frozen=True)
class TreeCoverage:
    """Greedy tree coverage: x0 is covered iff fewer than m other tokens have q >= q(x0)."""

    m: int

    def __post_init__(self) -> None:
        if isinstance(self.m, bool) or int(self.m) != self.m or self.m < 1:
            raise ValueError(f"m: tree coverage needs an integer m >= 1, got {self.m}")

    @property
    def name(self) -> str:
        return f"tree_m{self.m}"

    def covered(self, d: Target, q: torch.Tensor) -> torch.Tensor:  # q [B, V] -> [B] bool
        return _rivals_at_or_above_x0(d, q) < self.m

    def margin_bound(self, margin: np.ndarray) -> np.ndarray:
        """L_m(Delta): the exact certificate of ((1 + m Delta), (1 - Delta) x m) / (m + 1)."""
        d, m = np.asarray(margin, np.float64), self.m
        a = (1.0 + m * d) / (m + 1)
        return _xlogy(a, (m + 1) * a) + _xlogy(1.0 - a, 1.0 - d)


def _rivals_at_or_above_x0(d: Target, q: torch.Tensor) -> torch.Tensor:
    """[B]: how many tokens other than x0 have q >= q(x0)."""
    return (q >= q.gather(1, d.x0[:, None])).sum(1) - 1


CRITERIA: dict[str, type[Criterion]] = {
    c.name: c for c in (Greedy, Additive, Multiplicative, TopM, Entropy)}
Spec = Criterion | TreeCoverage


# --- margin-only bounds: helpers ----------------------------------------------------------------

def _xlogy(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x, y = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(y, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, x * np.log(np.where(x > 0, y, 1.0)), 0.0)


def _phi(x: np.ndarray) -> np.ndarray:
    """phi(x) = KL(Bern((1 + x) / 2) || Bern(1/2)): greedy certificate of ((1+x)/2, (1-x)/2)."""
    x = np.clip(np.asarray(x, np.float64), 0.0, 1.0)
    return 0.5 * (_xlogy(1.0 + x, 1.0 + x) + _xlogy(1.0 - x, 1.0 - x))


def perspective(gap: np.ndarray | float, s: np.ndarray | float) -> np.ndarray:
    """s * phi(gap / s): the two-token pooling cost of masses (s + gap) / 2 and (s - gap) / 2."""
    gap, s = np.broadcast_arrays(np.asarray(gap, np.float64), np.asarray(s, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(s > 0, gap / np.where(s > 0, s, 1.0), 0.0)
    return np.where(gap > 0, s * _phi(ratio), 0.0)


def margin_bound(margin: np.ndarray | float, spec: Spec) -> np.ndarray:
    """Margin-only lower bound on the certificate of ``spec``; margin = p0 - p1 in [0, 1]."""
    d = np.asarray(margin, np.float64)
    if np.isnan(d).any() or (d < 0).any() or (d > 1).any():
        raise ValueError("margin: must lie in [0, 1] (the target's top-1 minus top-2 probability)")
    return spec.margin_bound(d)


# --- exact certificates -------------------------------------------------------------------------

def _bregman(p: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """p log(p / c) - p + c >= 0 without cancellation (c > 0, p >= 0): log1p near p = c."""
    ratio = p / c
    u = (p - c) / c
    near = (1 + u) * torch.log1p(u.clamp(min=-0.5)) - u
    far = torch.xlogy(ratio, ratio) - ratio + 1
    return c * torch.where(ratio < 0.5, far, near)


@dataclass(frozen=True)
class Pool:
    """The minimiser of a certificate problem, per row: q* = c on the pooled sorted positions."""

    cert: torch.Tensor  # [B] float64, +inf where nothing can be rejected (uncovered)
    k: torch.Tensor  # [B] long: pooled positions besides the special one
    c: torch.Tensor  # [B] float64: the pooled mass
    r: torch.Tensor  # [B] long: sorted position of the rejected token y (level sets), else m


def _pool_level_set(top: torch.Tensor, r: torch.Tensor, vocab: int) -> Pool:
    """Pool the most likely rejected token y (sorted position r) with the top tokens above c.

    top: [B, W] p sorted descending, W > r wherever r < vocab. Pool = positions {0..k-1} and r,
    where k counts j < r with p_j > (p_0 + ... + p_{j-1} + p_r) / (j + 1) (a prefix, as that
    test is monotone in j); c is the mean over the pool.
    """
    b = top.shape[0]
    has = r < vocab
    width = int(r[has].max()) + 1 if has.any() else 1
    top = top[:, :width]
    rows = torch.arange(b, device=top.device)
    r = torch.where(has, r, torch.zeros_like(r))  # rows with nothing rejected: any valid index
    pr = top[rows, r]  # [B]
    excl = top.cumsum(1) - top  # [B, W]: sum of positions < j
    j = torch.arange(width, device=top.device)
    g = (j + 1) * top - excl - pr[:, None]
    k = ((j < r[:, None]) & (g > 0)).sum(1)
    c = (excl[rows, k] + pr) / (k + 1)
    kmax = int(k.max()) if b else 0
    cost = (_bregman(top[:, :kmax], c[:, None]) * (j[:kmax] < k[:, None])).sum(1) + \
        _bregman(pr, c)
    cost = torch.where(has, cost, torch.full_like(cost, math.inf))
    return Pool(cost, k, c, r)


def _pool_tree(top: torch.Tensor, m: int, vocab: int) -> Pool:
    """Pool x0 with the weakest of its m strongest rivals (sorted positions 1..m).

    Walking up from the weakest rival p_m, rival i joins while p_i < mean of the pool so far (that
    test is monotone too); the stronger rivals keep q = p >= c.
    """
    b = top.shape[0]
    if vocab - 1 < m:  # fewer than m rivals: x0 is always covered
        inf = torch.full((b,), math.inf, dtype=top.dtype, device=top.device)
        zero = torch.zeros(b, dtype=torch.long, device=top.device)
        return Pool(inf, zero, top[:, 0], torch.full_like(zero, m))
    p0 = top[:, 0]
    wk = top[:, 1:m + 1].flip(1)  # [B, m], weakest rival first
    cum = torch.cat([torch.zeros_like(p0)[:, None], wk.cumsum(1)], 1)  # [B, m+1]
    kk = torch.arange(1, m + 1, device=top.device)
    h = kk * wk - p0[:, None] - cum[:, :-1]
    k = (h < 0).sum(1)
    rows = torch.arange(b, device=top.device)
    c = (p0 + cum[rows, k]) / (k + 1)
    cost = _bregman(p0, c) + (_bregman(wk, c[:, None]) * (kk - 1 < k[:, None])).sum(1)
    return Pool(cost, k, c, torch.full_like(k, m))


def _sorted_prefix(p: torch.Tensor, width: int) -> torch.Tensor:
    """[B, V] -> [B, W]: the W largest masses per row, descending."""
    width = max(1, min(width, p.shape[1]))
    return torch.topk(p, width, dim=1, sorted=True).values


def _pools(d: Target, specs: Sequence[Spec]) -> tuple[dict[str, Pool], torch.Tensor]:
    """Certificates of several specs from one shared top-k of p; also returns that top-k [B, W]."""
    p = d.p
    vocab = p.shape[1]
    if p.shape[0] == 0:
        empty = torch.zeros(0, dtype=p.dtype, device=p.device)
        idx = torch.zeros(0, dtype=torch.long, device=p.device)
        return {s.name: Pool(empty, idx, empty, idx) for s in specs}, p[:, :2]
    counts = {s.name: s.n_accepted(d) for s in specs if isinstance(s, Criterion)}
    width = max([int(n[n < vocab].max()) + 1 for n in counts.values() if (n < vocab).any()]
                + [s.m + 1 for s in specs if isinstance(s, TreeCoverage)] + [2])
    top = _sorted_prefix(p, width)
    pools = {s.name: (_pool_level_set(top, counts[s.name], vocab) if isinstance(s, Criterion)
                      else _pool_tree(top, s.m, vocab)) for s in specs}
    return pools, top


def certificate(p: Array, spec: Spec, atol: float = SUM_ATOL) -> np.ndarray:
    """Exact certificate C(p) = min KL(p || q) over drafters q that the criterion rejects.

    For a ``TreeCoverage(m)`` spec: min KL(p || q) over q that leave x0 outside their top m.
    p: [V] or [B, V]; returns a scalar array or [B] float64 (+inf when no q can be rejected).
    """
    pt, single = _as_probs(p, "p", atol)
    return _out(_pools(Target(pt), [spec])[0][spec.name].cert, single)


def worst_case_drafter(p: Array, spec: Spec, slack: float = 0.0,
                       atol: float = SUM_ATOL) -> np.ndarray:
    """The drafter q* that attains C(p): KL(p || q*) = C(p) and q*'s top token is rejected.

    With slack = 0, q* has ties (the rejected token y shares the top mass with the pooled tokens;
    for trees, x0 ties with its pooled rivals), rejected under the ties-against-acceptance rule.
    With slack > 0 the ties are broken the rejecting way (y gets a (1 + slack) factor, or x0 a
    (1 - slack) factor, then renormalised), so plain argmax / top-k reject too, and
    KL(p || q) -> C(p) as slack -> 0. Rows where nothing can be rejected are NaN.
    """
    if not 0.0 <= slack < 1.0:
        raise ValueError(f"slack: must be in [0, 1), got {slack}")
    pt, single = _as_probs(p, "p", atol)
    pool = _pools(Target(pt), [spec])[0][spec.name]
    order = torch.sort(pt, dim=1, descending=True, stable=True).indices  # [B, V]
    q = pt.clone()
    for i in range(pt.shape[0]):  # loop over contexts only; pools are a few positions each
        k, c = int(pool.k[i]), float(pool.c[i])
        if not math.isfinite(float(pool.cert[i])):
            q[i] = math.nan
            continue
        if isinstance(spec, TreeCoverage):
            special = order[i, 0]
            pooled = order[i, spec.m - k + 1:spec.m + 1]
            factor = 1.0 - slack
        else:
            special = order[i, int(pool.r[i])]
            pooled = order[i, :k]
            factor = 1.0 + slack
        q[i, pooled] = c
        q[i, special] = c * factor
        q[i] /= q[i].sum()
    return _out(q, single)


def accepted_mask(p: Array, spec: Criterion, atol: float = SUM_ATOL) -> np.ndarray:
    """[V] or [B, V] bool: which tokens the criterion accepts (an upper level set of p)."""
    pt, single = _as_probs(p, "p", atol)
    d = Target(pt)
    order = torch.sort(pt, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(pt.shape[1], device=pt.device).expand_as(order))
    return _out(rank < spec.n_accepted(d)[:, None], single)


def accepts(p: Array, q: Array, spec: Criterion, atol: float = SUM_ATOL) -> np.ndarray:
    """Does ``spec`` accept the draft's token argmax q (the first maximiser)? [B] or scalar bool."""
    pt, single = _as_probs(p, "p", atol)
    qt = _as_draft(q, pt, atol)
    return _out(spec.accepts(Target(pt), qt.argmax(-1)), single)


def tree_covered(p: Array, q: Array, m: int, atol: float = SUM_ATOL) -> np.ndarray:
    """Is x0 = argmax p among q's top m candidates (ties against coverage)? [B] or scalar bool."""
    pt, single = _as_probs(p, "p", atol)
    qt = _as_draft(q, pt, atol)
    return _out(TreeCoverage(m).covered(Target(pt), qt), single)


# --- run columns (called by the engine) ---------------------------------------------------------

class CriteriaError(SpecscopeError, ValueError):
    """Criteria parameters that cannot be used; the message names the field."""


@dataclass(frozen=True)
class CriteriaConfig:
    """Which criteria a run records, with their parameters (None switches a criterion off).

    Entropy defaults follow Medusa: threshold min(eps, delta * exp(-H)) with posterior_threshold
    eps = 0.09 and posterior_alpha delta = 0.3.
    """

    greedy: bool = True
    additive_t: float | None = 0.1
    multiplicative_a: float | None = 0.5
    top_m: int | None = 2
    entropy_eps: float | None = 0.09
    entropy_delta: float | None = 0.3
    tree_m: tuple[int, ...] = (1, 2, 4, 8)
    atol: float = SUM_ATOL

    def __post_init__(self) -> None:
        object.__setattr__(self, "tree_m", tuple(int(m) for m in self.tree_m))
        if (self.entropy_eps is None) != (self.entropy_delta is None):
            raise CriteriaError("entropy_eps, entropy_delta: give both or neither")
        _ = self.criteria, self.trees  # constructing them validates the parameters

    @property
    def criteria(self) -> tuple[Criterion, ...]:
        out: list[Criterion] = [Greedy()] if self.greedy else []
        if self.additive_t is not None:
            out.append(Additive(self.additive_t))
        if self.multiplicative_a is not None:
            out.append(Multiplicative(self.multiplicative_a))
        if self.top_m is not None:
            out.append(TopM(self.top_m))
        if self.entropy_eps is not None and self.entropy_delta is not None:
            out.append(Entropy(self.entropy_eps, self.entropy_delta))
        return tuple(out)

    @property
    def trees(self) -> tuple[TreeCoverage, ...]:
        return tuple(TreeCoverage(m) for m in self.tree_m)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tree_m"] = list(self.tree_m)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CriteriaConfig:
        from specscope.validate import check_fields

        d = dict(d)
        check_fields(cls, d, CriteriaError, "criteria.")
        if "tree_m" in d:
            d["tree_m"] = tuple(d["tree_m"])
        return cls(**d)


def node_certificate_columns(p: torch.Tensor, config: CriteriaConfig) -> dict[str, np.ndarray]:
    """Per-context certificates: ``cert_<criterion>`` and ``cert_tree_m<m>``, each [B] float64.

    p: [B, V] target probabilities at B node contexts (or [V]).
    """
    pt, _ = _as_probs(p, "p", config.atol)
    pools, _ = _pools(Target(pt), config.criteria + config.trees)
    return {f"cert_{name}": pool.cert.cpu().numpy() for name, pool in pools.items()}


def step_criteria_columns(p: torch.Tensor, q: torch.Tensor,
                          config: CriteriaConfig) -> dict[str, np.ndarray]:
    """Per-step acceptance and certification of the draft's top token at the root context.

    p, q: [V] or [B, V] target and draft probabilities. Returns [B] arrays:
    ``kl_target_draft`` and ``target_margin`` (float64); for each criterion ``cert_<c>`` (float64),
    ``accept_<c>`` (the criterion accepts argmax q) and ``certified_<c>`` (KL(p || q) < C(p));
    for each m in ``config.tree_m``: ``cert_tree_m<m>``, ``tree_covered_m<m>`` (x0 is among q's
    top m, ties against coverage) and ``tree_certified_m<m>`` (KL < C_m).
    """
    pt, _ = _as_probs(p, "p", config.atol)
    qt = _as_draft(q, pt, config.atol)
    d = Target(pt)
    kl = d.kl(qt)
    pools, top = _pools(d, config.criteria + config.trees)
    margin = top[:, 0] - top[:, 1] if top.shape[1] > 1 else top[:, 0]
    cols: dict[str, torch.Tensor] = {"kl_target_draft": kl, "target_margin": margin}
    drafted = qt.argmax(-1)
    for crit in config.criteria:
        cols[f"cert_{crit.name}"] = pools[crit.name].cert
        cols[f"accept_{crit.name}"] = crit.accepts(d, drafted)
        cols[f"certified_{crit.name}"] = kl < pools[crit.name].cert
    rivals = _rivals_at_or_above_x0(d, qt)
    for tree in config.trees:
        cols[f"cert_{tree.name}"] = pools[tree.name].cert
        cols[f"tree_covered_m{tree.m}"] = rivals < tree.m
        cols[f"tree_certified_m{tree.m}"] = kl < pools[tree.name].cert
    return {k: v.cpu().numpy() for k, v in cols.items()}


def criteria_config_from_manifest(manifest: dict) -> CriteriaConfig:
    """The criteria a run recorded: ``manifest["criteria"]`` or ``manifest["config"]["criteria"]``
    (a ``CriteriaConfig.to_dict()``); the defaults when the manifest has neither."""
    raw = manifest.get("criteria")
    if raw is None and isinstance(manifest.get("config"), dict):
        raw = manifest["config"].get("criteria")
    return CriteriaConfig.from_dict(raw) if isinstance(raw, dict) else CriteriaConfig()
