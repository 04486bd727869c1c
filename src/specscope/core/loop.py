"""Speculative decoding's loop: prefill -> draft -> verify -> accept -> commit the accepted path,
one request at a time (B = 1, as gpt-fast and Medusa do).

One step, for a context of L tokens whose first L - 1 sit in the target's KV cache:

    draft   -> feed the draft the tokens its cache lacks, then grow the tree level by level, each
               level's frontier in ONE batched call (4D tree mask, positions L + depth - 1); or,
               with a model-free drafter (``lookup``), the chain it proposes from the context
    verify  -> the target scores the last context token and the tree's nodes in ONE pass
    accept  -> an :class:`Acceptor` picks the accepted path and the token after it
    commit  -> keep the accepted path's cache entries, drop the rest; append the path and the
               token after it (:meth:`Speculator.commit_path`)

The stages' model passes are :mod:`specscope.core.stages`, which batched measurement
(:mod:`specscope.core.batch`) runs with B rows; the two drivers differ in their commit: decoding
commits a path per request, measurement the target's greedy token per row. The acceptors, greedy
and sampled verification, are :mod:`specscope.decode`'s. This module does not write records.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from ..drafters import Lookup
from ..errors import SpecscopeError
from ..trees import DynamicTree, TreeShape, cut_depth
from . import stages
from .draft import ChildRule, DraftTree, draft_dynamic, draft_static
from .passes import feed_one, keep_positions, position_limit, prefill
from .sampling import next_token


class DecodeError(SpecscopeError, ValueError):
    """A decoding request that cannot be served; the message says why."""


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0
    min_path_prob: float = 0.0  # stop growing the tree when no frontier path is this likely (draft)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise DecodeError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise DecodeError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise DecodeError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_path_prob < 1:
            raise DecodeError(f"min_path_prob must be in [0, 1), got {self.min_path_prob}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Step:
    """One verification step (or one plain-decoding token): the figures decoding and measurement
    both record (measurement's step rows are these plus certificates)."""

    step: int
    context_len: int
    tree_size: int
    accepted_len: int  # tree nodes the target accepts
    tau: int  # tokens per step: accepted_len + 1 (before truncation at EOS / budget)
    emitted_token: int  # the first token the step committed
    draft_time_s: float
    verify_time_s: float
    step_time_s: float


@dataclass
class DecodeResult:
    tokens: list[int]  # generated tokens (an EOS that stopped generation included)
    steps: list[Step]
    stop_reason: str  # "eos" or "max_new_tokens"
    time_s: float
    prompt_tokens: int

    @property
    def mean_tau(self) -> float:
        return sum(s.tau for s in self.steps) / len(self.steps) if self.steps else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.time_s if self.time_s > 0 else float("nan")


@dataclass
class Session:
    """One prompt in flight: its tokens and both caches.

    The target cache holds ``tokens[:-1]``; the draft cache (None without a draft model) holds
    ``tokens[:draft_len]`` (it may lag when it did not feed the whole accepted path) and, during a
    step, the tree nodes in ``fed`` order.
    """

    tokens: list[int]
    target_cache: object
    draft_cache: object
    draft_len: int
    generator: torch.Generator
    fed: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Accepted:
    """What the accept stage decided: the accepted nodes, root to deepest, and the token committed
    after them."""

    path: list[int]
    bonus: int


class Acceptor(Protocol):
    """The accept stage: how children are drafted, and which path the target accepts."""

    rule: ChildRule

    def accept(self, s: Session, tree: DraftTree, logits: torch.Tensor) -> Accepted: ...


@dataclass
class Speculator:
    """A drafter and a target model; the stages of one speculation step, and the loop.

    The drafter is a draft model (``draft``), or a model-free ``lookup`` with ``draft`` None: it
    proposes one chain, whose tokens are point masses (no q), and a step where it proposes nothing
    is a plain decoding step.
    """

    draft: torch.nn.Module | None
    target: torch.nn.Module
    vocab: int
    eos: frozenset[int] = frozenset()
    lookup: Lookup | None = None

    def __post_init__(self) -> None:
        if (self.draft is None) == (self.lookup is None):
            raise DecodeError("a speculator needs exactly one of a draft model and a lookup")

    # prefill ----------------------------------------------------------------------------------

    def check_fits(self, prompt: Sequence[int], max_new_tokens: int, depth: int) -> None:
        if not prompt:
            raise DecodeError("the prompt has no tokens")
        limit = position_limit(*(m for m in (self.draft, self.target) if m is not None))
        need = len(prompt) + max_new_tokens + depth
        if need > limit:
            raise DecodeError(
                f"the prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) + "
                f"the tree's depth ({depth}) need {need} positions; the models allow {limit}"
            )

    def prefill(self, prompt: Sequence[int], seed: int) -> tuple[Session, torch.Tensor]:
        """Both caches for ``prompt`` (the draft's without the last token) and the target's
        logits [vocab] at the prompt's end."""
        prompt = list(prompt)
        target_cache, logits = prefill(self.target, prompt, logits=True)
        draft_cache = None if self.draft is None else prefill(self.draft, prompt[:-1])[0]
        s = Session(
            prompt, target_cache, draft_cache, len(prompt) - 1, torch.Generator().manual_seed(seed)
        )
        return s, logits[: self.vocab]

    # draft --------------------------------------------------------------------------------------

    def draft_root(self, s: Session) -> torch.Tensor:
        """Feed the draft the tokens its cache lacks; logits [vocab] at the whole context."""
        ids = torch.tensor([s.tokens[s.draft_len :]])
        logits = stages.draft_context(
            self.draft, s.draft_cache, ids, torch.ones(1, s.draft_len, dtype=torch.bool), self.vocab
        )
        s.draft_len = len(s.tokens)
        s.fed = []
        return logits[0]

    def draft_level(
        self, s: Session, nodes: list[int], tokens: torch.Tensor, anc: torch.Tensor
    ) -> torch.Tensor:
        """Feed ``nodes`` (one tree level) to the draft in one call; their logits [F, vocab]."""
        L = len(s.tokens)
        logits = stages.draft_level(
            self.draft,
            s.draft_cache,
            tokens[None],
            nodes,
            s.fed,
            anc,
            torch.ones(1, L, dtype=torch.bool),
            torch.tensor([L]),
            self.vocab,
        )
        s.fed.extend(nodes)
        return logits[0]

    def draft_tree(
        self, s: Session, spec: TreeShape | DynamicTree, rule: ChildRule
    ) -> DraftTree | None:
        """The step's tree; None when a model-free drafter proposes nothing."""
        if self.lookup is not None:
            return self.propose(s, len(spec))
        root = self.draft_root(s)
        feed_level = lambda *a: self.draft_level(s, *a)  # noqa: E731
        if isinstance(spec, DynamicTree):
            return draft_dynamic(spec, root, feed_level, rule, s.fed)
        return draft_static(spec, root, feed_level, rule, s.generator, s.fed)

    def propose(self, s: Session, k: int) -> DraftTree | None:
        """A model-free drafter's chain of at most ``k`` tokens: point-mass proposals, nothing in
        a draft cache."""
        chain = self.lookup(s.tokens, k)
        if not chain:
            return None
        n = len(chain)
        tokens = torch.tensor(chain, dtype=torch.long)
        return DraftTree(TreeShape.chain(n), tokens, None, [0] * n, [-1] * n)

    # verify -------------------------------------------------------------------------------------

    def verify(self, s: Session, tree: DraftTree) -> torch.Tensor:
        """Target logits [1 + N, vocab]: at the context, and at the context extended by each
        node, in one pass over the target's cache."""
        L = len(s.tokens)
        assert s.target_cache.get_seq_length() == L - 1, "the target cache must hold tokens[:-1]"
        logits = stages.verify(
            self.target,
            s.target_cache,
            torch.tensor([s.tokens[-1:]]),
            tree.tokens[None],
            list(range(len(tree.shape))),
            tree.shape.ancestor_mask(),
            torch.ones(1, L - 1, dtype=torch.bool),
            torch.tensor([L]),
            self.vocab,
        )
        return logits[0]

    # commit -------------------------------------------------------------------------------------

    def commit_path(self, s: Session, tree: DraftTree, accepted: Accepted) -> list[int]:
        """Keep the accepted path in both caches; append its tokens and the bonus token."""
        L = len(s.tokens)
        keep_positions(s.target_cache, list(range(L)) + [L + n for n in accepted.path])
        in_draft = []
        for n in accepted.path:  # the draft holds a prefix of the path (nodes it fed)
            if tree.draft_slot[n] < 0:
                break
            in_draft.append(L + tree.draft_slot[n])
        if s.draft_cache is not None:
            keep_positions(s.draft_cache, list(range(L)) + in_draft)
        s.draft_len = L + len(in_draft)
        emitted = [int(tree.tokens[n]) for n in accepted.path] + [int(accepted.bonus)]
        s.tokens.extend(emitted)
        return emitted

    # the loop -----------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(
        self,
        prompt: Sequence[int],
        spec: TreeShape | DynamicTree,
        config: DecodeConfig,
        acceptor: Acceptor,
    ) -> DecodeResult:
        """Speculate over ``prompt`` until EOS or ``config.max_new_tokens``. The first token comes
        from the prefill, as in plain decoding; trees are cut to the tokens still wanted."""
        t_start = time.perf_counter()
        self.check_fits(prompt, config.max_new_tokens, spec.max_depth)
        s, first_logits = self.prefill(prompt, config.seed)
        first = next_token(first_logits, self.vocab, config.temperature, config.top_p, s.generator)
        s.tokens.append(first)
        prefill_s = time.perf_counter() - t_start
        steps = [Step(0, len(prompt), 0, 0, 1, first, 0.0, prefill_s, prefill_s)]
        out, stop = _append([], [first], config.max_new_tokens, self.eos)
        while len(out) < config.max_new_tokens and stop != "eos":
            t0 = time.perf_counter()
            depth = max(1, config.max_new_tokens - len(out) - 1)  # the bonus token is free
            tree_spec = (
                replace(spec, depth=min(spec.depth, depth))
                if isinstance(spec, DynamicTree)
                else cut_depth(spec, depth)
            )
            tree = self.draft_tree(s, tree_spec, acceptor.rule)
            t1 = time.perf_counter()
            context_len = len(s.tokens)
            if tree is None:  # nothing proposed: a plain decoding step
                logits = feed_one(self.target, s.target_cache, s.tokens[-1])
                t2 = time.perf_counter()
                rule = acceptor.rule
                emitted = [
                    next_token(logits, self.vocab, rule.temperature, rule.top_p, s.generator)
                ]
                s.tokens.extend(emitted)
                accepted = Accepted([], emitted[0])
            else:
                logits = self.verify(s, tree)
                t2 = time.perf_counter()
                accepted = acceptor.accept(s, tree, logits)
                emitted = self.commit_path(s, tree, accepted)
            steps.append(
                Step(
                    len(steps),
                    context_len,
                    0 if tree is None else len(tree.shape),
                    len(accepted.path),
                    len(accepted.path) + 1,
                    emitted[0],
                    t1 - t0,
                    t2 - t1,
                    time.perf_counter() - t0,
                )
            )
            out, stop = _append(out, emitted, config.max_new_tokens, self.eos)
        return DecodeResult(out, steps, stop, time.perf_counter() - t_start, len(prompt))


def _append(out: list[int], emitted: list[int], budget: int, eos) -> tuple[list[int], str]:
    """Extend ``out`` with ``emitted``, cut after the first EOS or at the token budget."""
    for token in emitted:
        if len(out) == budget:
            break
        out = out + [token]
        if token in eos:
            return out, "eos"
    return out, "max_new_tokens"


@torch.inference_mode()
def plain_generate(
    model: torch.nn.Module, prompt: Sequence[int], config: DecodeConfig, vocab: int, eos=frozenset()
) -> DecodeResult:
    """Token-by-token decoding with a KV cache: greedy, or sampling at ``config.temperature``."""
    if not prompt:
        raise DecodeError("the prompt has no tokens")
    t_start = time.perf_counter()
    generator = torch.Generator().manual_seed(config.seed)
    cache, logits = prefill(model, prompt, logits=True)
    out: list[int] = []
    steps: list[Step] = []
    stop = "max_new_tokens"
    t0 = t_start
    while True:
        token = next_token(logits, vocab, config.temperature, config.top_p, generator)
        t1 = time.perf_counter()
        steps.append(
            Step(len(steps), len(prompt) + len(out), 0, 0, 1, token, 0.0, t1 - t0, t1 - t0)
        )
        out.append(token)
        if token in eos:
            stop = "eos"
            break
        if len(out) == config.max_new_tokens:
            break
        t0 = time.perf_counter()
        logits = feed_one(model, cache, token)
    return DecodeResult(out, steps, stop, time.perf_counter() - t_start, len(prompt))
