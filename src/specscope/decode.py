"""Speculative decoding for real: the loop of :mod:`specscope.core.loop` with greedy or sampled
verification (docs/guides/deploy.md).

    accept (greedy)   -> follow the child whose token is the target's argmax; the first context
                         without such a child emits the target's argmax there (the bonus token)
    accept (sampling) -> multi-round speculative sampling at each node (SpecInfer), which leaves
                         the target's (temperature, top-p) distribution unchanged

Greedy verification is lossless: the output is the target's plain greedy output, token for token
(up to floating-point ties between the tree pass and one-token passes). With sampling, a static
tree's children are drawn from the draft without replacement (Gumbel-top-k) and verified against
the draft's distribution; a dynamic tree's children are the draft's top tokens, verified as
point-mass proposals, which keeps it lossless although its shape depends on the draft.

``p_min`` (greedy, static trees and chains): llama.cpp's ``--spec-draft-p-min`` stop rule, a node
whose draft probability is below it is not drafted (:class:`~specscope.core.draft.ChildRule`);
``h_max`` the same on the entropy of the distribution a node is drawn from; replaying the
measured trees under :class:`~specscope.analysis.replay.StopRule` predicts both.

A step's ``tau`` is its accepted path plus the bonus token, as verified; the tokens a step adds to
the output, cut at EOS and ``max_new_tokens``, are :func:`emitted_per_step` (they sum to the
output's length). This module does not time methods against each other (:mod:`specscope.tune.bench`) or measure
costs (:mod:`specscope.tune.costs`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .core.draft import ChildRule, DraftTree
from .core.loop import (
    Accepted,
    DecodeConfig,
    DecodeError,
    DecodeResult,
    Session,
    Speculator,
    Step,
    plain_generate,
)
from .core.passes import greedy_token, position_limit
from .core.sampling import speculative_sample, warp
from .drafters import DrafterConfig, lookup_for
from .trees import DynamicTree, Speculation, check_depth_fits

__all__ = [
    "DecodeConfig",
    "DecodeError",
    "DecodeResult",
    "Step",
    "SpeculativeDecoder",
    "check_drafter_fits",
    "check_spec_fits",
    "make_decoder",
    "plain_generate",
    "emitted_per_step",
    "steps_frame",
    "tokens_per_step",
]


@dataclass
class GreedyAcceptor:
    """Follow the child equal to the target's argmax; the first miss is the bonus token."""

    rule: ChildRule

    def accept(self, s: Session, tree: DraftTree, logits: torch.Tensor) -> Accepted:
        best = greedy_token(logits).tolist()  # [1 + N]
        tokens = tree.tokens.tolist()
        path, node = [], -1
        while True:
            match = [c for c in tree.shape.children_of(node) if tokens[c] == best[node + 1]]
            if not match:
                return Accepted(path, best[node + 1])
            node = match[0]
            path.append(node)


@dataclass
class SampledAcceptor:
    """Speculative sampling node by node, down the tree, until a round emits its own token."""

    rule: ChildRule

    def accept(self, s: Session, tree: DraftTree, logits: torch.Tensor) -> Accepted:
        p = warp(logits, self.rule.vocab, self.rule.temperature, self.rule.top_p).cpu()
        tokens = tree.tokens.tolist()
        path, node = [], -1
        while True:
            kids = sorted(tree.shape.children_of(node), key=lambda c: tree.shape.ranks[c])
            q = (
                tree.proposals[tree.proposal_row[kids[0]]].cpu()
                if tree.proposals is not None and kids
                else None
            )
            index, token = speculative_sample(
                p[node + 1], [tokens[c] for c in kids], q, s.generator
            )
            if index is None:
                return Accepted(path, token)
            node = kids[index]
            path.append(node)


@dataclass
class SpeculativeDecoder(Speculator):
    """Generate with a draft tree (or plainly, with ``spec=None``)."""

    def generate(
        self,
        prompt: Sequence[int],
        spec: Speculation,
        config: DecodeConfig = DecodeConfig(),
        p_min: float = 0.0,
        h_max: float = math.inf,
    ) -> DecodeResult:
        """Decode ``prompt`` with ``spec`` (None: plainly); ``p_min`` > 0 stops drafting at the
        first node whose draft probability is below it, ``h_max`` at the first drawn from a
        draft distribution of higher entropy (nats; see the module's docstring)."""
        if spec is None:
            return plain_generate(self.target, prompt, config, self.vocab, self.eos)
        check_spec_fits(spec, self.vocab)
        check_stop(p_min, h_max, spec, config)
        limit = position_limit(*(m for m in (self.draft, self.target) if m is not None))
        check_depth_fits(spec.max_depth, config.max_new_tokens, limit)
        rule = ChildRule(
            self.vocab,
            config.temperature,
            config.top_p,
            min_path_prob=config.min_path_prob,
            p_min=p_min,
            h_max=h_max,
        )
        acceptor = GreedyAcceptor(rule) if config.greedy else SampledAcceptor(rule)
        return self.run(prompt, spec, config, acceptor)


def check_spec_fits(spec: Speculation, vocab: int) -> None:
    """Refuse a tree that asks for draft tokens of ranks the vocabulary does not have (``run``
    makes the same check), or a dynamic tree that expands more children than there are tokens."""
    if isinstance(spec, DynamicTree):
        if spec.top_k > vocab:
            raise DecodeError(
                f"dynamic tree top_k {spec.top_k} exceeds the vocabulary of {vocab} "
                f"tokens; give top_k from 1 to {vocab}"
            )
    elif spec is not None:
        spec.check_fits(vocab)


def check_stop(p_min: float, h_max: float, spec: Speculation, config: DecodeConfig) -> None:
    """Refuse a ``p_min`` outside [0, 1], an ``h_max`` below 0, or either given with sampling or
    a dynamic tree: the rules cut greedy static trees (a cut that depends on a sampled draft's
    probability would change the output's distribution; a dynamic tree has its own growth rule,
    ``min_path_prob``)."""
    if not 0 <= p_min <= 1:  # NaN fails too
        raise DecodeError(f"p_min is a draft probability in [0, 1] (0: off), got {p_min}")
    if not h_max >= 0:
        raise DecodeError(f"h_max is an entropy in nats, >= 0 (inf: off), got {h_max}")
    stops = p_min > 0 or h_max < math.inf
    if stops and not config.greedy:
        raise DecodeError("p_min and h_max stop greedy drafting; with temperature > 0 leave them")
    if stops and isinstance(spec, DynamicTree):
        raise DecodeError(
            "p_min and h_max cut static trees and chains; a dynamic tree grows by min_path_prob"
        )


def make_decoder(pair, drafter: DrafterConfig | None = None) -> SpeculativeDecoder:
    """The decoder of a loaded :class:`~specscope.models.ModelPair`, drafting with the pair's
    drafter or ``drafter``: the pair's draft model (which must be loaded), an early exit of its
    target (a view sharing the target's weights) or n-gram lookup (no model)."""
    from .models.load import drafter_model
    from .prompts.render import eos_token_ids

    drafter = drafter or pair.drafter
    if drafter.kind == "draft-model":
        if pair.draft is None or pair.drafter.kind != "draft-model":
            raise DecodeError("the draft-model drafter needs a pair loaded with its draft model")
        draft = pair.draft.model
    elif drafter == pair.drafter:
        draft = None if pair.draft is None else pair.draft.model
    else:
        view = drafter_model(drafter, pair.target)
        draft = None if view is None else view.model
    return SpeculativeDecoder(
        draft,
        pair.target.model,
        pair.vocab_size,
        frozenset(eos_token_ids(pair)),
        lookup_for(drafter),
    )


def check_drafter_fits(drafter: DrafterConfig, spec: Speculation) -> None:
    """Refuse a tree the drafter cannot propose (:meth:`DrafterConfig.check_chain`, the check
    ``run`` makes too): a chain-only drafter (n-gram) gets chains, never a dynamic tree."""
    if spec is not None:
        static = not isinstance(spec, DynamicTree)
        drafter.check_chain(static and spec.is_chain, len(spec) if static else None)


def emitted_per_step(result: DecodeResult) -> list[int]:
    """The tokens each step added to the output: its ``tau``, except that the output's end (EOS
    or ``max_new_tokens``) cuts the last step's. They sum to ``len(result.tokens)``."""
    left, emitted = len(result.tokens), []
    for step in result.steps:
        emitted.append(min(step.tau, left))
        left -= emitted[-1]
    return emitted


def tokens_per_step(result: DecodeResult) -> float:
    """Output tokens over decoding steps (the prefill's step included), as the replay of a
    measurement counts them with ``prefill_drafts=False``."""
    return len(result.tokens) / len(result.steps) if result.steps else float("nan")


def steps_frame(result: DecodeResult):
    """The per-step records as a DataFrame: the :class:`Step` fields and ``emitted``, the tokens
    the step added to the output (``tau`` cut at the output's end; they sum to its length)."""
    import pandas as pd

    frame = pd.DataFrame([vars(s) for s in result.steps])
    frame["emitted"] = emitted_per_step(result)
    return frame
