"""B prompts measured together: their rows, their batched caches, and one step's draft and verify.

Both models keep one batched KV cache in which each row holds its prompt's context but the newest
token, right-aligned after padding slots; ``valid`` [B, T] marks which slots are real, and every
pass gets explicit position ids and a 4D mask per row, so a row attends to exactly what it would
attend to alone. A step (:meth:`Batch.score`) runs the stages of :mod:`specscope.core.stages`
for every row: the newest context token to the draft, each tree level to the draft, the tree
pass to the target; then each row's commit keeps its context and drops the tree entries. The
measurement driver (:mod:`specscope.measure.study`) then appends each row's greedy token.

When a prompt finishes, its row is refilled with the next prompt (:meth:`Batch.refill`): the new
prompt is prefilled alone and the caches are repacked (valid entries only, right-aligned), which
also drops the padding that finished prompts leave behind; rows without a next prompt are dropped.

Every row drafts one static :class:`~specscope.trees.TreeShape` with the draft's top tokens as
children, or, with a model-free drafter (``lookup``, no draft model), the chain it proposes from
the row's context: up to the shape's length, the rest padded and left out of the row's records
(:attr:`StepScores.proposed`). Dynamic trees (EAGLE-2) and sampled children are decoding's only
(:mod:`specscope.core.loop`): their shapes and draws would differ per row. Up to the rounding of
batched kernels (float32: probabilities within 1e-5), a row's figures are those of its prompt
measured alone; with the batch-invariant int8 pair they are the same bits. This module writes no
records and decides nothing about prompts (:mod:`specscope.measure.study` does).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..drafters import Lookup
from ..trees import TreeShape
from .draft import grow_tree
from .passes import gather_rows, keep_positions, prefill, softmax
from .stages import draft_context, draft_level, verify


@dataclass
class StepScores:
    """What one step's draft and verify passes produced for one prompt.

    Context index 0 is the root context (the current prefix); context ``i + 1`` is the prefix
    extended by the path to node ``i``. Only contexts that have children carry a draft row.
    """

    tokens: torch.Tensor  # [N] long: the tree's tokens
    q: torch.Tensor | None  # [C, V] float32: draft probabilities at contexts 0 and 1 + non-leaf
    #                        nodes; None: point-mass proposals (a model-free drafter)
    q_index: torch.Tensor  # [N] long: row of q at each node's context (its parent's context)
    p: torch.Tensor  # [N + 1, V] float32: target probabilities at every context (NaN rows for
    #                 leaves, whose contexts have no children and are not scored)
    draft_time_s: float
    verify_time_s: float
    proposed: int  # the drafter proposed nodes 0 .. proposed - 1 (a breadth-first prefix)

    def on(self, device) -> StepScores:
        """The draft's outputs moved to the target's device (the models may live on two)."""
        return StepScores(
            self.tokens.to(device),
            None if self.q is None else self.q.to(device),
            self.q_index.to(device),
            self.p,
            self.draft_time_s,
            self.verify_time_s,
            self.proposed,
        )


@dataclass
class Row:
    """One prompt in flight: its context and what the caller keeps with it."""

    context: list[int]
    payload: object  # the caller's state for this prompt (records so far, item, ...)


@dataclass
class Batch:
    """B prompts' rows and both models' batched caches (the target's alone when ``lookup``, a
    model-free drafter, drafts: ``draft`` None)."""

    draft: torch.nn.Module | None
    target: torch.nn.Module
    vocab: int
    lookup: Lookup | None = None
    rows: list[Row] = field(default_factory=list)
    draft_cache: object = field(default=None, init=False)
    target_cache: object = field(default=None, init=False)
    valid: torch.Tensor = field(
        default_factory=lambda: torch.zeros(0, 0, dtype=torch.bool), init=False
    )  # [B, T] bool: the cache slots that are context

    @torch.inference_mode()
    def refill(self, keep: list[int], new: list[Row]) -> None:
        """Keep the rows at indices ``keep`` (in that order), append ``new`` rows (prefilled
        here), and repack both caches: valid entries only, right-aligned."""
        kept = [self.valid[i].nonzero().flatten() for i in keep]
        for name in ("draft", "target"):
            model, cache = getattr(self, name), getattr(self, f"{name}_cache")
            if model is None:
                continue
            rows = [(cache, i, index) for i, index in zip(keep, kept)]
            for row in new:
                fresh, _ = prefill(model, row.context[:-1])
                rows.append((fresh, 0, torch.arange(len(row.context) - 1)))
            packed, self.valid = gather_rows(model, rows)
            setattr(self, f"{name}_cache", packed)
        self.rows = [self.rows[i] for i in keep] + list(new)

    @torch.inference_mode()
    def score(self, shape: TreeShape) -> list[StepScores]:
        """Draft and verify one tree per row, then drop the tree from the caches; each row's
        context ends with its newest token, which the caches do not hold yet."""
        B, N = len(self.rows), len(shape)
        T = self.valid.shape[1]
        lengths = torch.tensor([len(r.context) for r in self.rows])
        newest = torch.tensor([[r.context[-1]] for r in self.rows])  # [B, 1]
        anc = shape.ancestor_mask()
        context = torch.cat([self.valid, torch.ones(B, 1, dtype=torch.bool)], dim=1)  # [B, T + 1]

        t0 = time.perf_counter()
        if self.lookup is not None:
            tokens, q, q_index, proposed = self.propose(N)
        else:
            tokens, q, q_index = self.draft_tree(shape, anc, context, lengths, newest)
            proposed = [N] * B
        t1 = time.perf_counter()

        scored = [n for n in range(N) if shape.children[n]]
        logits = verify(
            self.target,
            self.target_cache,
            newest,
            tokens.cpu(),
            scored,
            anc,
            self.valid,
            lengths,
            self.vocab,
        )
        p = torch.empty(B, N + 1, self.vocab, device=logits.device)
        p[:, [0] + [n + 1 for n in scored]] = softmax(logits, self.vocab)
        p[:, [n + 1 for n in shape.leaves]] = float("nan")  # no children: never read
        t2 = time.perf_counter()

        for cache in (self.draft_cache, self.target_cache):  # the commit: each row's context
            if cache is not None:
                keep_positions(cache, torch.arange(T + 1))
        self.valid = context
        share = 1 / B  # a batched pass's time is shared by its rows
        return [  # on p's device: a model-free drafter's tokens are on the CPU
            StepScores(
                tokens[b],
                None if q is None else q[b],
                q_index,
                p[b],
                (t1 - t0) * share,
                (t2 - t1) * share,
                proposed[b],
            ).on(p.device)
            for b in range(B)
        ]

    def draft_tree(self, shape, anc, context, lengths, newest):
        """The draft stage with a draft model: every row's tree of its top tokens, level by
        level; tokens [B, N], q [B, C, V] and each node's row of q [N]."""
        root = draft_context(self.draft, self.draft_cache, newest, self.valid, self.vocab)
        fed: list[int] = []

        def expand(frontier: list[int], tokens: torch.Tensor) -> torch.Tensor:
            logits = draft_level(
                self.draft,
                self.draft_cache,
                tokens,
                frontier,
                fed,
                anc,
                context,
                lengths,
                self.vocab,
            )
            fed.extend(frontier)
            return torch.softmax(logits, dim=-1)

        return grow_tree(shape, torch.softmax(root, dim=-1), expand)

    def propose(self, n: int):
        """The draft stage without a model: each row's chain from ``lookup``, cut to ``n`` tokens
        and padded with token 0 (verified, never recorded); no q (point masses)."""
        tokens = torch.zeros(len(self.rows), n, dtype=torch.long)
        proposed = []
        for b, row in enumerate(self.rows):
            chain = self.lookup(row.context, n)
            tokens[b, : len(chain)] = torch.tensor(chain, dtype=torch.long)
            proposed.append(len(chain))
        return tokens, None, torch.arange(n), proposed
