"""Decoded tokens per step: a run's recorded trees replayed as greedy decoding, for the measured
tree and for any candidate it contains (a subtree, the top-1 chain of K, a stop rule over the
draft probability or the draft entropy).

Why a replay is exact. Measurement commits the target's greedy token at every output position
(one step record per position, ``step`` = i for output token i, counted from 0), and the drafter
is deterministic given the context, so the tree that greedy decoding would draft at position i is
the tree recorded at step i, and its accepted length under a candidate, ``a_i``, follows from the
nodes' ``greedy_accept`` and parents alone. Greedy decoding at position i verifies that tree, emits
``min(a_i, L - i - 1) + 1`` tokens (the accepted path and the target's bonus token, cut at the
output's end: L positions, 64 tokens or EOS) and moves to the position after them.

Convention (``prefill_drafts``):

- True (the default; the paper-protocol figures): the pass that reads the prompt also verifies the
  tree drafted from the prompt (step 0), so the replay starts at i = 0 and the first emitted
  token is the prefill's own greedy token. Decoding steps = target passes, prefill included.
- False: the prefill is a plain pass that emits token 0 alone and counts as one step, and
  speculation starts at i = 1. This is how specscope's decoder (``core.loop``) runs, and how
  ``decode`` counts its steps (a prefill step with tau 1, then one step per tree).

Tokens per step of a domain is a ratio of sums, all positions of its prompts over all their
decoding steps, with an interval from the bootstrap that resamples prompts within domains
(:class:`.stats.ClusterBootstrap`). Beside it: the *position mean*, the mean of ``a_i + 1`` over
every position, which is what ``tau`` averaged over steps gives and which overstates decoding
(runs of acceptance are counted at each of their positions; the end of the output is not cut).

Candidates (typed: :class:`MeasuredTree`, :class:`Subtree`, :func:`top_chain`,
:class:`StopRule`): a node is kept iff its path (sibling ranks from the root) is in the candidate
and, under a stop rule, neither it nor an ancestor is stopped. A path the records never hold is
refused, by name: this module does not extrapolate (``tune`` predicts deeper or wider trees from
the acceptance vector and labels them extrapolated). A path absent from some steps' trees (a
lookup's chain that ended early, a dynamic tree) counts as not proposed at those steps.

Records with steps only (a chain-only drafter measured without node records) replay the measured
tree and chains: a chain of K accepts ``min(accepted_len, K)``.

It does not time anything, model sampling (temperature > 0), or read the node records of more
than one run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import SpecscopeError
from ..records import Run, tree_paths
from ..trees import TreeShape
from .prepare import ALL, read_run
from .results import Settings
from .stats import ClusterBootstrap, DomainCells, Estimate, nan_estimate, ratio

TreePath = tuple[int, ...]

STEP_COLUMNS = ("prompt_id", "domain", "step", "accepted_len")
NODE_COLUMNS = (
    "prompt_id",
    "step",
    "node_id",
    "parent_id",
    "depth",
    "sibling_rank",
    "greedy_accept",
)
SIGNALS = ("p_draft", "draft_entropy")  # what a stop rule reads, per node


class ReplayError(SpecscopeError, ValueError):
    """Records or a candidate that cannot be replayed; the message names what and why."""


# --- the records, indexed ------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ReplayRecords:
    """One run's step and node records, indexed by output position for replay.

    Positions are flat: prompt p's position i is ``offsets[p] + i``, for i < ``lengths[p]``.
    """

    prompt_ids: tuple[str, ...]
    domains: tuple[str, ...]  # sorted
    prompt_domain: np.ndarray  # (P,) index into domains
    lengths: np.ndarray  # (P,) output positions (step records) of each prompt
    offsets: np.ndarray  # (P,) flat index of each prompt's position 0
    accepted_len: np.ndarray  # (positions,) as recorded with the step
    tree_size: np.ndarray  # (positions,) nodes the drafter proposed at the step
    node_position: np.ndarray  # (N,) flat position of the node's step
    node_depth: np.ndarray  # (N,) 1 for roots
    node_parent: np.ndarray  # (N,) row of the parent node, -1 for roots
    node_path: np.ndarray  # (N,) index into ``paths``
    node_accepted: np.ndarray  # (N,) bool: the node and its ancestors are greedy-accepted
    paths: tuple[TreePath, ...]  # every path the records hold
    signals: dict[str, np.ndarray]  # per node: the SIGNALS the records hold

    @property
    def n_prompts(self) -> int:
        return len(self.prompt_ids)

    @property
    def n_positions(self) -> int:
        return len(self.accepted_len)

    @property
    def has_nodes(self) -> bool:
        return len(self.node_depth) > 0

    @property
    def spine_depth(self) -> int:
        """The depth of the deepest top-1 chain the records hold."""
        if not self.has_nodes:
            return int(self.tree_size.max(initial=0))
        return max((len(p) for p in self.paths if not any(p)), default=0)

    def position_prompt(self) -> np.ndarray:
        """(positions,) the prompt of each flat position."""
        return np.repeat(np.arange(self.n_prompts), self.lengths)

    def holds(self, shape: TreeShape) -> bool:
        """Whether every node of ``shape`` is in the records (steps only: a chain no deeper
        than the measured chains), so that replaying it needs no extrapolation."""
        if not self.has_nodes:
            return shape.is_chain and len(shape) <= self.spine_depth
        return set(shape.paths) <= set(self.paths)

    def path_index(self, paths: tuple[TreePath, ...]) -> np.ndarray:
        """The index of each of ``paths`` in :attr:`paths`; a path the records lack is refused."""
        known = {p: i for i, p in enumerate(self.paths)}
        missing = [p for p in paths if p not in known]
        if missing:
            raise ReplayError(
                f"the measured trees hold no node at path {missing[0]}"
                + (f" (nor at {len(missing) - 1} more)" if len(missing) > 1 else "")
                + f"; they hold depth <= {max(map(len, self.paths), default=0)} and sibling "
                f"ranks <= {max((max(p) for p in self.paths), default=0)}: a deeper or wider "
                "tree is an extrapolation (the acceptance vector), not a replay"
            )
        return np.array([known[p] for p in paths], dtype=np.int64)

    @classmethod
    def from_frames(cls, nodes: pd.DataFrame, steps: pd.DataFrame) -> ReplayRecords:
        """Index a run's node and step records (nodes may be empty: a chain drafter's steps)."""
        _need(steps, STEP_COLUMNS, "step")
        if steps.empty:
            raise ReplayError("no step records to replay")
        steps = steps.sort_values(["prompt_id", "step"], kind="stable")
        prompt_codes, prompt_ids = pd.factorize(steps["prompt_id"].astype(str), sort=True)
        lengths = np.bincount(prompt_codes, minlength=len(prompt_ids))
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        _check_positions(steps["step"].to_numpy(np.int64), prompt_codes, offsets, prompt_ids)
        domains, prompt_domain = _prompt_domains(steps, prompt_codes, prompt_ids)
        tree_size = (
            steps["tree_size"].to_numpy(np.int64)
            if "tree_size" in steps
            else np.zeros(len(steps), np.int64)
        )
        base = dict(
            prompt_ids=tuple(str(p) for p in prompt_ids),
            domains=domains,
            prompt_domain=prompt_domain,
            lengths=lengths,
            offsets=offsets,
            accepted_len=steps["accepted_len"].to_numpy(np.int64),
        )
        if nodes is None or nodes.empty:
            empty = np.zeros(0, np.int64)
            return cls(
                **base,
                tree_size=tree_size,
                node_position=empty,
                node_depth=empty,
                node_parent=empty,
                node_path=empty,
                node_accepted=np.zeros(0, bool),
                paths=(),
                signals={},
            )
        return cls(**base, **_index_nodes(nodes, pd.Index(prompt_ids), offsets, lengths))


def _need(frame: pd.DataFrame, columns: tuple[str, ...], table: str) -> None:
    if missing := [c for c in columns if c not in frame.columns]:
        raise ReplayError(f"{table} records lack the columns {missing}; replay needs {columns}")


def _check_positions(step: np.ndarray, codes: np.ndarray, offsets: np.ndarray, prompt_ids) -> None:
    """Each prompt's steps must be 0, 1, ..., L - 1, once each (sorted already)."""
    expected = np.arange(len(step)) - offsets[codes]
    bad = np.flatnonzero(step != expected)
    if len(bad):
        p = codes[bad[0]]
        raise ReplayError(
            f"prompt {prompt_ids[p]!r}: its step records must be 0, 1, ..., L - 1 once each "
            f"(one per output position), but position {expected[bad[0]]} holds step "
            f"{step[bad[0]]}"
        )


def _prompt_domains(steps: pd.DataFrame, codes: np.ndarray, prompt_ids) -> tuple[tuple, np.ndarray]:
    domain_codes, domain_names = pd.factorize(steps["domain"].astype(str), sort=True)
    per_prompt = np.full(len(prompt_ids), -1)
    per_prompt[codes] = domain_codes
    clash = np.flatnonzero(per_prompt[codes] != domain_codes)
    if len(clash):
        raise ReplayError(
            f"prompt {prompt_ids[codes[clash[0]]]!r} appears under more than one domain"
        )
    return tuple(str(d) for d in domain_names), per_prompt.astype(np.int64)


def _index_nodes(
    nodes: pd.DataFrame, prompts: pd.Index, offsets: np.ndarray, lengths: np.ndarray
) -> dict:
    _need(nodes, NODE_COLUMNS, "node")
    prompt = prompts.get_indexer(nodes["prompt_id"].astype(str))
    step = nodes["step"].to_numpy(np.int64)
    outside = (prompt < 0) | (step < 0) | (step >= lengths[np.maximum(prompt, 0)])
    if outside.any():
        row = nodes.iloc[int(np.flatnonzero(outside)[0])]
        raise ReplayError(
            f"node records name prompt {row['prompt_id']!r} step {row['step']}, which has no "
            "step record: nodes and steps must come from the same run"
        )
    position = offsets[prompt] + step
    order = np.lexsort((nodes["node_id"].to_numpy(np.int64), position))
    position = position[order]
    node_id = nodes["node_id"].to_numpy(np.int64)[order]
    parent_id = nodes["parent_id"].to_numpy(np.int64)[order]
    depth = nodes["depth"].to_numpy(np.int64)[order]
    rank = nodes["sibling_rank"].to_numpy(np.int64)[order]
    starts = np.flatnonzero(np.r_[True, position[1:] != position[:-1]])
    first = np.repeat(starts, np.diff(np.r_[starts, len(position)]))
    if (node_id != np.arange(len(position)) - first).any() or (parent_id >= node_id).any():
        raise ReplayError(
            "node records: each step's node_id must run 0, 1, ... in breadth-first order, "
            "with each parent_id below its node's id (-1 for roots)"
        )
    is_root = parent_id < 0
    parent = np.where(is_root, -1, first + parent_id)
    if ((depth == 1) != is_root).any() or (depth[~is_root] != depth[parent[~is_root]] + 1).any():
        raise ReplayError("node records: roots need depth 1 and every other node its parent's + 1")
    greedy = nodes["greedy_accept"].to_numpy(bool)[order]
    codes, paths = _path_codes(depth, rank, parent)
    signals = {
        name: nodes[name].to_numpy(np.float64)[order] for name in SIGNALS if name in nodes.columns
    }
    return dict(
        tree_size=np.bincount(position, minlength=int(lengths.sum())).astype(np.int64),
        node_position=position,
        node_depth=depth,
        node_parent=parent,
        node_path=codes,
        node_accepted=tree_paths(greedy, depth, rank, is_root, parent).accepted,
        paths=paths,
        signals=signals,
    )


def _path_codes(
    depth: np.ndarray, rank: np.ndarray, parent: np.ndarray
) -> tuple[np.ndarray, tuple[TreePath, ...]]:
    """Each node's path as an index into the distinct paths, found depth by depth."""
    codes = np.zeros(len(depth), np.int64)
    paths: list[TreePath] = []
    width = int(rank.max(initial=0)) + 1
    for d in range(1, int(depth.max(initial=0)) + 1):
        at = np.flatnonzero(depth == d)
        above = codes[parent[at]] + 1 if d > 1 else np.zeros(len(at), np.int64)
        distinct, inverse = np.unique(above * width + rank[at], return_inverse=True)
        codes[at] = len(paths) + inverse
        paths.extend(
            (paths[u // width - 1] if u >= width else ()) + (int(u % width),) for u in distinct
        )
    return codes, tuple(paths)


def index_records(source: Run | str | Path | ReplayRecords) -> ReplayRecords:
    """A run (or its directory) indexed for replay; already indexed records pass through."""
    if isinstance(source, ReplayRecords):
        return source
    run = source if isinstance(source, Run) else read_run(source)
    return ReplayRecords.from_frames(run.nodes, run.steps)


# --- candidates ----------------------------------------------------------------------------------


def shape_label(shape: TreeShape | None) -> str:
    """``none``, ``chain(4)`` or nodes per depth, e.g. ``tree 2/4/2``."""
    if shape is None:
        return "none"
    if shape.is_chain:
        return f"chain({len(shape)})"
    return "tree " + "/".join(str(c) for c in shape.depth_counts())


@dataclass(frozen=True)
class MeasuredTree:
    """Every recorded node: the tree the run measured."""

    @property
    def label(self) -> str:
        return "measured tree"

    def keep(self, rec: ReplayRecords) -> np.ndarray:
        return np.ones(len(rec.node_depth), bool)


@dataclass(frozen=True)
class Subtree:
    """The recorded nodes whose paths are in ``shape`` (a chain, a subtree of the measured one)."""

    shape: TreeShape

    @property
    def label(self) -> str:
        return shape_label(self.shape)

    def keep(self, rec: ReplayRecords) -> np.ndarray:
        wanted = np.zeros(len(rec.paths), bool)
        wanted[rec.path_index(self.shape.paths)] = True
        return wanted[rec.node_path]


def top_chain(k: int) -> Subtree:
    """The top-1 chain of ``k`` nodes (``k`` at most the measured spine's depth)."""
    if k < 1:
        raise ReplayError(f"a chain needs k >= 1 nodes, got {k}")
    return Subtree(TreeShape.chain(k))


@dataclass(frozen=True)
class StopRule:
    """``base``, each path cut before the first node whose draft probability is below ``p_min``
    or whose drafting distribution's entropy (nats) is above ``h_max``; the cut node is not
    drafted.

    ``p_min`` follows llama.cpp's ``--spec-draft-p-min`` (ggml-org/llama.cpp,
    common/speculative.cpp at 001d906a6d86e2490e394361e7cc6f478b100088,
    ``common_speculative_impl_draft_simple::draft``): at each draft position the draft's top
    candidate is checked *before* it is appended, ``if (cur_p->data[0].p < params.p_min)`` stops
    drafting, so the low-probability token is not drafted. Two differences, both named here:
    llama.cpp's ``p`` is renormalised over the draft's top ``LLAMA_DRAFT_TOP_K`` = 10 tokens
    (sampler chain top-k then dist, common/sampling.cpp), while the records hold the full-vocabulary
    ``p_draft`` (never larger), so this rule stops at least as early as llama.cpp's and exactly as
    early where the top 10 hold all the mass; and llama.cpp drops a draft shorter than ``n_min``
    (default 0), which is not modelled. llama.cpp drafts chains; on a tree the rule applies to
    every path.
    """

    base: MeasuredTree | Subtree
    p_min: float | None = None
    h_max: float | None = None

    def __post_init__(self) -> None:
        if self.p_min is None and self.h_max is None:
            raise ReplayError("a stop rule needs p_min (draft probability) or h_max (entropy)")
        if self.p_min is not None and not 0 <= self.p_min <= 1:
            raise ReplayError(f"p_min is a probability in [0, 1], got {self.p_min}")
        if self.h_max is not None and not 0 <= self.h_max < math.inf:
            raise ReplayError(f"h_max is an entropy in nats, finite and >= 0, got {self.h_max}")

    @property
    def label(self) -> str:
        rules = [f"p_draft >= {self.p_min:g}"] if self.p_min is not None else []
        rules += [f"draft entropy <= {self.h_max:g}"] if self.h_max is not None else []
        return f"{self.base.label} while {' and '.join(rules)}"

    def keep(self, rec: ReplayRecords) -> np.ndarray:
        ok = self.base.keep(rec)
        for name, bound, passes in (
            ("p_draft", self.p_min, np.greater_equal),
            ("draft_entropy", self.h_max, np.less_equal),
        ):
            if bound is None:
                continue
            signal = rec.signals.get(name)
            if signal is None or np.isnan(signal).any():
                raise ReplayError(
                    f"the node records {'lack' if signal is None else 'have undefined values of'}"
                    f" {name}: a stop rule on it cannot be replayed"
                )
            ok &= passes(signal, bound)
        return _ancestors_kept(ok, rec)


Candidate = MeasuredTree | Subtree | StopRule


def _ancestors_kept(ok: np.ndarray, rec: ReplayRecords) -> np.ndarray:
    """``ok`` of each node and of all its ancestors (depth by depth: parents come first)."""
    kept = ok.copy()
    for d in range(2, int(rec.node_depth.max(initial=1)) + 1):
        at = np.flatnonzero(rec.node_depth == d)
        kept[at] &= kept[rec.node_parent[at]]
    return kept


# --- the replay ------------------------------------------------------------------------------------


def accepted_lengths(
    rec: ReplayRecords, candidate: Candidate
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per position: the accepted length under ``candidate`` (the deepest kept node on the
    accepted path), the number of nodes the candidate's tree there has (0: none drafted) and
    the levels past the root whose nodes were fed to the draft (the deepest kept node with a
    child in the uncut tree: a draft model feeds a level while a node of it is kept and has
    children, as :func:`specscope.core.draft.draft_static` does)."""
    if not rec.has_nodes:
        return _step_lengths(rec, candidate)
    kept = candidate.keep(rec)
    uncut = candidate.base.keep(rec) if isinstance(candidate, StopRule) else kept
    has_child = np.zeros(len(kept), bool)
    has_child[rec.node_parent[uncut & (rec.node_parent >= 0)]] = True
    accepted, fed = np.zeros(rec.n_positions, np.int64), np.zeros(rec.n_positions, np.int64)
    on_path, feeds = kept & rec.node_accepted, kept & has_child
    np.maximum.at(accepted, rec.node_position[on_path], rec.node_depth[on_path])
    np.maximum.at(fed, rec.node_position[feeds], rec.node_depth[feeds])
    return accepted, np.bincount(rec.node_position[kept], minlength=rec.n_positions), fed


def _step_lengths(
    rec: ReplayRecords, candidate: Candidate
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps-only records: the measured chains, or their first K nodes (a chain of n nodes fed
    n - 1 of them)."""
    size = np.asarray(rec.tree_size, np.int64)
    if isinstance(candidate, MeasuredTree):
        return rec.accepted_len, size, np.maximum(size - 1, 0)
    if isinstance(candidate, Subtree) and candidate.shape.is_chain:
        k = len(candidate.shape)
        if k > rec.spine_depth:
            raise ReplayError(
                f"the measured chains hold at most {rec.spine_depth} nodes; a chain of {k} is "
                "an extrapolation (the acceptance vector), not a replay"
            )
        return np.minimum(rec.accepted_len, k), np.minimum(size, k), np.clip(size, 1, k) - 1
    raise ReplayError(
        f"these records hold steps only (no node records): {candidate.label} cannot be "
        "replayed; the measured tree and chains can"
    )


@dataclass(frozen=True, eq=False)
class ReplayCounts:
    """Per prompt: what greedy decoding with one candidate does over its recorded output."""

    candidate: str
    prefill_drafts: bool
    positions: np.ndarray  # (P,) output tokens
    steps: np.ndarray  # (P,) decoding steps (target passes)
    proposals: np.ndarray  # (P,) decoding steps whose tree had a node
    tau_sum: np.ndarray  # (P,) sum over positions of accepted length + 1 (the position mean's)
    first_tokens: np.ndarray | None = None  # (P,) tokens the first step emitted
    first_proposals: np.ndarray | None = None  # (P,) 1 where the first step had a tree
    # what a step costs an engine that prices it by its tree (llama.cpp's draft loop):
    # drafted_steps[p, d] is how many of prompt p's steps from a tree position drafted d nodes
    # (a plain prefill pass is not among them)
    drafted_steps: np.ndarray | None = None  # (P, max nodes + 1)
    first_drafted_steps: np.ndarray | None = None  # (P, max nodes + 1) the first step's
    # the same by the levels past the root fed to the draft (what a draft model's step costs)
    fed_steps: np.ndarray | None = None  # (P, max depth + 1)
    first_fed_steps: np.ndarray | None = None

    def after_first(self) -> ReplayCounts:
        """The counts after each prompt's first step: what a decode speed after the first token
        (a bench's) is made of, the prefill being the same work in every method."""
        return ReplayCounts(
            self.candidate,
            self.prefill_drafts,
            self.positions - self.first_tokens,
            self.steps - 1,
            self.proposals - self.first_proposals,
            self.tau_sum,
            drafted_steps=self.drafted_steps - self.first_drafted_steps,
            fed_steps=self.fed_steps - self.first_fed_steps,
        )

    @property
    def drafted(self) -> np.ndarray:
        """(P,) nodes drafted over the decoding steps."""
        return self.drafted_steps @ np.arange(self.drafted_steps.shape[1])

    def drafted_mix(self, rec: ReplayRecords, fed: bool = False) -> dict[str, np.ndarray]:
        """Per domain and pooled (``ALL``): the share of steps from a tree position that
        drafted 0, 1, 2, ... nodes (index d: d nodes; ``fed``: fed the draft d levels)."""
        sums = _domain_sums(rec, self.fed_steps if fed else self.drafted_steps)
        totals = sums.sum(axis=1, keepdims=True)
        shares = np.divide(sums, totals, out=np.full(sums.shape, np.nan), where=totals > 0)
        return dict(zip((*rec.domains, ALL), shares))

    def per_prompt(self) -> np.ndarray:
        """(P, 4): positions, steps, proposals, tau sum: the columns of :data:`_COLUMNS`."""
        return np.column_stack([self.positions, self.steps, self.proposals, self.tau_sum])

    def ratios(self, rec: ReplayRecords, num: str, den: str) -> dict[str, float]:
        """Point estimates (no interval: for choosing fast) of a ratio of two columns' sums per
        domain and pooled (``ALL``): ``("positions", "steps")`` is tokens per step."""
        sums = _domain_sums(rec, self.per_prompt()[:, [_COLUMNS[num], _COLUMNS[den]]])
        return dict(zip((*rec.domains, ALL), map(float, ratio(sums[:, 0], sums[:, 1]))))


_COLUMNS = {"positions": 0, "steps": 1, "proposals": 2, "tau_sum": 3}


def _domain_sums(rec: ReplayRecords, columns: np.ndarray) -> np.ndarray:
    """(G + 1, C): per-prompt columns summed per domain, then pooled (the last row)."""
    sums = np.eye(len(rec.domains))[rec.prompt_domain].T @ columns
    return np.vstack([sums, sums.sum(axis=0)])


def _step_starts(grid: np.ndarray, lengths: np.ndarray, start: int) -> np.ndarray:
    """(P, L_max) bool: where greedy decoding's steps start, walking each prompt from position
    ``start``: a step at i emits its accepted length + 1 tokens (the output's end cuts them)
    and the next starts at i + min(a_i, L - i - 1) + 1."""
    P, width = grid.shape
    starts = np.zeros((P, width), bool)
    at = np.full(P, start, np.int64)
    live = at < lengths
    while live.any():
        rows = np.flatnonzero(live)
        i = at[rows]
        starts[rows, i] = True
        at[rows] = i + np.minimum(grid[rows, i], lengths[rows] - i - 1) + 1
        live = at < lengths
    return starts


def step_positions(
    rec: ReplayRecords, accepted: np.ndarray, prefill_drafts: bool = True
) -> np.ndarray:
    """(positions,) bool: the positions whose tree greedy decoding verifies, given each
    position's accepted length (a plain prefill pass, ``prefill_drafts`` False, is not among
    them)."""
    lengths = rec.lengths
    grid = np.zeros((rec.n_prompts, int(lengths.max())), np.int64)  # (P, L_max)
    prompt, i = rec.position_prompt(), np.arange(rec.n_positions) - np.repeat(rec.offsets, lengths)
    grid[prompt, i] = accepted
    # a plain prefill pass emits position 0 where the prefill drafts nothing; trees from 1 on
    return _step_starts(grid, lengths, 0 if prefill_drafts else 1)[prompt, i]


def replay_counts(
    source: Run | str | Path | ReplayRecords, candidate: Candidate, prefill_drafts: bool = True
) -> ReplayCounts:
    """Replay every prompt as greedy decoding with ``candidate`` (see the module's convention)."""
    rec = index_records(source)
    accepted, size, fed = accepted_lengths(rec, candidate)
    P, lengths = rec.n_prompts, rec.lengths
    prompt = rec.position_prompt()
    at_step = step_positions(rec, accepted, prefill_drafts)

    def per_step(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P, max + 1) each prompt's steps by ``values`` at them, and its first step's."""
        steps = np.zeros((P, int(values.max(initial=0)) + 1), np.int64)
        np.add.at(steps, (prompt[at_step], values[at_step]), 1)
        first = np.zeros_like(steps)
        if prefill_drafts:
            first[np.arange(P), values[rec.offsets]] = 1
        return steps, first

    (drafted_steps, first_drafted), (fed_steps, first_fed) = per_step(size), per_step(fed)
    if prefill_drafts:
        first = np.minimum(accepted[rec.offsets], lengths - 1) + 1
    else:
        first = np.ones(P, np.int64)
    tau_sum = np.bincount(prompt, weights=accepted + 1, minlength=P)
    return ReplayCounts(
        candidate.label,
        prefill_drafts,
        lengths,
        drafted_steps.sum(axis=1) + (0 if prefill_drafts else 1),
        drafted_steps[:, 1:].sum(axis=1),
        tau_sum,
        first,
        first_drafted[:, 1:].sum(axis=1),
        drafted_steps=drafted_steps,
        first_drafted_steps=first_drafted,
        fed_steps=fed_steps,
        first_fed_steps=first_fed,
    )


# --- estimates with intervals ------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayRow:
    """One domain (or all, ``ALL``) under one candidate."""

    domain: str
    prompts: int
    positions: int
    steps: int  # decoding steps
    tokens_per_step: Estimate  # decoded: positions over decoding steps
    position_mean: Estimate  # mean of accepted length + 1 over positions (overstates decoding)
    proposal_share: Estimate  # share of decoding steps whose tree had a node


@dataclass(frozen=True)
class Replay:
    """Tokens per step of one candidate, per domain and pooled, with prompt-resampled intervals."""

    candidate: str
    prefill_drafts: bool
    rows: tuple[ReplayRow, ...]  # each domain, then ALL

    def row(self, domain: str) -> ReplayRow:
        for r in self.rows:
            if r.domain == domain:
                return r
        raise ReplayError(
            f"no domain {domain!r} in the replay; it has {', '.join(r.domain for r in self.rows)}"
        )


def estimate(
    rec: ReplayRecords,
    counts: ReplayCounts | tuple[ReplayCounts, ...],
    settings: Settings | None = None,
) -> tuple[Replay, ...]:
    """Each counts' figures per domain and pooled, all from one bootstrap (the same resampled
    prompts for every candidate, so differences between candidates are paired)."""
    many = counts if isinstance(counts, tuple) else (counts,)
    cells = domain_cells(rec, np.hstack([c.per_prompt() for c in many]), settings)
    return tuple(_replay(rec, cells, c, 4 * k) for k, c in enumerate(many))


def domain_cells(rec: ReplayRecords, per_prompt: np.ndarray, settings: Settings | None):
    """The bootstrap totals (prompts resampled within domains) of per-prompt sums."""
    settings = settings or Settings()
    boot = ClusterBootstrap.draw(
        rec.prompt_domain, settings.n_boot, settings.seed, settings.confidence
    )
    return DomainCells.of(boot, per_prompt, rec.prompt_domain)


def _replay(rec: ReplayRecords, cells, counts: ReplayCounts, start: int) -> Replay:
    col = {name: slice(start + k, start + k + 1) for name, k in _COLUMNS.items()}

    def figure(num: str, den: str) -> np.ndarray:
        return cells.estimates(cells.mean(col[num], col[den]), col[den])[:, 0]

    tokens = cells.estimates(cells.mean(col["positions"], col["steps"]), col["steps"])[:, 0]
    position_mean = figure("tau_sum", "positions")
    share = figure("proposals", "steps")
    totals = cells.totals[0]
    rows = tuple(
        ReplayRow(
            label,
            int(cells.prompts[g, start]),
            int(totals[g, start]),
            int(totals[g, start + 1]),
            tokens[g],
            position_mean[g],
            share[g],
        )
        for g, label in enumerate((*rec.domains, ALL))
    )
    return Replay(counts.candidate, counts.prefill_drafts, rows)


def replay(
    source: Run | str | Path | ReplayRecords,
    candidate: Candidate = MeasuredTree(),
    settings: Settings | None = None,
    prefill_drafts: bool = True,
) -> Replay:
    """Decoded tokens per step of ``candidate`` per domain and pooled, with intervals."""
    rec = index_records(source)
    return estimate(rec, replay_counts(rec, candidate, prefill_drafts), settings)[0]


# --- the table beside the position mean --------------------------------------------------------------


@dataclass(frozen=True)
class DecodedRow:
    domain: str
    prompts: int
    positions: int
    steps: int
    decoded: Estimate  # the run's own tree, replayed
    position_mean: Estimate  # mean tau over positions, as the paper-style tables show it
    chain: Estimate  # the top-1 chain within the run's tree, replayed


@dataclass(frozen=True)
class DecodedTable:
    """Decoded tokens per step per domain: the run's tree and its top-1 chain, replayed."""

    rows: tuple[DecodedRow, ...]  # each domain, then ALL
    chain_depth: int  # the top-1 chain's nodes (0: the records hold none)
    prefill_drafts: bool


def decoded_tokens_per_step(
    source: Run | str | Path | ReplayRecords,
    settings: Settings | None = None,
    prefill_drafts: bool = True,
) -> DecodedTable:
    """The run's own tree and the top-1 chain within it replayed as greedy decoding, per domain,
    beside the position mean, with intervals from one bootstrap."""
    rec = index_records(source)
    depth = rec.spine_depth
    counts = [replay_counts(rec, MeasuredTree(), prefill_drafts)]
    if depth:
        counts.append(replay_counts(rec, top_chain(depth), prefill_drafts))
    replays = estimate(rec, tuple(counts), settings)
    tree = replays[0]
    chains = replays[1].rows if depth else [None] * len(tree.rows)
    rows = tuple(
        DecodedRow(
            r.domain,
            r.prompts,
            r.positions,
            r.steps,
            r.tokens_per_step,
            r.position_mean,
            c.tokens_per_step if c is not None else nan_estimate(),
        )
        for r, c in zip(tree.rows, chains)
    )
    return DecodedTable(rows, depth, prefill_drafts)
