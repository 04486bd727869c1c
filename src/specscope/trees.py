"""Draft trees: the parents-array representation, its derived buffers, and growth policies.

A tree shape is a list of nodes in breadth-first order, each with a parent index (-1 for a root)
and a sibling rank (0 = the draft's top token under the parent's context). Everything else, the
tree attention mask, the position offsets and the root-to-leaf paths, is derived from the parents
array by pure functions (docs/guides/measure.md). Shapes can be written as Medusa/vLLM path tuples
``[(0,), (1,), (0, 0), ...]``, each tuple listing sibling ranks from the root.

The policies of this module give static shapes: the tokens change every step, the shape does not.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch

from .errors import SpecscopeError
from .limits import MAX_TREE_NODES, out_of_range
from .schemas import INPUT

Path = tuple[int, ...]


class TreeConfigError(SpecscopeError, ValueError):
    """A tree policy or parameter out of range; the message says what is allowed."""


def _rank(value) -> int:
    """A sibling rank: an integer, never a boolean (``True`` is not rank 1) or a float."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TreeConfigError(f"sibling ranks must be integers >= 0, got {value!r}")


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """[N, N] bool over a parents array whose parents come before their children (a static shape,
    or a dynamic tree as it grows): mask[i, j] is True iff j is i or an ancestor of i. Built as
    EAGLE-2 does, each node's row the union of its parent's row and itself. The one tree mask of
    specscope: drafting and verification read their attention masks off it."""
    mask = torch.eye(len(parents), dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    return mask


@dataclass(frozen=True)
class TreeShape:
    """A static draft-tree shape: parents array and sibling ranks, breadth-first order."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.parents) != len(self.ranks):
            raise TreeConfigError("parents and ranks must have the same length")
        if not self.parents:
            raise TreeConfigError("a tree needs at least one node")
        if len(self.parents) > MAX_TREE_NODES:
            raise TreeConfigError(f"a tree has 1..{MAX_TREE_NODES} nodes, got {len(self.parents)}")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise TreeConfigError(
                    f"node {i} has parent {p}: parents must come earlier (breadth-first order)"
                )
        depths = self.depths
        if any(depths[i] < depths[i - 1] for i in range(1, len(depths))):
            raise TreeConfigError("nodes must be in breadth-first order (depth non-decreasing)")
        # two nodes share a path iff they share a parent and a rank (no path tuples built here:
        # a chain's are quadratic in its depth)
        if len(set(zip(self.parents, self.ranks))) != len(self.parents):
            raise TreeConfigError("two nodes have the same path (same parent and sibling rank)")

    @classmethod
    def from_paths(cls, paths: list[Path] | tuple[Path, ...]) -> TreeShape:
        """Build a shape from path tuples; every prefix of a path must itself be a path."""
        paths = [tuple(_rank(r) for r in p) for p in paths]
        if any(len(p) == 0 or min(p) < 0 for p in paths):
            raise TreeConfigError("paths must be non-empty tuples of sibling ranks >= 0")
        ordered = sorted(set(paths), key=lambda p: (len(p), p))
        index = {p: i for i, p in enumerate(ordered)}
        parents = []
        for p in ordered:
            if len(p) > 1 and p[:-1] not in index:
                raise TreeConfigError(f"path {p} has no parent path {p[:-1]} in the tree")
            parents.append(index[p[:-1]] if len(p) > 1 else -1)
        return cls(tuple(parents), tuple(p[-1] for p in ordered))

    @classmethod
    def parse(cls, text: str) -> TreeShape:
        """Parse path tuples written as a Python literal, e.g. ``"[(0,), (1,), (0, 0)]"``."""
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError) as e:
            raise TreeConfigError(f"cannot parse tree paths {text!r}: {e}") from None
        if not isinstance(value, (list, tuple)) or not all(isinstance(p, tuple) for p in value):
            raise TreeConfigError(f"tree paths must be a list of tuples, got {text!r}")
        return cls.from_paths(list(value))

    def __len__(self) -> int:
        return len(self.parents)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """Depth of each node; roots have depth 1."""
        depths: list[int] = []
        for p in self.parents:
            depths.append(1 if p < 0 else depths[p] + 1)
        return tuple(depths)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @cached_property
    def paths(self) -> tuple[Path, ...]:
        """Each node's path of sibling ranks from the root."""
        paths: list[Path] = []
        for p, r in zip(self.parents, self.ranks):
            paths.append((r,) if p < 0 else paths[p] + (r,))
        return tuple(paths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in self.parents]
        for i, p in enumerate(self.parents):
            if p >= 0:
                kids[p].append(i)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def roots(self) -> tuple[int, ...]:
        return tuple(i for i, p in enumerate(self.parents) if p < 0)

    def children_of(self, node: int) -> tuple[int, ...]:
        """The children of ``node``; of -1, the roots."""
        return self.roots if node < 0 else self.children[node]

    @cached_property
    def leaves(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.children) if not k)

    def nodes_at_depth(self, depth: int) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.depths) if d == depth)

    def depth_counts(self) -> tuple[int, ...]:
        return tuple(self.depths.count(d) for d in range(1, self.max_depth + 1))

    @classmethod
    def chain(cls, depth: int) -> TreeShape:
        """One path of ``depth`` top-1 tokens: ``[(0,), (0, 0), ...]``."""
        return cls(tuple(range(-1, depth - 1)), (0,) * depth)

    @property
    def is_chain(self) -> bool:
        """One node per depth, each the draft's top-1: ``[(0,), (0, 0), ...]``."""
        return all(rank == 0 for rank in self.ranks) and len(self) == self.max_depth

    def ancestor_mask(self) -> torch.Tensor:
        """[N, N] bool: mask[i, j] is True iff j is i or an ancestor of i (i may attend to j)."""
        return ancestor_mask(self.parents)

    def position_offsets(self) -> torch.Tensor:
        """[N] long: depth - 1; a node's position id is prefix length + its offset."""
        return self.ancestor_mask().sum(-1) - 1

    def leaf_paths(self) -> list[list[int]]:
        """Node indices on each root-to-leaf path (the ``retrieve_indices`` of Medusa/EAGLE)."""
        out = []
        for leaf in self.leaves:
            path, i = [], leaf
            while i >= 0:
                path.append(i)
                i = self.parents[i]
            out.append(path[::-1])
        return out

    def to_paths_literal(self) -> str:
        return repr(list(self.paths))

    def check_fits(self, vocab: int) -> None:
        """Refuse a tree that asks for draft tokens of ranks a ``vocab``-token vocabulary lacks."""
        if max(self.ranks) >= vocab:
            raise TreeConfigError(
                f"the tree asks for the draft's token of rank {max(self.ranks)}, but "
                f"the vocabulary has {vocab} tokens (ranks 0 to {vocab - 1})"
            )


def bfs_shape(num_roots: int, branch: int, depth: int, max_nodes: int) -> TreeShape:
    """Roots, then top-``branch`` children of every node, breadth-first, cut at ``max_nodes``;
    built as a parents array node by node, so the cut bounds the work whatever ``branch`` is."""
    parents: list[int] = []
    ranks: list[int] = []
    level = [-1]  # the parents of the next level: the virtual root, then each level's nodes
    for d in range(1, depth + 1):
        below = []
        for parent in level:
            for rank in range(num_roots if d == 1 else branch):
                if len(parents) == max_nodes:
                    return TreeShape(tuple(parents), tuple(ranks))
                below.append(len(parents))
                parents.append(parent)
                ranks.append(rank)
        level = below
    return TreeShape(tuple(parents), tuple(ranks))


def _breadth_first(config: TreeConfig) -> TreeShape:
    return bfs_shape(config.num_roots, config.branch, config.depth, config.max_nodes)


def _chain(config: TreeConfig) -> TreeShape:
    return TreeShape.chain(config.depth)


def _static(config: TreeConfig) -> TreeShape:
    return TreeShape.parse(config.paths)


TREE_SHAPES = {
    "paper": _breadth_first,
    "paper-text": _breadth_first,
    "chain": _chain,
    "static": _static,
}  # tree policy -> its shape
POLICIES = tuple(TREE_SHAPES)

# The tree options each policy reads; an option given for a policy that ignores it is an error.
POLICY_OPTIONS = {
    "paper": ("top_k", "branch", "depth", "max_nodes"),
    "paper-text": ("top_k", "branch", "depth", "max_nodes"),
    "chain": ("depth",),
    "static": ("paths",),
}


def check_policy_options(policy: str, given: set[str] | frozenset[str]) -> None:
    """Raise unless every explicitly given tree option is one that ``policy`` reads."""
    unused = sorted(given - set(POLICY_OPTIONS.get(policy, given)))
    if unused:
        names = ", ".join("--" + u.replace("_", "-") for u in unused)
        allowed = ", ".join("--" + o.replace("_", "-") for o in POLICY_OPTIONS[policy])
        raise TreeConfigError(
            f"{names} do(es) not apply to tree policy {policy!r}, which reads {allowed}"
        )


@dataclass(frozen=True)
class TreeConfig:
    """How to grow the draft tree at every step.

    ``paper``: the released code's tree: ``min(top_k, branch)`` roots, ``branch`` children per node,
    ``depth`` levels, breadth-first cut at ``max_nodes``; defaults give 2/4/2 nodes per depth.
    ``paper-text``: the paper text's literal reading, ``top_k`` roots (3/5/0 under the 8-node cap).
    ``chain``: one path of ``depth`` draft-greedy tokens. ``static``: the tree given by ``paths``.
    """

    __pydantic_config__ = INPUT  # a config file's [tree] table (specscope.schemas)

    policy: str = "paper"
    top_k: int = 3
    branch: int = 2
    depth: int = 3
    max_nodes: int = 8
    paths: str | None = None

    def __post_init__(self) -> None:
        if self.policy == "dynamic":
            raise TreeConfigError(
                "tree policy 'dynamic' (EAGLE-2) is for decoding (specscope decode, bench): "
                "measurement drafts one static shape for every prompt of a batch, its children "
                f"the draft's top tokens; choose one of {', '.join(POLICIES)}"
            )
        if self.policy not in POLICIES:
            raise TreeConfigError(
                f"unknown tree policy {self.policy!r}; choose one of {', '.join(POLICIES)}"
            )
        if self.paths and self.policy != "static":
            raise TreeConfigError(
                f"paths apply only to policy 'static', not {self.policy!r}: "
                "add --policy static, or drop --paths"
            )
        if self.policy == "static":
            if not self.paths:
                raise TreeConfigError("policy 'static' needs paths, e.g. \"[(0,), (1,), (0, 0)]\"")
            return
        for name in ("depth", "top_k", "branch", "max_nodes"):
            reason = out_of_range(f"tree {name}", getattr(self, name), 1, MAX_TREE_NODES)
            if reason:
                raise TreeConfigError(reason)
        roots = self.num_roots
        if self.policy != "chain" and self.max_nodes < roots:
            raise TreeConfigError(
                f"max_nodes ({self.max_nodes}) is smaller than the number of roots ({roots})"
            )

    @property
    def num_roots(self) -> int:
        if self.policy == "paper":
            return min(self.top_k, self.branch)
        if self.policy == "paper-text":
            return self.top_k
        return 1

    def shape(self) -> TreeShape:
        return TREE_SHAPES[self.policy](self)


def check_depth_fits(depth: int, max_new_tokens: int, limit: int) -> None:
    """Refuse a tree of ``depth`` levels that cannot fit the models' ``limit`` positions with
    ``max_new_tokens`` new tokens and even one prompt token, naming the most that fit: a step
    feeds the context, then one level per depth."""
    if 1 + max_new_tokens + depth <= limit:
        return
    if max_new_tokens + 2 > limit:
        raise TreeConfigError(
            f"max_new_tokens {max_new_tokens} leaves no room in the models' {limit} positions "
            f"(one prompt token and one tree level need 2): max_new_tokens must be in "
            f"1..{limit - 2} for these models"
        )
    raise TreeConfigError(
        f"a tree of depth {depth} with max_new_tokens {max_new_tokens} needs "
        f"{1 + max_new_tokens + depth} positions with a one-token prompt, but the models allow "
        f"{limit}: the depth must be in 1..{limit - 1 - max_new_tokens} for these models and "
        "max_new_tokens (or lower --max-new-tokens)"
    )


@lru_cache(maxsize=256)
def bfs_prefix(shape: TreeShape, size: int) -> TreeShape:
    """The first ``size`` nodes of a breadth-first shape (itself a tree)."""
    return shape if size >= len(shape) else TreeShape(shape.parents[:size], shape.ranks[:size])


@lru_cache(maxsize=256)
def cut_depth(shape: TreeShape, depth: int) -> TreeShape:
    """The nodes of ``shape`` no deeper than ``depth``."""
    return bfs_prefix(shape, sum(1 for d in shape.depths if d <= depth))


@lru_cache(maxsize=64)
def contiguous_ranks(shape: TreeShape) -> TreeShape:
    """The same tree with each node's children ranked 0, 1, ... in their rank order."""
    ranks = list(shape.ranks)
    for kids in (shape.roots,) + shape.children:
        for new, n in enumerate(sorted(kids, key=lambda c: shape.ranks[c])):
            ranks[n] = new
    return TreeShape(shape.parents, tuple(ranks))


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2-style growth: at each depth the ``top_k`` nodes of highest cumulative draft
    log-probability get ``top_k`` children each; after ``depth`` levels the ``max_nodes`` best nodes
    of all drafted ones are kept (a child never scores above its parent, so the kept set is a tree).
    """

    max_nodes: int = 16
    depth: int = 5
    top_k: int = 4

    def __post_init__(self) -> None:
        for name in ("max_nodes", "depth", "top_k"):
            reason = out_of_range(f"dynamic tree {name}", getattr(self, name), 1, MAX_TREE_NODES)
            if reason:
                raise TreeConfigError(reason)

    @property
    def max_depth(self) -> int:
        return self.depth


Speculation = TreeShape | DynamicTree | None  # None: no speculation (plain decoding)
