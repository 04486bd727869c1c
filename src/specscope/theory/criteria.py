"""Acceptance criteria of a target distribution p: greedy, additive and multiplicative margins,
top-m, entropy, tree coverage; their margin-only bounds. Pure functions of probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np
import torch

Array = np.ndarray | torch.Tensor | Sequence[float] | Sequence[Sequence[float]]

SUM_ATOL = 1e-3  # how far a row of p may sum from 1 before it is rejected (then renormalised)


# --- inputs -------------------------------------------------------------------------------------


def as_probs(x: Array, name: str, atol: float = SUM_ATOL) -> tuple[torch.Tensor, bool]:
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
        raise ValueError(
            f"{name}: each row must sum to 1 (within {atol}); row {i} sums to {sums[i].item():.6g}"
        )
    return t / sums[:, None], single


def to_numpy(x: torch.Tensor, single: bool) -> np.ndarray:
    a = x.cpu().numpy()
    return a[0] if single else a


class Target:
    """A validated batch of target distributions p [B, V] (float64) and the statistics that the
    criteria share, each computed at most once."""

    def __init__(self, p: torch.Tensor):
        self.p = p

    def rows(self, index: slice) -> Target:
        """The distributions of some rows, keeping the statistics already computed (sliced)."""
        sub = Target(self.p[index])
        for name, value in self.__dict__.items():
            if name != "p":
                sub.__dict__[name] = (
                    tuple(v[index] for v in value) if isinstance(value, tuple) else value[index]
                )
        return sub

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
    pt, single = as_probs(p, "p", atol)
    qt = as_draft(q, pt, atol)
    return to_numpy(Target(pt).kl(qt), single)


def as_draft(q: Array, p: torch.Tensor, atol: float) -> torch.Tensor:
    qt, _ = as_probs(q, "q", atol)
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

    def n_accepted(self, d: Target, top: torch.Tensor | None = None) -> torch.Tensor:  # [B] long
        """How many tokens are accepted; ``top`` [B, W], each row's W largest masses in
        descending order, may spare a pass over the vocabulary."""
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

    def n_accepted(self, d: Target, top: torch.Tensor | None = None) -> torch.Tensor:
        threshold = self.threshold(d)[:, None]
        if top is None:
            return self._test(d.p, threshold).sum(1)
        # the test is monotone in the mass: unless every top mass passes, the rest of the row fails
        n = self._test(top, threshold).sum(1)
        rest = (n == top.shape[1]) & (top.shape[1] < d.p.shape[1])
        if rest.any():
            n[rest] = self._test(d.p[rest], threshold[rest]).sum(1)
        return n

    def accepts(self, d: Target, tokens: torch.Tensor) -> torch.Tensor:
        return self._test(d.p.gather(1, tokens[:, None])[:, 0], self.threshold(d))


@dataclass(frozen=True)
class Greedy(Criterion):
    """Strict greedy: accept only x0 = argmax p (a token tied with x0 is rejected)."""

    name: ClassVar[str] = "greedy"

    def n_accepted(self, d: Target, top: torch.Tensor | None = None) -> torch.Tensor:
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

    def n_accepted(self, d: Target, top: torch.Tensor | None = None) -> torch.Tensor:
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
        return rivals_at_or_above_x0(d, q) < self.m

    def margin_bound(self, margin: np.ndarray) -> np.ndarray:
        """L_m(Delta): the exact certificate of ((1 + m Delta), (1 - Delta) x m) / (m + 1)."""
        d, m = np.asarray(margin, np.float64), self.m
        a = (1.0 + m * d) / (m + 1)
        return _xlogy(a, (m + 1) * a) + _xlogy(1.0 - a, 1.0 - d)


def rivals_at_or_above_x0(d: Target, q: torch.Tensor) -> torch.Tensor:
    """[B]: how many tokens other than x0 have q >= q(x0)."""
    return (q >= q.gather(1, d.x0[:, None])).sum(1) - 1


CRITERIA: dict[str, type[Criterion]] = {
    c.name: c for c in (Greedy, Additive, Multiplicative, TopM, Entropy)
}
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
