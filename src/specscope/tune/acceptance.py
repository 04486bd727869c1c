"""The acceptance vector ``a[d, r]``: the probability that the sibling-rank-``r`` child at depth
``d`` is the one greedy verification accepts, given that its parent was accepted, estimated from a
run's ``nodes.parquet`` (``greedy_accept`` among nodes whose parent lies on the step's accepted
path). Under greedy verification at most one child of a node is accepted, so a node's chance to
be accepted is the product of ``a`` along its path, and a tree's expected tokens per step is
``tau = 1 + sum over nodes of that product`` (the bonus token counted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import SpecscopeError
from ..records import ALL_DOMAINS, tree_paths
from ..trees import TreeShape


class PolicyError(SpecscopeError, ValueError):
    """A policy, policy file or tuning input that cannot be used; the message says why."""


# --- acceptance vector ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptanceVector:
    """Conditional greedy acceptance by depth (row d - 1) and sibling rank (column r).

    Cells observed fewer than ``min_count`` times are set to 0: a tree never relies on them.
    """

    rates: np.ndarray  # [D, R] float
    counts: np.ndarray  # [D, R] int: eligible nodes observed (parent on the accepted path)

    @property
    def max_depth(self) -> int:
        return self.rates.shape[0]

    @property
    def max_rank(self) -> int:
        return self.rates.shape[1]

    def rate(self, depth: int, rank: int) -> float:
        if depth > self.max_depth or rank >= self.max_rank:
            return 0.0
        return float(self.rates[depth - 1, rank])

    def node_probs(self, shape: TreeShape) -> list[float]:
        """Each node's probability of lying on the accepted path."""
        probs: list[float] = []
        for parent, depth, rank in zip(shape.parents, shape.depths, shape.ranks):
            above = 1.0 if parent < 0 else probs[parent]
            probs.append(above * self.rate(depth, rank))
        return probs

    def expected_tau(self, shape: TreeShape | None) -> float:
        """Expected tokens per step (accepted nodes + the bonus token); 1 for no speculation."""
        return 1.0 + (sum(self.node_probs(shape)) if shape is not None else 0.0)

    def extrapolated(self, max_depth: int) -> AcceptanceVector:
        """Depths past the deepest well-measured one (a row with any positive rate) take that
        row's rates, up to ``max_depth``: an assumption (flat acceptance in depth) for trees
        deeper than the measurement tree; counts of the filled rows stay 0."""
        filled = np.flatnonzero(self.rates.sum(axis=1) > 0)
        if not len(filled) or max_depth <= filled[-1] + 1:
            return self
        last = filled[-1]
        rates = np.vstack(
            [
                self.rates[: last + 1],
                np.repeat(self.rates[last : last + 1], max_depth - last - 1, axis=0),
            ]
        )
        counts = np.zeros(rates.shape, dtype=int)
        counts[: last + 1] = self.counts[: last + 1]
        return AcceptanceVector(rates, counts)

    def to_dict(self) -> dict:
        return {"rates": np.round(self.rates, 6).tolist(), "counts": self.counts.tolist()}

    @classmethod
    def from_rates(cls, rates) -> AcceptanceVector:
        rates = np.atleast_2d(np.asarray(rates, dtype=float))
        if rates.size == 0 or np.any((rates < 0) | (rates > 1)):
            raise PolicyError("acceptance rates must be a non-empty [depth, rank] array in [0, 1]")
        return cls(rates, np.zeros(rates.shape, dtype=int))


def eligible_nodes(nodes: pd.DataFrame) -> np.ndarray:
    """Per node of ``nodes`` (sorted by prompt, step and node id): a root, or its parent lies on
    its step's accepted path (:func:`~specscope.records.tree_paths`)."""
    node_id = nodes["node_id"].to_numpy(np.int64)
    parent = nodes["parent_id"].to_numpy(np.int64)
    parent_row = np.where(
        parent < 0, -1, np.arange(len(nodes)) - node_id + parent
    )  # steps are contiguous
    return tree_paths(
        nodes["greedy_accept"].to_numpy(bool),
        nodes["depth"].to_numpy(np.int64),
        nodes["sibling_rank"].to_numpy(np.int64),
        parent < 0,
        parent_row,
    ).eligible


def acceptance_vectors(nodes: pd.DataFrame, min_count: int = 20) -> dict[str, AcceptanceVector]:
    """The acceptance vector of every domain in ``nodes``, and of all of them pooled (``all``)."""
    need = {
        "prompt_id",
        "step",
        "node_id",
        "parent_id",
        "depth",
        "sibling_rank",
        "greedy_accept",
        "domain",
    }
    if missing := need - set(nodes.columns):
        raise PolicyError(f"node records lack the columns {sorted(missing)}")
    if nodes.empty:
        raise PolicyError("no node records to estimate acceptance from")
    nodes = nodes.sort_values(["prompt_id", "step", "node_id"], kind="stable")
    eligible = nodes[eligible_nodes(nodes)]
    shape = (int(nodes["depth"].max()), int(nodes["sibling_rank"].max()) + 1)
    out = {}
    groups = [(d, eligible[eligible["domain"] == d]) for d in sorted(nodes["domain"].unique())]
    for name, part in groups + [(ALL_DOMAINS, eligible)]:
        counts = np.zeros(shape, dtype=int)
        hits = np.zeros(shape)
        d = part["depth"].to_numpy(np.int64) - 1
        r = part["sibling_rank"].to_numpy(np.int64)
        np.add.at(counts, (d, r), 1)
        np.add.at(hits, (d, r), part["greedy_accept"].to_numpy(float))
        rates = np.where(counts >= max(min_count, 1), hits / np.maximum(counts, 1), 0.0)
        out[name] = AcceptanceVector(rates, counts)
    return out


def chain_acceptance(steps: pd.DataFrame, min_count: int = 20) -> dict[str, AcceptanceVector]:
    """The acceptance vector of a chain-only drafter (n-gram lookup: chains that vary in length,
    none without a match) from its step records: depth d's rate is ``P(accepted_len >= d |
    accepted_len >= d - 1)`` over output positions, a node the drafter did not propose counting
    as rejected. A chain of k then has ``expected_tau = 1 + sum over d <= k of P(accepted_len >=
    d)``, the position mean of ``min(accepted_len, k) + 1``: what extrapolates to chains deeper
    than measured. Tokens per step of a measured chain come from the replay
    (:mod:`specscope.analysis.replay`), which the position mean overstates (runs of acceptance,
    the output's end). Depths reached by fewer than ``min_count`` positions get rate 0."""
    need = {"domain", "accepted_len", "tree_size"}
    if missing := need - set(steps.columns):
        raise PolicyError(f"step records lack the columns {sorted(missing)}")
    if steps.empty:
        raise PolicyError("no step records to estimate acceptance from")
    depth = int(steps["tree_size"].max())
    if depth < 1:
        raise PolicyError("the drafter proposed nothing in any step: no chain to tune")
    out = {}
    groups = [(d, steps[steps["domain"] == d]) for d in sorted(steps["domain"].unique())]
    for name, part in groups + [(ALL_DOMAINS, steps)]:
        accepted = np.minimum(part["accepted_len"].to_numpy(np.int64), depth)
        reached = np.bincount(accepted, minlength=depth + 1)[::-1].cumsum()[::-1]  # >= d
        eligible, hits = reached[:-1], reached[1:]  # depth d: >= d - 1 accepted, >= d accepted
        rates = np.where(eligible >= max(min_count, 1), hits / np.maximum(eligible, 1), 0.0)
        out[name] = AcceptanceVector(rates[:, None], eligible[:, None])
    return out
