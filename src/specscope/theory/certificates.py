"""Exact certificates: the smallest KL(p || q) at which a draft q can make a criterion fail, from
the pools of tokens a worst-case drafter would move mass to; accepted and covered masks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .criteria import (
    SUM_ATOL,
    Array,
    Criterion,
    Spec,
    Target,
    TreeCoverage,
    as_draft,
    as_probs,
    to_numpy,
)

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

    def rows(self, index: slice) -> Pool:
        return Pool(self.cert[index], self.k[index], self.c[index], self.r[index])


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
    cost = (_bregman(top[:, :kmax], c[:, None]) * (j[:kmax] < k[:, None])).sum(1) + _bregman(pr, c)
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
    wk = top[:, 1 : m + 1].flip(1)  # [B, m], weakest rival first
    cum = torch.cat([torch.zeros_like(p0)[:, None], wk.cumsum(1)], 1)  # [B, m+1]
    kk = torch.arange(1, m + 1, device=top.device)
    h = kk * wk - p0[:, None] - cum[:, :-1]
    k = (h < 0).sum(1)
    rows = torch.arange(b, device=top.device)
    c = (p0 + cum[rows, k]) / (k + 1)
    cost = _bregman(p0, c) + (_bregman(wk, c[:, None]) * (kk - 1 < k[:, None])).sum(1)
    return Pool(cost, k, c, torch.full_like(k, m))


TOP_WIDTH = 16  # the masses sorted up front; most rows' pools and accepted sets lie within them


def _sorted_prefix(p: torch.Tensor, width: int) -> torch.Tensor:
    """[B, V] -> [B, W]: the W largest masses per row, descending."""
    width = max(1, min(width, p.shape[1]))
    return torch.topk(p, width, dim=1, sorted=True).values


def certificate_pools(d: Target, specs: Sequence[Spec]) -> tuple[dict[str, Pool], torch.Tensor]:
    """Certificates of several specs from one shared top-k of p; also returns that top-k [B, W]."""
    p = d.p
    vocab = p.shape[1]
    if p.shape[0] == 0:
        empty = torch.zeros(0, dtype=p.dtype, device=p.device)
        idx = torch.zeros(0, dtype=torch.long, device=p.device)
        return {s.name: Pool(empty, idx, empty, idx) for s in specs}, p[:, :2]
    tree_width = max([s.m + 1 for s in specs if isinstance(s, TreeCoverage)] + [2])
    top = _sorted_prefix(p, max(tree_width, TOP_WIDTH))
    counts = {s.name: s.n_accepted(d, top) for s in specs if isinstance(s, Criterion)}
    width = max(
        [int(n[n < vocab].max()) + 1 for n in counts.values() if (n < vocab).any()] + [tree_width]
    )
    if width > top.shape[1]:
        top = _sorted_prefix(p, width)
    pools = {
        s.name: (
            _pool_level_set(top, counts[s.name], vocab)
            if isinstance(s, Criterion)
            else _pool_tree(top, s.m, vocab)
        )
        for s in specs
    }
    return pools, top


def certificate(p: Array, spec: Spec, atol: float = SUM_ATOL) -> np.ndarray:
    """Exact certificate C(p) = min KL(p || q) over drafters q that the criterion rejects.

    For a ``TreeCoverage(m)`` spec: min KL(p || q) over q that leave x0 outside their top m.
    p: [V] or [B, V]; returns a scalar array or [B] float64 (+inf when no q can be rejected).
    """
    pt, single = as_probs(p, "p", atol)
    return to_numpy(certificate_pools(Target(pt), [spec])[0][spec.name].cert, single)


def worst_case_drafter(
    p: Array, spec: Spec, slack: float = 0.0, atol: float = SUM_ATOL
) -> np.ndarray:
    """The drafter q* that attains C(p): KL(p || q*) = C(p) and q*'s top token is rejected.

    With slack = 0, q* has ties (the rejected token y shares the top mass with the pooled tokens;
    for trees, x0 ties with its pooled rivals), rejected under the ties-against-acceptance rule.
    With slack > 0 the ties are broken the rejecting way (y gets a (1 + slack) factor, or x0 a
    (1 - slack) factor, then renormalised), so plain argmax / top-k reject too, and
    KL(p || q) -> C(p) as slack -> 0. Rows where nothing can be rejected are NaN.
    """
    if not 0.0 <= slack < 1.0:
        raise ValueError(f"slack: must be in [0, 1), got {slack}")
    pt, single = as_probs(p, "p", atol)
    pool = certificate_pools(Target(pt), [spec])[0][spec.name]
    order = torch.sort(pt, dim=1, descending=True, stable=True).indices  # [B, V]
    q = pt.clone()
    for i in range(pt.shape[0]):  # loop over contexts only; pools are a few positions each
        k, c = int(pool.k[i]), float(pool.c[i])
        if not math.isfinite(float(pool.cert[i])):
            q[i] = math.nan
            continue
        if isinstance(spec, TreeCoverage):
            special = order[i, 0]
            pooled = order[i, spec.m - k + 1 : spec.m + 1]
            factor = 1.0 - slack
            stronger = order[i, 1 : spec.m - k + 1]  # keep q = p >= c; p == c must tie exactly
            q[i, stronger] = q[i, stronger].clamp_min(c)
        else:
            special = order[i, int(pool.r[i])]
            pooled = order[i, :k]
            factor = 1.0 + slack
        q[i, pooled] = c
        q[i, special] = c * factor
        q[i] /= q[i].sum()
    return to_numpy(q, single)


def accepted_mask(p: Array, spec: Criterion, atol: float = SUM_ATOL) -> np.ndarray:
    """[V] or [B, V] bool: which tokens the criterion accepts (an upper level set of p)."""
    pt, single = as_probs(p, "p", atol)
    d = Target(pt)
    order = torch.sort(pt, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(pt.shape[1], device=pt.device).expand_as(order)
    )
    return to_numpy(rank < spec.n_accepted(d)[:, None], single)


def accepts(p: Array, q: Array, spec: Criterion, atol: float = SUM_ATOL) -> np.ndarray:
    """Does ``spec`` accept the draft's token argmax q (the first maximiser)? [B] or scalar bool."""
    pt, single = as_probs(p, "p", atol)
    qt = as_draft(q, pt, atol)
    return to_numpy(spec.accepts(Target(pt), qt.argmax(-1)), single)


def tree_covered(p: Array, q: Array, m: int, atol: float = SUM_ATOL) -> np.ndarray:
    """Is x0 = argmax p among q's top m candidates (ties against coverage)? [B] or scalar bool."""
    pt, single = as_probs(p, "p", atol)
    qt = as_draft(q, pt, atol)
    return to_numpy(TreeCoverage(m).covered(Target(pt), qt), single)
