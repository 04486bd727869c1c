"""The model passes of one speculation step, written once for B rows (B = 1: one prompt).

    draft the context -> the draft reads each row's newest context tokens (those its cache lacks)
    draft one level   -> the draft reads one tree level, each node seeing its row's context, its
                         ancestors and itself, at position L + depth - 1
    verify            -> the target reads each row's newest context token and the tree's nodes in
                         ONE pass
    commit            -> each row keeps some cache entries (:func:`~specscope.core.passes.keep_positions`)

Every row of a pass shares one tree (its tokens differ per row); ``past`` [B, T] marks which of a
cache's first T entries are the row's context (all of them for one prompt; padding excluded when
rows of different lengths share a batched cache), and ``lengths`` [B] are the context lengths L.
Which node sees which comes from one mask, :func:`specscope.trees.ancestor_mask`.

Decoding's loop (:mod:`specscope.core.loop`) calls these with B = 1; batched measurement
(:mod:`specscope.core.batch`) with B rows. This module chooses no tokens (:mod:`~specscope.core.draft`
does) and keeps no state.
"""

from __future__ import annotations

import torch

from .passes import feed, feed_causal


def draft_context(draft, cache, ids: torch.Tensor, past: torch.Tensor, vocab: int) -> torch.Tensor:
    """Feed ``ids`` [B, Q] (each row's newest context tokens) after the entries marked in
    ``past`` [B, T]; the draft's float32 logits [B, vocab] at each row's whole context."""
    return feed_causal(draft, cache, ids, past, last=1)[:, -1, :vocab].float()


def draft_level(
    draft,
    cache,
    tokens: torch.Tensor,
    nodes: list[int],
    fed: list[int],
    anc: torch.Tensor,
    past: torch.Tensor,
    lengths: torch.Tensor,
    vocab: int,
) -> torch.Tensor:
    """Feed ``nodes`` (one tree level) of every row in one call; float32 logits [B, F, vocab].

    tokens: [B, N] the rows' tree tokens so far; anc: [N, N] the tree's ancestor mask; fed: the
    tree nodes already in the cache, in cache order, after the entries marked in past [B, T].
    """
    B, T = past.shape
    F = len(nodes)
    seen = torch.cat(
        [past[:, None, :].expand(B, F, T), anc[nodes][:, fed][None].expand(B, F, len(fed))], dim=2
    )
    positions = lengths[:, None] + anc[nodes].sum(-1)[None] - 1  # [B, F]: L + depth - 1
    logits = feed(draft, cache, tokens[:, nodes], positions, seen, anc[nodes][:, nodes])
    return logits[..., :vocab].float()


def verify(
    target,
    cache,
    newest: torch.Tensor,
    tokens: torch.Tensor,
    nodes: list[int],
    anc: torch.Tensor,
    past: torch.Tensor,
    lengths: torch.Tensor,
    vocab: int,
) -> torch.Tensor:
    """The tree pass: target logits [B, 1 + S, vocab] at each row's context (``newest`` [B, 1],
    its last token, which the cache lacks) and at the context extended by each of ``nodes`` [S]."""
    B, T = past.shape
    S = len(nodes)
    ids = torch.cat([newest, tokens[:, nodes]], dim=1)
    positions = torch.cat(
        [(lengths - 1)[:, None], lengths[:, None] + anc[nodes].sum(-1)[None] - 1], dim=1
    )
    block = torch.zeros(1 + S, 1 + S, dtype=torch.bool)
    block[:, 0] = True  # the newest context token is seen by itself and every node
    block[1:, 1:] = anc[nodes][:, nodes]
    logits = feed(target, cache, ids, positions, past[:, None, :].expand(B, 1 + S, T), block)
    return logits[..., :vocab]
