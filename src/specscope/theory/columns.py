"""The certificate columns a run records: which criteria and trees (:class:`CriteriaConfig`),
per node at its context and per step at the root, and the criteria a manifest recorded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from ..errors import SpecscopeError
from ..schemas import INPUT, parse
from .certificates import Pool, certificate_pools
from .criteria import (
    SUM_ATOL,
    Additive,
    Criterion,
    Entropy,
    Greedy,
    Multiplicative,
    Target,
    TopM,
    TreeCoverage,
    as_draft,
    as_probs,
    rivals_at_or_above_x0,
)

# --- run columns (called by the engine) ---------------------------------------------------------


class CriteriaError(SpecscopeError, ValueError):
    """Criteria parameters that cannot be used; the message names the field."""


@dataclass(frozen=True)
class CriteriaConfig:
    """Which criteria a run records, with their parameters (None switches a criterion off).

    Entropy defaults follow Medusa: threshold min(eps, delta * exp(-H)) with posterior_threshold
    eps = 0.09 and posterior_alpha delta = 0.3.
    """

    __pydantic_config__ = INPUT  # a config file's [criteria] table (specscope.schemas)

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


def node_certificate_columns(p: torch.Tensor, config: CriteriaConfig) -> dict[str, np.ndarray]:
    """Per-context certificates: ``cert_<criterion>`` and ``cert_tree_m<m>``, each [B] float64.

    p: [B, V] target probabilities at B node contexts (or [V]).
    """
    pt, _ = as_probs(p, "p", config.atol)
    pools, _ = certificate_pools(Target(pt), config.criteria + config.trees)
    return {f"cert_{name}": pool.cert.cpu().numpy() for name, pool in pools.items()}


def step_criteria_columns(
    p: torch.Tensor, q: torch.Tensor, config: CriteriaConfig
) -> dict[str, np.ndarray]:
    """Per-step acceptance and certification of the draft's top token at the root context.

    p, q: [V] or [B, V] target and draft probabilities. Returns [B] arrays:
    ``kl_target_draft`` and ``target_margin`` (float64); for each criterion ``cert_<c>`` (float64),
    ``accept_<c>`` (the criterion accepts argmax q) and ``certified_<c>`` (KL(p || q) < C(p));
    for each m in ``config.tree_m``: ``cert_tree_m<m>``, ``tree_covered_m<m>`` (x0 is among q's
    top m, ties against coverage) and ``tree_certified_m<m>`` (KL < C_m).
    """
    pt, _ = as_probs(p, "p", config.atol)
    d = Target(pt)
    pools, top = certificate_pools(d, config.criteria + config.trees)
    return _draft_columns(d, as_draft(q, pt, config.atol), pools, top, config)


def certificate_columns(
    p: torch.Tensor, q_root: torch.Tensor, config: CriteriaConfig
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """:func:`node_certificate_columns` at C contexts p [C, V] (row 0 the root) and
    :func:`step_criteria_columns` at the root with the draft's q_root [V] ([1] arrays), from one
    validation of p and one set of pools: the step's certificates are the root nodes' exactly."""
    pt, _ = as_probs(p, "p", config.atol)
    d = Target(pt)
    pools, top = certificate_pools(d, config.criteria + config.trees)
    nodes = {f"cert_{name}": pool.cert.cpu().numpy() for name, pool in pools.items()}
    root = d.rows(slice(0, 1))
    step = _draft_columns(
        root,
        as_draft(q_root, root.p, config.atol),
        {name: pool.rows(slice(0, 1)) for name, pool in pools.items()},
        top[:1],
        config,
    )
    return nodes, step


def _draft_columns(
    d: Target, qt: torch.Tensor, pools: dict[str, Pool], top: torch.Tensor, config: CriteriaConfig
) -> dict[str, np.ndarray]:
    kl = d.kl(qt)
    margin = top[:, 0] - top[:, 1] if top.shape[1] > 1 else top[:, 0]
    cols: dict[str, torch.Tensor] = {"kl_target_draft": kl, "target_margin": margin}
    drafted = qt.argmax(-1)
    for crit in config.criteria:
        cols[f"cert_{crit.name}"] = pools[crit.name].cert
        cols[f"accept_{crit.name}"] = crit.accepts(d, drafted)
        cols[f"certified_{crit.name}"] = kl < pools[crit.name].cert
    rivals = rivals_at_or_above_x0(d, qt)
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
    if not isinstance(raw, dict):
        return CriteriaConfig()
    return parse(CriteriaConfig, raw, "the run's criteria", CriteriaError)
