"""What measurement observes at each step: the draft's and the target's distributions over a
tree, turned into one row per node (README: "Records") and the step's own figures.

:class:`StepScores` is what a step's draft and verify stages produced, whichever engine ran them
(the speculation loop, the batched engine, or the naive oracle); :func:`step_record` turns it into
node columns; :func:`observe_step` adds certificates and keeps them with the prompt. This module
runs no model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..core.draft import DraftTree
from ..core.passes import greedy_token, softmax
from ..records import tree_paths
from ..theory import CriteriaConfig, node_certificate_columns, step_criteria_columns
from ..trees import TreeShape


@dataclass
class StepScores:
    """What one step's draft and verify passes produced.

    Context index 0 is the root context (the current prefix); context ``i + 1`` is the prefix
    extended by the path to node ``i``. Only contexts that have children carry a draft row.
    """

    tokens: torch.Tensor  # [N] long: the tree's tokens
    q: torch.Tensor  # [C, V] float32: draft probabilities at contexts 0 and 1 + non-leaf nodes
    q_index: torch.Tensor  # [N] long: row of q at each node's context (its parent's context)
    p: torch.Tensor  # [N + 1, V] float32: target probabilities at every context (NaN rows for
    #                 leaves, whose contexts have no children, unless the engine scored them)
    draft_time_s: float
    verify_time_s: float

    def on(self, device) -> StepScores:
        """The draft's outputs moved to the target's device (the models may live on two)."""
        return StepScores(self.tokens.to(device), self.q.to(device), self.q_index.to(device),
                          self.p, self.draft_time_s, self.verify_time_s)


def tree_scores(tree: DraftTree, logits: torch.Tensor, nodes: list[int], vocab: int,
                draft_time_s: float = 0.0, verify_time_s: float = 0.0) -> StepScores:
    """A drafted tree (its q rows kept) and the target's logits at the root and at ``nodes``, as
    :class:`StepScores`; the rows of nodes not scored are NaN."""
    p = torch.full((len(tree.shape) + 1, vocab), float("nan"), device=logits.device)
    p[[0] + [n + 1 for n in nodes]] = softmax(logits, vocab)
    return StepScores(tree.tokens, tree.proposals, torch.tensor(tree.proposal_row), p,
                      draft_time_s, verify_time_s).on(p.device)


def _rank(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Each token's rank under its row (0 = the greedy token), ties ordered by token id as in
    :func:`greedy_token`."""
    p_t = probs.gather(1, tokens.view(-1, 1))
    ids = torch.arange(probs.shape[-1], device=probs.device)
    return ((probs > p_t) | ((probs == p_t) & (ids < tokens.view(-1, 1)))).sum(-1)


@dataclass
class NodeRecords:
    """Column arrays of one step's node rows, and what the target accepts and emits."""

    nodes: dict[str, np.ndarray]
    emitted_token: int
    accepted_len: int


def step_record(scores: StepScores, shape: TreeShape) -> NodeRecords:
    """Per-node figures (README: "Records") from one step's draft and target distributions.

    Siblings share a context, so the distribution-wide figures (entropies, KL, top-2, argmax) are
    computed once per context and indexed per node.
    """
    N = len(shape)
    contexts, inverse = np.unique(np.asarray(shape.parents) + 1, return_inverse=True)
    first = [int(np.flatnonzero(inverse == c)[0]) for c in range(len(contexts))]
    node_ctx = torch.as_tensor(inverse, device=scores.p.device)
    p_rows = scores.p[torch.as_tensor(contexts, device=scores.p.device)]  # [C, V]
    q_rows = scores.q[scores.q_index[first]]  # [C, V]: q at the same contexts
    log_p, log_q = torch.log(p_rows.clamp_min(1e-30)), torch.log(q_rows.clamp_min(1e-30))
    target_entropy = -(p_rows * log_p).sum(-1)
    draft_entropy = -(q_rows * log_q).sum(-1)
    kl = (p_rows * (log_p - log_q)).sum(-1)
    top2 = torch.topk(p_rows, 2, dim=-1).values  # values only: ties are settled by greedy_token
    tok = scores.tokens.view(N, 1)
    p_t = p_rows[node_ctx].gather(1, tok).squeeze(1).double()
    q_t = q_rows[node_ctx].gather(1, tok).squeeze(1).double()
    greedy = greedy_token(p_rows)[node_ctx] == scores.tokens

    parents, depths = np.asarray(shape.parents), np.asarray(shape.depths)
    accepted = tree_paths(greedy.cpu().numpy(), depths, np.asarray(shape.ranks), parents < 0,
                          parents).accepted
    accepted_len = int(depths[accepted].max(initial=0))

    def host(x: torch.Tensor) -> np.ndarray:
        return x.cpu().numpy()

    nodes = {
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
        "target_rank": host(_rank(p_rows[node_ctx], scores.tokens)).astype(np.int32),
    }
    emitted = int(greedy_token(scores.p[0]))
    return NodeRecords(nodes=nodes, emitted_token=emitted, accepted_len=accepted_len)


def context_certificates(scores: StepScores, shape: TreeShape,
                         criteria: CriteriaConfig) -> dict[str, np.ndarray]:
    """Each node's certificates at its context, computed once per distinct context."""
    contexts, index = np.unique(np.asarray(shape.parents) + 1, return_inverse=True)
    columns = node_certificate_columns(scores.p[torch.as_tensor(contexts)], criteria)
    return {name: values[index] for name, values in columns.items()}


def step_certificates(scores: StepScores, criteria: CriteriaConfig) -> dict[str, float]:
    """The step row's certificates at the root context (the node rows carry KL and margin)."""
    return {k: v[0] for k, v in step_criteria_columns(scores.p[0], scores.q[0], criteria).items()
            if k not in ("kl_target_draft", "target_margin")}
