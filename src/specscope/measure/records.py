"""What measurement observes at each step: the draft's and the target's distributions over a
tree, turned into one row per node (docs/reference/records.md) and the step's own figures.

:func:`step_record` turns a step's :class:`~specscope.core.batch.StepScores` (what its draft
and verify stages produced, in batched measurement or in the naive oracle) into node columns;
:func:`certificate_records` gives the nodes' and the step's certificates. This module runs no
model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..core.batch import StepScores
from ..core.passes import greedy_token
from ..records import tree_paths
from ..theory import CriteriaConfig, certificate_columns
from ..trees import TreeShape

RANK_WIDTH = 16  # a node's rank is read off its context's top 16 when its token is in them


def _rank(
    probs: torch.Tensor,
    ctx: torch.Tensor,
    tokens: torch.Tensor,
    p_t: torch.Tensor,
    top: torch.return_types.topk,
) -> torch.Tensor:
    """Each node's token rank under its context's row of ``probs`` [C, V] (0 = the greedy token),
    ties ordered by token id as in :func:`greedy_token`.

    ``top`` holds each row's largest values and their ids. A token whose probability exceeds the
    smallest of them is ranked among them alone: every token outside them is below it. Other
    tokens are ranked over the whole row.
    """
    values, ids = top.values[ctx], top.indices[ctx]  # [N, W]
    p_col, tok = p_t[:, None], tokens[:, None]
    rank = ((values > p_col) | ((values == p_col) & (ids < tok))).sum(-1)
    outside = (p_t <= values[:, -1]).nonzero().flatten()
    if len(outside):
        rows, p_o, tok_o = probs[ctx[outside]], p_col[outside], tok[outside]
        vocab_ids = torch.arange(probs.shape[-1], device=probs.device)
        rank[outside] = ((rows > p_o) | ((rows == p_o) & (vocab_ids < tok_o))).sum(-1)
    return rank


@dataclass
class NodeRecords:
    """Column arrays of one step's node rows, and what the target accepts and emits."""

    nodes: dict[str, np.ndarray]
    emitted_token: int
    accepted_len: int
    root_margin: float  # the target's top-1 minus top-2 probability at the step's context
    root_kl: float  # KL(p || q) there (NaN for point-mass proposals)


def step_record(scores: StepScores, shape: TreeShape) -> NodeRecords:
    """Per-node figures (docs/reference/records.md) from one step's draft and target distributions.

    Siblings share a context, so the distribution-wide figures (entropies, KL, top-2, argmax) are
    computed once per context and indexed per node.
    """
    N = len(shape)
    contexts, inverse = np.unique(np.asarray(shape.parents) + 1, return_inverse=True)
    first = [int(np.flatnonzero(inverse == c)[0]) for c in range(len(contexts))]
    node_ctx = torch.as_tensor(inverse, device=scores.p.device)
    p_rows = scores.p[torch.as_tensor(contexts, device=scores.p.device)]  # [C, V]
    log_p = torch.log(p_rows.clamp_min(1e-30))
    target_entropy = -(p_rows * log_p).sum(-1)
    if scores.q is None:  # point-mass proposals: q(t) = 1, no entropy, KL(p || q) undefined
        draft_entropy = torch.zeros_like(target_entropy)
        kl = torch.full_like(target_entropy, float("nan"))
        q_t = torch.ones(N, dtype=torch.float64, device=scores.p.device)
    else:
        q_rows = scores.q[scores.q_index[first]]  # [C, V]: q at the same contexts
        log_q = torch.log(q_rows.clamp_min(1e-30))
        draft_entropy = -(q_rows * log_q).sum(-1)
        kl = (p_rows * (log_p - log_q)).sum(-1)
        q_t = q_rows[node_ctx, scores.tokens].double()
    top = torch.topk(p_rows, min(RANK_WIDTH, p_rows.shape[-1]), dim=-1)
    top2 = top.values[:, :2]  # values only: ties are settled by greedy_token
    p_node = p_rows[node_ctx, scores.tokens]
    p_t = p_node.double()
    greedy = greedy_token(p_rows)[node_ctx] == scores.tokens

    n = scores.proposed  # nodes past it were padding (a model-free drafter's short chain)
    parents, depths = np.asarray(shape.parents)[:n], np.asarray(shape.depths)[:n]
    accepted = tree_paths(
        greedy[:n].cpu().numpy(), depths, np.asarray(shape.ranks)[:n], parents < 0, parents
    ).accepted
    accepted_len = int(depths[accepted].max(initial=0))

    def host(x: torch.Tensor) -> np.ndarray:
        return x.cpu().numpy()

    columns = {
        "node_id": np.arange(N, dtype=np.int16),
        "parent_id": np.asarray(shape.parents, dtype=np.int16),
        "depth": np.asarray(shape.depths, dtype=np.int8),
        "sibling_rank": np.asarray(shape.ranks, dtype=np.int16),
        "token_id": host(scores.tokens).astype(np.int32),
        "p_draft": host(q_t),
        "p_target": host(p_t),
        "alpha": host(torch.clamp(p_t / q_t, max=1.0)),
        "greedy_accept": host(greedy),
        "target_entropy": host(target_entropy[node_ctx].double()),
        "draft_entropy": host(draft_entropy[node_ctx].double()),
        "target_top1_prob": host(top2[node_ctx, 0].double()),
        "target_margin": host((top2[:, 0] - top2[:, 1])[node_ctx].double()),
        "kl_target_draft": host(kl[node_ctx].double()),
        "target_rank": host(_rank(p_rows, node_ctx, scores.tokens, p_node, top)).astype(np.int32),
    }
    nodes = {name: values[:n] for name, values in columns.items()}
    emitted = int(greedy_token(scores.p[0]))
    return NodeRecords(nodes, emitted, accepted_len, float(top2[0, 0] - top2[0, 1]), float(kl[0]))


def certificate_records(
    scores: StepScores, shape: TreeShape, criteria: CriteriaConfig
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Each node's certificates at its context (computed once per distinct context), and the step
    row's at the root context (the node rows carry KL and margin)."""
    contexts, index = np.unique(np.asarray(shape.parents) + 1, return_inverse=True)
    nodes, step = certificate_columns(scores.p[torch.as_tensor(contexts)], scores.q[0], criteria)
    return (
        {name: values[index] for name, values in nodes.items()},
        {k: v[0] for k, v in step.items() if k not in ("kl_target_draft", "target_margin")},
    )
