"""The measurement loop: grow a draft tree, score it with the target, record every node.

One step of the paper protocol (README: "What a run measures"), for a context of L tokens:

    draft   -> the draft's distribution q at the context gives the roots; each deeper level's
               frontier (nodes that get children) is drafted in ONE batched call
    verify  -> the target scores the whole tree in ONE pass; row "root" gives p at the context,
               row of node i gives p at the context extended by the path to i
    record  -> per node: q and p of its token at its context, alpha, greedy acceptance, entropies...
    commit  -> append the target's greedy token at the context; the trajectory is the target's
               plain greedy output

Two engines implement draft and verify and give the same records:

- ``CachedEngine`` (default): prefix KV caches for both models. The draft feeds each frontier with
  a 4D tree mask over [prefix cache + earlier tree nodes]; the target feeds [new context token +
  tree nodes] over its prefix cache with a 4D tree mask and position ids = prefix length +
  depth - 1 (leaves only when their own rows are wanted: a node's p comes from its parent's row). Tree entries are dropped from both caches after each step.
- ``NaiveEngine``: the paper's algorithm, every row recomputed from scratch (``use_cache=False``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .trees import TreeShape

ENGINES = ("cached", "naive")


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

    @classmethod
    def on(cls, device, tokens, q, q_index, p, draft_time_s, verify_time_s) -> StepScores:
        """Gather the draft's and the target's outputs on one device (they may live on two)."""
        return cls(tokens.to(device), q.to(device), q_index.to(device), p, draft_time_s,
                   verify_time_s)


def softmax(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.softmax(logits[..., :vocab].float(), dim=-1)


def greedy_token(scores: torch.Tensor) -> torch.Tensor:
    """The greedy choice at each row of logits or probabilities: the argmax, and on an exact tie
    (common in bfloat16) the lowest token id. The one tie rule of specscope: the recorded
    ``greedy_accept``, ``target_rank`` and emitted token, and the decoder's verifier, all use it."""
    return scores.argmax(dim=-1)


def grow_tree(shape: TreeShape, root_q: torch.Tensor, expand,
              stop=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Choose every node's token, depth by depth, from the draft distribution at its parent.

    ``root_q`` [1, V] is q at the root context; ``expand(frontier, tokens)`` returns q [F, V] at
    the contexts extended by each frontier node (nodes of the current depth that have children),
    in one batched draft call. Returns tokens [N], q rows [C, V] and each node's q row [N].
    ``stop(frontier, tokens)``, if given, is asked before each expansion; when it returns True the
    growth ends and the returned tensors cover the nodes grown so far (a breadth-first prefix).
    """
    q, row = root_q, {-1: 0}
    tokens = torch.empty(len(shape), dtype=torch.long, device=root_q.device)
    for depth in range(1, shape.max_depth + 1):
        level = list(shape.nodes_at_depth(depth))
        parent_rows = q[[row[shape.parents[n]] for n in level]]
        top = torch.topk(parent_rows, max(shape.ranks[n] for n in level) + 1, dim=-1).indices
        tokens[level] = top[torch.arange(len(level)), [shape.ranks[n] for n in level]]
        frontier = [n for n in level if shape.children[n]]
        if frontier and stop is not None and stop(frontier, tokens):
            grown = max(level) + 1
            return tokens[:grown], q, torch.tensor([row[p] for p in shape.parents[:grown]])
        if frontier:
            row.update({n: len(q) + j for j, n in enumerate(frontier)})
            q = torch.cat([q, expand(frontier, tokens)])
    return tokens, q, torch.tensor([row[p] for p in shape.parents])


def crop(cache, length: int) -> None:
    """Drop cache entries past ``length`` (works with the old and new ``crop`` conventions)."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def additive_mask(visible_past: torch.Tensor, block: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, Q, past + Q] additive attention mask from boolean visibility of past and new tokens."""
    allowed = torch.cat([visible_past, block], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def feed(model, cache, ids: list[int] | torch.Tensor, positions: torch.Tensor,
         visible_past: torch.Tensor, block: torch.Tensor, last: int = 0) -> torch.Tensor:
    """Run ``ids`` [Q] over ``cache`` with a 4D mask and explicit positions; logits [Q, V'].

    ``visible_past`` [Q, cached] and ``block`` [Q, Q] say which cached and which new tokens each
    new token may attend to; ``positions`` [Q] are the position ids. The cache grows by Q entries.
    ``last`` > 0 computes the logits of the last ``last`` tokens only.
    """
    dev = model.device
    ids = torch.as_tensor(ids, device=dev).view(1, -1)
    mask = additive_mask(visible_past.to(dev), block.to(dev), model.dtype)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, attention_mask=mask,
                position_ids=positions.to(dev).view(1, -1), logits_to_keep=last)
    return out.logits[0]

@dataclass
class CachedEngine:
    """Prefix KV caches for both models; the whole tree scored in one target pass."""

    draft: torch.nn.Module
    target: torch.nn.Module
    vocab: int
    leaf_rows: bool = False  # also score the leaves' own rows (the bonus token of a decoder)
    _draft_cache: object = field(default=None, init=False)
    _target_cache: object = field(default=None, init=False)
    _cached_len: int = field(default=0, init=False)  # tokens both caches hold (context minus last)

    def reset(self, context: list[int]) -> None:
        """Start a new prompt: prefill both caches with all context tokens but the last."""
        from transformers import DynamicCache

        self._draft_cache = DynamicCache(config=self.draft.config)
        self._target_cache = DynamicCache(config=self.target.config)
        self._cached_len = 0
        if len(context) > 1:
            for model, cache in ((self.draft, self._draft_cache), (self.target, self._target_cache)):
                ids = torch.tensor([context[:-1]], device=model.device)
                model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            self._cached_len = len(context) - 1

    def _feed(self, model, cache, ids: list[int] | torch.Tensor, positions: torch.Tensor,
              visible_past: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        return feed(model, cache, ids, positions, visible_past, block)

    @torch.inference_mode()
    def score(self, context: list[int], shape: TreeShape) -> StepScores:
        L, N = len(context), len(shape)
        # Catch up: feed every context token the caches lack (one, after the first step).
        new = context[self._cached_len:]
        causal = torch.ones(len(new), len(new), dtype=torch.bool).tril()
        past = torch.ones(len(new), self._cached_len, dtype=torch.bool)
        positions = torch.arange(self._cached_len, L)
        anc = shape.ancestor_mask()  # [N, N]
        depths = torch.tensor(shape.depths)

        t0 = time.perf_counter()
        logits = self._feed(self.draft, self._draft_cache, new, positions, past, causal)
        fed: list[int] = []  # tree nodes in the draft cache, in cache order

        def expand(frontier: list[int], tokens: torch.Tensor) -> torch.Tensor:
            visible = torch.cat([torch.ones(len(frontier), L, dtype=torch.bool),
                                 anc[frontier][:, fed]], dim=1)
            out = self._feed(self.draft, self._draft_cache, tokens[frontier],
                             L + depths[frontier] - 1, visible, anc[frontier][:, frontier])
            fed.extend(frontier)
            return softmax(out, self.vocab)

        tokens, q, q_index = grow_tree(shape, softmax(logits[-1:], self.vocab), expand)
        t1 = time.perf_counter()

        # Verify: the new context token(s) and the tree in one target pass. A node's target row
        # is p at the context extended by its path: the distribution its children are scored
        # under. Leaves have no children, so their rows are only computed with ``leaf_rows``.
        scored = list(range(N)) if self.leaf_rows else [n for n in range(N) if shape.children[n]]
        visible = torch.cat([
            torch.cat([past, causal], dim=1),
            torch.ones(len(scored), L, dtype=torch.bool),
        ])
        block = torch.cat([torch.zeros(len(new), len(scored), dtype=torch.bool),
                           anc[scored][:, scored]])
        ids = torch.cat([torch.tensor(new), tokens[scored].cpu()])
        pos = torch.cat([positions, L + depths[scored] - 1])
        logits = self._feed(self.target, self._target_cache, ids, pos, visible, block)
        p = torch.full((N + 1, self.vocab), float("nan"), device=logits.device)
        p[[0] + [n + 1 for n in scored]] = softmax(logits[len(new) - 1:], self.vocab)
        t2 = time.perf_counter()

        crop(self._draft_cache, L)
        crop(self._target_cache, L)
        self._cached_len = L
        return StepScores.on(p.device, tokens, q, q_index, p, t1 - t0, t2 - t1)

    def advance(self, token: int) -> None:
        """Nothing to do: the next ``score`` feeds the appended token."""


@dataclass
class NaiveEngine:
    """The paper's algorithm: every draft and target row recomputed with ``use_cache=False``."""

    draft: torch.nn.Module
    target: torch.nn.Module
    vocab: int

    def reset(self, context: list[int]) -> None:
        pass

    def advance(self, token: int) -> None:
        pass

    @staticmethod
    def _rows(model, rows: list[list[int]]) -> torch.Tensor:
        """Right-padded batch forward; causal attention keeps padding out of real positions."""
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attn = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            attn[i, : len(r)] = 1
        return model(input_ids=ids.to(model.device), attention_mask=attn.to(model.device),
                     use_cache=False).logits

    @torch.inference_mode()
    def score(self, context: list[int], shape: TreeShape) -> StepScores:
        L, N = len(context), len(shape)
        t0 = time.perf_counter()

        def path(n: int, tokens: torch.Tensor) -> list[int]:
            out = []
            while n >= 0:
                out.append(int(tokens[n]))
                n = shape.parents[n]
            return out[::-1]

        def expand(frontier: list[int], tokens: torch.Tensor) -> torch.Tensor:
            logits = self._rows(self.draft, [context + path(n, tokens) for n in frontier])
            return softmax(logits[:, L + shape.depths[frontier[0]] - 1], self.vocab)

        root = self._rows(self.draft, [context])[0, -1:]
        tokens, q, q_index = grow_tree(shape, softmax(root, self.vocab), expand)
        t1 = time.perf_counter()

        # One batch: the context alone, then the context extended by each root-to-leaf path.
        leaf_paths = shape.leaf_paths()
        logits = self._rows(self.target, [context] + [context + path(leaf[-1], tokens) for leaf in leaf_paths])
        p_rows = torch.empty(N + 1, logits.shape[-1], device=logits.device)
        p_rows[0] = logits[0, L - 1]
        for row, leaf in enumerate(leaf_paths, start=1):
            for n in leaf:
                p_rows[n + 1] = logits[row, L - 1 + shape.depths[n]]
        p = softmax(p_rows, self.vocab)
        t2 = time.perf_counter()
        return StepScores.on(p.device, tokens, q, q_index, p, t1 - t0, t2 - t1)


def make_engine(name: str, draft, target, vocab: int):
    if name == "cached":
        return CachedEngine(draft, target, vocab)
    if name == "naive":
        return NaiveEngine(draft, target, vocab)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")


# --- records of one step ------------------------------------------------------------------------


def _rank(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Each token's rank under its row (0 = the greedy token), ties ordered by token id as in
    :func:`greedy_token`."""
    p_t = probs.gather(1, tokens.view(-1, 1))
    ids = torch.arange(probs.shape[-1], device=probs.device)
    return ((probs > p_t) | ((probs == p_t) & (ids < tokens.view(-1, 1)))).sum(-1)


@dataclass
class StepRecord:
    """Column arrays of one step's node rows, and the step's own figures."""

    nodes: dict[str, np.ndarray]
    emitted_token: int
    accepted_len: int


def step_record(scores: StepScores, shape: TreeShape) -> StepRecord:
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

    accepted = greedy.clone()
    for n in range(N):  # breadth-first: parents are settled before children
        if shape.parents[n] >= 0:
            accepted[n] &= accepted[shape.parents[n]]
    depths = torch.tensor(shape.depths, device=accepted.device)
    accepted_len = int(depths[accepted].max()) if bool(accepted.any()) else 0

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
    return StepRecord(nodes=nodes, emitted_token=emitted, accepted_len=accepted_len)
