"""The Sequoia-style dynamic programme: the tree of at most N nodes and depth D that maximises
expected tokens per step under an acceptance vector.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trees import TreeShape
from .acceptance import AcceptanceVector, PolicyError

# --- the optimal tree (Sequoia-style dynamic programme) -----------------------------------------


@dataclass(frozen=True)
class OptimalTree:
    shape: TreeShape | None  # None when no node has a positive acceptance rate
    expected_tau: float


def forest_tables(acc: AcceptanceVector, max_nodes: int, max_depth: int, max_rank: int):
    """best[d][n]: max expected accepted nodes of a forest of <= n nodes whose roots sit at depth
    d (children of one accepted node); take[d][r][n]: nodes given to rank r's subtree (0: none)."""
    N = max_nodes
    best = [np.zeros(N + 1) for _ in range(max_depth + 2)]
    take = [None] * (max_depth + 2)
    for d in range(max_depth, 0, -1):
        # Knapsack over sibling ranks, from the last rank back to rank 0.
        g = np.zeros((max_rank + 1, N + 1))
        choice = np.zeros((max_rank, N + 1), dtype=int)
        for r in range(max_rank - 1, -1, -1):
            a = acc.rate(d, r)
            subtree = a * (1.0 + best[d + 1][:N])  # value of rank r with m = 1..N nodes
            g[r] = g[r + 1]
            if a <= 0:
                continue
            for n in range(1, N + 1):
                m = np.arange(1, n + 1)
                values = subtree[m - 1] + g[r + 1][n - m]
                k = int(np.argmax(values))
                if values[k] > g[r][n] + 1e-12:
                    g[r][n], choice[r][n] = values[k], m[k]
        best[d], take[d] = g[0], choice
    return best, take


def build_paths(
    take, d: int, n: int, prefix: tuple[int, ...], max_rank: int, out: list[tuple[int, ...]]
) -> None:
    for r in range(max_rank):
        m = int(take[d][r][n])
        if m:
            path = prefix + (r,)
            out.append(path)
            if m > 1:
                build_paths(take, d + 1, m - 1, path, max_rank, out)
            n -= m


def optimal_tree(
    acc: AcceptanceVector, max_nodes: int, max_depth: int, max_rank: int | None = None
) -> OptimalTree:
    """The tree of at most ``max_nodes`` nodes and depth ``max_depth`` maximising expected tau.

    A node's subtree value is ``a(d, r) * (1 + best forest below it)``; siblings share the node
    budget (a knapsack over ranks), and depths are solved bottom-up. Exact for the model of
    :class:`AcceptanceVector` (acceptance depends on depth and sibling rank only).
    """
    if max_nodes < 1 or max_depth < 1:
        raise PolicyError(
            f"optimal trees need max_nodes >= 1 and depth >= 1, got {max_nodes} and {max_depth}"
        )
    max_rank = min(max_rank or acc.max_rank, acc.max_rank)
    best, take = forest_tables(acc, max_nodes, max_depth, max_rank)
    paths: list[tuple[int, ...]] = []
    build_paths(take, 1, max_nodes, (), max_rank, paths)
    shape = TreeShape.from_paths(paths) if paths else None
    return OptimalTree(shape, acc.expected_tau(shape))
