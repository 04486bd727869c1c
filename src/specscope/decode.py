"""Speculative decoding for real: the loop of :mod:`specscope.core.loop` with greedy or sampled
verification (README: "Speculative decoding for real").

    accept (greedy)   -> follow the child whose token is the target's argmax; the first context
                         without such a child emits the target's argmax there (the bonus token)
    accept (sampling) -> multi-round speculative sampling at each node (SpecInfer), which leaves
                         the target's (temperature, top-p) distribution unchanged

Greedy verification is lossless: the output is the target's plain greedy output, token for token
(up to floating-point ties between the tree pass and one-token passes). With sampling, a static
tree's children are drawn from the draft without replacement (Gumbel-top-k) and verified against
the draft's distribution; a dynamic tree's children are the draft's top tokens, verified as
point-mass proposals, which keeps it lossless although its shape depends on the draft.
This module does not time methods against each other (:mod:`specscope.tune.bench`) or measure
costs (:mod:`specscope.tune.costs`).
"""

from __future__ import annotations

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
    "steps_frame",
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
        self, prompt: Sequence[int], spec: Speculation, config: DecodeConfig = DecodeConfig()
    ) -> DecodeResult:
        if spec is None:
            return plain_generate(self.target, prompt, config, self.vocab, self.eos)
        check_spec_fits(spec, self.vocab)
        limit = position_limit(*(m for m in (self.draft, self.target) if m is not None))
        check_depth_fits(spec.max_depth, config.max_new_tokens, limit)
        rule = ChildRule(
            self.vocab, config.temperature, config.top_p, min_path_prob=config.min_path_prob
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
        drafter.check_chain(not isinstance(spec, DynamicTree) and spec.is_chain)


def steps_frame(result: DecodeResult):
    """The per-step records as a DataFrame."""
    import pandas as pd

    return pd.DataFrame([vars(s) for s in result.steps])
