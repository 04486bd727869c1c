"""Speculation policies: which draft tree to use, chosen from measured acceptance and cost.

- :class:`AcceptanceVector`: ``a[d, r]``, the probability that the sibling-rank-``r`` child at
  depth ``d`` is the one greedy verification accepts, given that its parent was accepted
  (estimated from a run's ``nodes.parquet``: ``greedy_accept`` among nodes whose parent lies on the
  step's accepted path). Under greedy verification at most one child of a node is accepted, so a
  node's chance to be accepted is the product of ``a`` along its path, and the expected tokens per
  step of a tree is ``tau = 1 + sum over nodes of that product`` (the bonus token counted).
- :func:`optimal_tree`: the Sequoia-style dynamic programme: the tree of at most N nodes and depth D
  that maximises expected tau under an acceptance vector.
- :class:`DynamicTree`: EAGLE-2-style growth parameters (the growth itself runs in the decoder).
- :class:`CostModel`: draft and verify time measured on this hardware; the predicted speed-up of a
  tree is ``tau / step time``, relative to plain decoding's time per token.
- :func:`tune`: per domain, the tree (or no speculation) with the best predicted speed-up.
- :class:`PolicyFile`: that choice as a JSON (or TOML) file, validated on load.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .trees import TreeConfig, TreeConfigError, TreeShape

from .errors import SpecscopeError

DECODE_POLICIES = ("chain", "static", "paper", "paper-text", "dynamic", "optimal", "none")
POLICY_FORMAT = "specscope-policy/1"
ALL_DOMAINS = "all"  # the pooled acceptance vector: the uniform tree's input


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
        rates = np.vstack([self.rates[:last + 1], np.repeat(self.rates[last:last + 1],
                                                            max_depth - last - 1, axis=0)])
        counts = np.zeros(rates.shape, dtype=int)
        counts[:last + 1] = self.counts[:last + 1]
        return AcceptanceVector(rates, counts)

    def to_dict(self) -> dict:
        return {"rates": np.round(self.rates, 6).tolist(), "counts": self.counts.tolist()}

    @classmethod
    def from_rates(cls, rates) -> AcceptanceVector:
        rates = np.atleast_2d(np.asarray(rates, dtype=float))
        if rates.size == 0 or np.any((rates < 0) | (rates > 1)):
            raise PolicyError("acceptance rates must be a non-empty [depth, rank] array in [0, 1]")
        return cls(rates, np.zeros(rates.shape, dtype=int))


def on_accepted_path(nodes: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per node: lies on its step's accepted path; its parent does (roots: True). Sorted input."""
    accept = nodes["greedy_accept"].to_numpy(bool)
    node_id = nodes["node_id"].to_numpy(np.int64)
    parent = nodes["parent_id"].to_numpy(np.int64)
    depth = nodes["depth"].to_numpy(np.int64)
    parent_row = np.arange(len(nodes)) - node_id + parent  # rows of one step are contiguous
    on_path = accept.copy()
    for d in range(2, int(depth.max(initial=1)) + 1):
        rows = np.flatnonzero(depth == d)
        on_path[rows] &= on_path[parent_row[rows]]
    parent_ok = np.where(parent < 0, True, on_path[np.clip(parent_row, 0, None)])
    return on_path, parent_ok


def acceptance_vectors(nodes: pd.DataFrame, min_count: int = 20) -> dict[str, AcceptanceVector]:
    """The acceptance vector of every domain in ``nodes``, and of all of them pooled (``all``)."""
    need = {"prompt_id", "step", "node_id", "parent_id", "depth", "sibling_rank",
            "greedy_accept", "domain"}
    if missing := need - set(nodes.columns):
        raise PolicyError(f"node records lack the columns {sorted(missing)}")
    if nodes.empty:
        raise PolicyError("no node records to estimate acceptance from")
    nodes = nodes.sort_values(["prompt_id", "step", "node_id"], kind="stable")
    _, parent_ok = on_accepted_path(nodes)
    eligible = nodes[parent_ok]
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


# --- the optimal tree (Sequoia-style dynamic programme) -----------------------------------------


@dataclass(frozen=True)
class OptimalTree:
    shape: TreeShape | None  # None when no node has a positive acceptance rate
    expected_tau: float


def _forest_tables(acc: AcceptanceVector, max_nodes: int, max_depth: int, max_rank: int):
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


def _build_paths(take, d: int, n: int, prefix: tuple[int, ...], max_rank: int,
                 out: list[tuple[int, ...]]) -> None:
    for r in range(max_rank):
        m = int(take[d][r][n])
        if m:
            path = prefix + (r,)
            out.append(path)
            if m > 1:
                _build_paths(take, d + 1, m - 1, path, max_rank, out)
            n -= m


def optimal_tree(acc: AcceptanceVector, max_nodes: int, max_depth: int,
                 max_rank: int | None = None) -> OptimalTree:
    """The tree of at most ``max_nodes`` nodes and depth ``max_depth`` maximising expected tau.

    A node's subtree value is ``a(d, r) * (1 + best forest below it)``; siblings share the node
    budget (a knapsack over ranks), and depths are solved bottom-up. Exact for the model of
    :class:`AcceptanceVector` (acceptance depends on depth and sibling rank only).
    """
    if max_nodes < 1 or max_depth < 1:
        raise PolicyError(f"optimal trees need max_nodes >= 1 and depth >= 1, got "
                          f"{max_nodes} and {max_depth}")
    max_rank = min(max_rank or acc.max_rank, acc.max_rank)
    best, take = _forest_tables(acc, max_nodes, max_depth, max_rank)
    paths: list[tuple[int, ...]] = []
    _build_paths(take, 1, max_nodes, (), max_rank, paths)
    shape = TreeShape.from_paths(paths) if paths else None
    return OptimalTree(shape, acc.expected_tau(shape))


# --- dynamic trees -------------------------------------------------------------------------------


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
            if getattr(self, name) < 1:
                raise PolicyError(f"dynamic tree {name} must be >= 1, got {getattr(self, name)}")

    @property
    def max_depth(self) -> int:
        return self.depth


Speculation = TreeShape | DynamicTree | None  # None: no speculation (plain decoding)


def short_name(shape: TreeShape | None) -> str:
    """``none``, ``chain(4)`` or nodes per depth, e.g. ``tree 2/4/2``."""
    if shape is None:
        return "none"
    if all(c == 1 for c in shape.depth_counts()):
        return f"chain({len(shape)})"
    return "tree " + "/".join(str(c) for c in shape.depth_counts())


def describe(spec: Speculation) -> str:
    if spec is None:
        return "none"
    if isinstance(spec, DynamicTree):
        return f"dynamic(N={spec.max_nodes}, D={spec.depth}, k={spec.top_k})"
    return f"{len(spec)} nodes, depth {spec.max_depth}: {spec.to_paths_literal()}"


def make_speculation(policy: str, *, depth: int | None = None, top_k: int | None = None,
                     branch: int | None = None, max_nodes: int | None = None,
                     paths: str | None = None,
                     acceptance: AcceptanceVector | None = None) -> Speculation:
    """A policy name and its parameters (None: the policy's default) as a tree shape, a
    dynamic-growth config, or None (no speculation)."""
    if policy not in DECODE_POLICIES:
        raise PolicyError(f"unknown policy {policy!r}; choose one of {', '.join(DECODE_POLICIES)}")
    given = {k: v for k, v in dict(depth=depth, top_k=top_k, branch=branch,
                                   max_nodes=max_nodes).items() if v is not None}
    if policy == "none":
        return None
    if policy == "dynamic":
        given.pop("branch", None)
        return DynamicTree(**given)
    if policy == "optimal":
        if acceptance is None:
            raise PolicyError("policy 'optimal' needs an acceptance vector (a run directory)")
        tree = optimal_tree(acceptance, given.get("max_nodes", 16), given.get("depth", 6))
        if tree.shape is None:
            raise PolicyError("the acceptance vector accepts nothing: no tree helps")
        return tree.shape
    if policy == "chain":
        given.setdefault("depth", 4)
    try:
        return TreeConfig(policy=policy, paths=paths, **given).shape()
    except TreeConfigError as e:
        raise PolicyError(str(e)) from None


# --- cost model ----------------------------------------------------------------------------------


def _interp(table: tuple[tuple[int, float], ...], x: float) -> float:
    xs, ys = zip(*table)
    if x > xs[-1]:  # extrapolate linearly from the last two points
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
        return ys[-1] + slope * (x - xs[-1])
    return float(np.interp(x, xs, ys))


@dataclass(frozen=True)
class CostModel:
    """Seconds per forward pass, measured on this hardware, by tokens fed over a prefix cache.

    A step of a static tree costs one draft call for the pending tokens (about ``root_tokens``),
    one per deeper level (as many tokens as the level's nodes that have children), one target call
    for the last token plus every node, and ``overhead_s`` of bookkeeping. Plain decoding costs
    ``plain_token_s`` per token.
    """

    draft_s: tuple[tuple[int, float], ...]  # (tokens fed, seconds), increasing tokens
    target_s: tuple[tuple[int, float], ...]
    plain_token_s: float
    overhead_s: float = 0.0
    root_tokens: int = 2
    context_len: int = 0
    hardware: str = ""

    def draft_time(self, shape: TreeShape) -> float:
        calls = [self.root_tokens] + [
            sum(1 for n in shape.nodes_at_depth(d) if shape.children[n])
            for d in range(1, shape.max_depth)]
        return sum(_interp(self.draft_s, k) for k in calls if k)

    def verify_time(self, shape: TreeShape) -> float:
        return _interp(self.target_s, 1 + len(shape))

    def step_time(self, shape: TreeShape) -> float:
        return self.draft_time(shape) + self.verify_time(shape) + self.overhead_s

    def predicted_speedup(self, shape: TreeShape | None, acc: AcceptanceVector) -> float:
        """Tokens per second with ``shape`` over tokens per second of plain decoding."""
        if shape is None:
            return 1.0
        return acc.expected_tau(shape) / self.step_time(shape) * self.plain_token_s

    def to_dict(self) -> dict:
        return {"draft_s": [list(x) for x in self.draft_s], "target_s": [list(x) for x in self.target_s],
                "plain_token_s": self.plain_token_s, "overhead_s": self.overhead_s,
                "root_tokens": self.root_tokens, "context_len": self.context_len,
                "hardware": self.hardware}

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
        try:
            return cls(draft_s=tuple((int(k), float(s)) for k, s in data["draft_s"]),
                       target_s=tuple((int(k), float(s)) for k, s in data["target_s"]),
                       plain_token_s=float(data["plain_token_s"]),
                       overhead_s=float(data.get("overhead_s", 0.0)),
                       root_tokens=int(data.get("root_tokens", 2)),
                       context_len=int(data.get("context_len", 0)),
                       hardware=str(data.get("hardware", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise PolicyError(f"malformed cost model: {e}") from None

    def save(self, path: str | Path) -> Path:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise PolicyError(f"cannot read cost model {path}: {e}") from None


# --- tuning ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """The tree chosen for one domain, with its predicted figures."""

    shape: TreeShape | None
    expected_tau: float
    predicted_speedup: float
    step_time_s: float

    def to_dict(self) -> dict:
        return {"tree": self.shape.to_paths_literal() if self.shape else "none",
                "nodes": len(self.shape) if self.shape else 0,
                "expected_tau": round(self.expected_tau, 4),
                "predicted_speedup": round(self.predicted_speedup, 4),
                "step_time_s": round(self.step_time_s, 6)}


def best_tree(acc: AcceptanceVector, costs: CostModel, max_nodes: int = 32, max_depth: int = 8,
              max_rank: int | None = None, min_speedup: float = 1.0) -> Choice:
    """Over every node budget and depth limit, the optimal tree of best predicted speed-up; no
    speculation (``shape=None``) unless some tree beats ``min_speedup``."""
    best = Choice(None, 1.0, 1.0, costs.plain_token_s)
    depth_limit = min(max_depth, acc.max_depth)
    for depth in range(1, depth_limit + 1):
        rank = min(max_rank or acc.max_rank, acc.max_rank)
        tables, take = _forest_tables(acc, max_nodes, depth, rank)
        seen: set[tuple] = set()
        for n in range(1, max_nodes + 1):
            paths: list[tuple[int, ...]] = []
            _build_paths(take, 1, n, (), rank, paths)
            if not paths or tuple(paths) in seen:
                continue
            seen.add(tuple(paths))
            shape = TreeShape.from_paths(paths)
            speedup = costs.predicted_speedup(shape, acc)
            if speedup > max(best.predicted_speedup, min_speedup):
                best = Choice(shape, acc.expected_tau(shape), speedup, costs.step_time(shape))
    return best


@dataclass(frozen=True)
class TuneConfig:
    max_nodes: int = 32
    max_depth: int = 8
    max_rank: int | None = None
    min_count: int = 20
    min_speedup: float = 1.0  # a domain speculates only if its best tree is predicted faster
    extrapolate: bool = False  # depths past the measured ones reuse the deepest measured rates

    def __post_init__(self) -> None:
        if self.max_nodes < 1 or self.max_depth < 1:
            raise PolicyError("tune needs max_nodes >= 1 and max_depth >= 1")


def tune(nodes: pd.DataFrame, costs: CostModel, config: TuneConfig = TuneConfig(),
         source: dict | None = None) -> PolicyFile:
    """Per domain (and pooled: the uniform tree), the tree of best predicted speed-up."""
    vectors = acceptance_vectors(nodes, config.min_count)
    if config.extrapolate:
        vectors = {k: v.extrapolated(config.max_depth) for k, v in vectors.items()}
    choices = {name: best_tree(acc, costs, config.max_nodes, config.max_depth, config.max_rank,
                               config.min_speedup)
               for name, acc in vectors.items()}
    uniform = choices.pop(ALL_DOMAINS)
    info = {"cost_model": costs.to_dict(), "tune": dict(vars(config)),
            "acceptance": {k: v.to_dict() for k, v in vectors.items()},
            "source": source or {}}
    return PolicyFile(trees={d: c.shape for d, c in choices.items()}, uniform=uniform.shape,
                      choices={**choices, ALL_DOMAINS: uniform}, info=info)


# --- policy files ----------------------------------------------------------------------------------


@dataclass
class PolicyFile:
    """Per-domain trees (None: no speculation) and the uniform tree for any other domain."""

    trees: dict[str, TreeShape | None]
    uniform: TreeShape | None = None
    choices: dict[str, Choice] = field(default_factory=dict)  # predicted figures, if tuned
    info: dict = field(default_factory=dict)

    def tree_for(self, domain: str) -> TreeShape | None:
        return self.trees.get(domain, self.uniform)

    def to_dict(self) -> dict:
        def entry(name: str, shape: TreeShape | None) -> dict:
            if name in self.choices:
                return self.choices[name].to_dict()
            return {"tree": shape.to_paths_literal() if shape else "none"}

        return {"format": POLICY_FORMAT,
                "domains": {d: entry(d, s) for d, s in self.trees.items()},
                "uniform": entry(ALL_DOMAINS, self.uniform), **self.info}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> PolicyFile:
        path = Path(path)
        try:
            text = path.read_text()
            data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except OSError as e:
            raise PolicyError(f"cannot read policy file {path}: {e}") from None
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
            raise PolicyError(f"policy file {path} is not valid {path.suffix[1:] or 'JSON'}: {e}") from None
        return cls.from_dict(data, where=str(path))

    @classmethod
    def from_dict(cls, data: dict, where: str = "policy") -> PolicyFile:
        from .domains import DOMAINS

        if not isinstance(data, dict) or not isinstance(data.get("domains"), dict):
            raise PolicyError(f"{where}: needs a 'domains' table mapping domain -> {{tree = ...}}")
        unknown = sorted(set(data["domains"]) - set(DOMAINS))
        if unknown:
            raise PolicyError(f"{where}: unknown domain(s) {unknown}; known: {', '.join(DOMAINS)}")
        trees = {d: _parse_tree(e, f"{where}: domain {d!r}") for d, e in data["domains"].items()}
        uniform = _parse_tree(data["uniform"], f"{where}: uniform") if "uniform" in data else None
        info = {k: v for k, v in data.items() if k not in ("format", "domains", "uniform")}
        return cls(trees=trees, uniform=uniform, info=info)


def _parse_tree(entry, where: str) -> TreeShape | None:
    """``{"tree": [[0], [0, 0]]}``, ``{"tree": "[(0,), (0, 0)]"}`` or ``{"tree": "none"}``."""
    tree = entry.get("tree") if isinstance(entry, dict) else entry
    if tree is None:
        raise PolicyError(f"{where}: missing 'tree' (path tuples, or \"none\")")
    try:
        if isinstance(tree, str):
            return None if tree.strip().lower() == "none" else TreeShape.parse(tree)
        if isinstance(tree, list) and all(isinstance(p, list) and all(isinstance(r, int) for r in p)
                                          for p in tree):
            return TreeShape.from_paths([tuple(p) for p in tree])
    except TreeConfigError as e:
        raise PolicyError(f"{where}: malformed tree: {e}") from None
    raise PolicyError(f"{where}: malformed tree {tree!r}: give path tuples such as "
                      "[[0], [1], [0, 0]] or \"none\"")
