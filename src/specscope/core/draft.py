"""The draft stage: grow a tree of candidate tokens from the draft model, level by level.

Every level's frontier (the nodes that get children) is fed to the draft in ONE call, and the
children of each frontier node are chosen from the draft's distribution at it: its top tokens
(greedy decoding, measurement), or draws without replacement (sampling, via Gumbel-top-k). A
static :class:`~specscope.trees.TreeShape` fixes which nodes exist; a
:class:`~specscope.trees.DynamicTree` grows the likeliest paths (EAGLE-2).

The functions here take the draft's forward as a callable, so they know nothing of caches or
sessions. :func:`grow_tree` chooses the tokens of B rows that share one shape (batched
measurement, :mod:`specscope.core.batch`, and the naive oracle); :func:`draft_static` and
:func:`draft_dynamic` grow one prompt's tree with decoding's options (sampled children, early
stops, a draft-probability stop rule, EAGLE-2 growth), bound to a prompt by
:mod:`specscope.core.loop`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..trees import DynamicTree, TreeShape, ancestor_mask, bfs_prefix, contiguous_ranks
from .sampling import gumbel_topk_scores, warp

# (frontier nodes, tokens so far [B, N]) -> the draft's scores at the frontier [B, F, V]
Expand = Callable[[list[int], torch.Tensor], torch.Tensor]


@dataclass
class DraftTree:
    """The tree one step drafted."""

    shape: TreeShape
    tokens: torch.Tensor  # [N] long, on the CPU
    proposals: (
        torch.Tensor | None
    )  # [C, V]: q at the contexts nodes were drawn from; None: not kept
    proposal_row: list[int]  # each node's row of ``proposals`` (its parent's context)
    draft_slot: list[int]  # each node's index among the tree entries of the draft cache, or -1


@dataclass(frozen=True)
class ChildRule:
    """How a node's children are chosen from the draft's logits at it.

    ``temperature`` 0: the draft's top tokens; > 0: draws without replacement from q at that
    temperature and ``top_p``. ``keep_q``: keep q at every context (measurement records it; sampled
    verification needs it). ``min_path_prob``: stop growing once no frontier path is this likely.
    ``p_min`` (0: off; greedy drafting): a static tree's stop rule, as llama.cpp's
    ``--spec-draft-p-min`` and :class:`specscope.analysis.replay.StopRule` define it: a node whose
    token has draft probability below ``p_min`` (q at temperature 1 over the whole vocabulary,
    the ``p_draft`` that measurement records) is not drafted, nor are its descendants; growth
    ends once no node of a level is kept. ``h_max`` (inf: off) stops the same way at a node
    drawn from a distribution whose entropy (nats, the records' ``draft_entropy``) exceeds it.
    """

    vocab: int
    temperature: float = 0.0
    top_p: float = 1.0
    keep_q: bool = False
    min_path_prob: float = 0.0
    p_min: float = 0.0
    h_max: float = math.inf

    @property
    def stops(self) -> bool:
        """Whether a stop rule (``p_min``, ``h_max``) cuts nodes."""
        return self.p_min > 0 or self.h_max < math.inf

    @property
    def needs_q(self) -> bool:
        """Whether drafting needs the draft's distribution at every context, not only its top
        tokens."""
        return not self.greedy or self.keep_q or self.min_path_prob > 0 or self.stops

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def grow_tree(
    shape: TreeShape,
    root_q: torch.Tensor,
    expand: Expand,
    stop: Callable[[list[int], torch.Tensor], bool] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Choose every node's token, depth by depth, from the draft's scores at its parent, for B
    rows that share one shape.

    ``root_q`` [B, V] scores the root context; ``expand(frontier, tokens)`` returns scores
    [B, F, V] at the contexts extended by each frontier node (nodes of the current depth that have
    children), in one batched draft call. A node of sibling rank r takes its parent's r-th best
    token. Returns tokens [B, N], score rows [B, C, V] and each node's row [N]. ``stop(frontier,
    tokens)``, if given, is asked before each expansion; when it returns True the growth ends and
    the tensors cover the nodes grown so far (a breadth-first prefix).
    """
    B = root_q.shape[0]
    q = root_q[:, None, :]
    row = {-1: 0}
    tokens = torch.empty(B, len(shape), dtype=torch.long, device=root_q.device)
    for depth in range(1, shape.max_depth + 1):
        level = list(shape.nodes_at_depth(depth))
        parent_rows = q[:, [row[shape.parents[n]] for n in level]]  # [B, F, V]
        top = torch.topk(parent_rows, max(shape.ranks[n] for n in level) + 1, dim=-1).indices
        tokens[:, level] = top[:, torch.arange(len(level)), [shape.ranks[n] for n in level]]
        frontier = [n for n in level if shape.children[n]]
        if frontier and stop is not None and stop(frontier, tokens):
            grown = max(level) + 1
            return tokens[:, :grown], q, torch.tensor([row[p] for p in shape.parents[:grown]])
        if frontier:
            row.update({n: q.shape[1] + j for j, n in enumerate(frontier)})
            q = torch.cat([q, expand(frontier, tokens)], dim=1)
    return tokens, q, torch.tensor([row[p] for p in shape.parents])


# (nodes of one level, all tokens so far [N'], the ancestor mask [N', N']) -> draft logits [F, V]
FeedLevel = Callable[[list[int], torch.Tensor, torch.Tensor], torch.Tensor]


def draft_static(
    shape: TreeShape,
    root_logits: torch.Tensor,
    feed_level: FeedLevel,
    rule: ChildRule,
    generator: torch.Generator,
    fed: list[int],
) -> DraftTree | None:
    """One prompt's static tree. Children are the draft's top tokens, or draws without replacement
    when sampling; growth stops early once no frontier path has draft probability
    ``rule.min_path_prob``, and ``rule.p_min`` and ``rule.h_max`` drop unlikely nodes (None:
    they dropped every root). ``fed`` collects the nodes fed to the draft, in cache order."""
    rows: list[torch.Tensor] = []  # q at the root and at each fed node, when kept
    path_prob: dict[int, float] = {-1: 1.0}
    kept: dict[int, bool] = {-1: True}  # under a stop rule: the node and its ancestors pass

    def scores(logits: torch.Tensor) -> torch.Tensor:
        if not rule.needs_q:
            return logits  # the top tokens; no distribution needed
        q = warp(logits, rule.vocab, rule.temperature or 1.0, 1.0 if rule.greedy else rule.top_p)
        rows.extend(q)
        return q if rule.greedy else gumbel_topk_scores(q, generator)

    def expand(frontier: list[int], tokens: torch.Tensor) -> torch.Tensor:
        return scores(feed_level(frontier, tokens[0].cpu(), anc))[None]

    def q_row(n: int) -> torch.Tensor:
        return rows[0 if shape.parents[n] < 0 else 1 + fed.index(shape.parents[n])]

    def q_of(n: int, tokens: torch.Tensor) -> float:
        return float(q_row(n)[tokens[0, n]])

    def keep(n: int, tokens: torch.Tensor) -> bool:  # the stop rule, on q as measurement records
        q = q_row(n)
        entropy = -(q * torch.log(q.clamp_min(1e-30))).sum() if rule.h_max < math.inf else 0.0
        passes = q_of(n, tokens) >= rule.p_min and float(entropy) <= rule.h_max
        return kept[shape.parents[n]] and passes

    def stop(frontier: list[int], tokens: torch.Tensor) -> bool:
        level = shape.nodes_at_depth(shape.depths[frontier[0]])
        if rule.stops:
            kept.update({n: keep(n, tokens) for n in level})
            if not any(kept[n] for n in frontier):
                return True
        if rule.min_path_prob > 0:
            path_prob.update({n: path_prob[shape.parents[n]] * q_of(n, tokens) for n in frontier})
            return max(path_prob[n] for n in frontier) < rule.min_path_prob
        return False

    if not rule.greedy:  # draws are taken in order: a node's children are draws 0..k-1
        shape = contiguous_ranks(shape)
    anc = shape.ancestor_mask()
    tokens, _, q_index = grow_tree(
        shape,
        scores(root_logits[None]),
        expand,
        stop=stop if rule.min_path_prob > 0 or rule.stops else None,
    )
    shape = bfs_prefix(shape, tokens.shape[1])
    slot = {n: i for i, n in enumerate(fed)}
    tree = DraftTree(
        shape,
        tokens[0].cpu(),
        torch.stack(rows) if rule.keep_q or not rule.greedy else None,
        q_index.tolist(),
        [slot.get(n, -1) for n in range(len(shape))],
    )
    if not rule.stops:
        return tree
    for n in range(len(shape)):  # the last level is never a frontier: checked here
        if n not in kept:
            kept[n] = keep(n, tokens)
    return keep_nodes(tree, [n for n in range(len(shape)) if kept[n]])


def keep_nodes(tree: DraftTree, nodes: list[int]) -> DraftTree | None:
    """``tree`` cut to ``nodes`` (ascending, closed under parents), their paths unchanged; None
    when no node is left."""
    if len(nodes) == len(tree.shape):
        return tree
    if not nodes:
        return None
    index = {n: i for i, n in enumerate(nodes)}
    parents = tuple(
        -1 if tree.shape.parents[n] < 0 else index[tree.shape.parents[n]] for n in nodes
    )
    return DraftTree(
        TreeShape(parents, tuple(tree.shape.ranks[n] for n in nodes)),
        tree.tokens[nodes],
        tree.proposals,
        [tree.proposal_row[n] for n in nodes],
        [tree.draft_slot[n] for n in nodes],
    )


def draft_dynamic(
    policy: DynamicTree,
    root_logits: torch.Tensor,
    feed_level: FeedLevel,
    rule: ChildRule,
    fed: list[int],
) -> DraftTree:
    """EAGLE-2: expand the top-k nodes of each depth by cumulative draft log-probability, then
    keep the best ``max_nodes`` of all drafted nodes (ties: shallower first). The children are the
    draft's top tokens (deterministic, verified as point-mass proposals when sampling)."""
    temp = rule.temperature or 1.0
    parents: list[int] = []
    depths: list[int] = []
    ranks: list[int] = []
    score: list[float] = []
    token_list: list[int] = []

    def add_children(parent: int, row: torch.Tensor) -> list[int]:
        top = torch.topk(row, policy.top_k)
        base = score[parent] if parent >= 0 else 0.0
        first = len(parents)
        for r, (lp, tok) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
            parents.append(parent)
            depths.append(1 if parent < 0 else depths[parent] + 1)
            ranks.append(r)
            score.append(base + lp)
            token_list.append(tok)
        return list(range(first, len(parents)))

    level = add_children(-1, torch.log_softmax(root_logits / temp, -1))
    for _ in range(policy.depth - 1):
        frontier = sorted(level, key=lambda n: -score[n])[: policy.top_k]
        if math.exp(score[frontier[0]]) < rule.min_path_prob:
            break
        rows = torch.log_softmax(
            feed_level(frontier, torch.tensor(token_list), ancestor_mask(parents)) / temp, -1
        )
        level = [c for n, row in zip(frontier, rows) for c in add_children(n, row)]
    kept = sorted(range(len(parents)), key=lambda n: (-score[n], depths[n], n))[: policy.max_nodes]
    order = sorted(kept, key=lambda n: (depths[n], n))
    index = {n: i for i, n in enumerate(order)}
    shape = TreeShape(
        tuple(index[parents[n]] if parents[n] >= 0 else -1 for n in order),
        tuple(ranks[n] for n in order),
    )
    slot = {n: i for i, n in enumerate(fed)}
    return DraftTree(
        shape,
        torch.tensor([token_list[n] for n in order]),
        None,
        [],
        [slot.get(n, -1) for n in order],
    )
