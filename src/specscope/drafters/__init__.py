"""Drafters: what proposes the tree's tokens.

- :mod:`.config`: the registry :data:`DRAFTERS` (draft-model, ngram, llama-ngram-simple,
  early-exit) and :class:`DrafterConfig`, validated before any model loads.
- :mod:`.ngram`: vLLM's ngram proposer (prompt lookup), model-free.
- :mod:`.llama_ngram`: llama.cpp's ngram-simple (prompt lookup), model-free.
- :mod:`.early_exit`: the target's first layers, final norm and LM head as a draft model.

:func:`lookup_for` turns a model-free drafter into the function the speculation core calls; drafters
that run a model are loaded by :func:`specscope.models.load.load_pair`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .config import DRAFTERS, NGRAM_DEFAULT_N, DrafterConfig, DrafterError, DrafterKind
from .llama_ngram import propose_ngram_simple
from .ngram import propose_ngram

__all__ = [
    "DRAFTERS",
    "NGRAM_DEFAULT_N",
    "DrafterConfig",
    "DrafterError",
    "DrafterKind",
    "Lookup",
    "lookup_for",
    "propose_ngram",
    "propose_ngram_simple",
]

# (the context so far, the most tokens wanted) -> the chain proposed ([]: no proposal)
Lookup = Callable[[Sequence[int], int], list[int]]


# each model-free drafter's parameters -> its Lookup; k is the chain's depth (llama.cpp's M)
LOOKUPS: dict[str, Callable[..., Lookup]] = {
    "ngram": lambda prompt_lookup_min, prompt_lookup_max: (
        lambda context, k: propose_ngram(context, prompt_lookup_min, prompt_lookup_max, k)
    ),
    "llama-ngram-simple": lambda ngram_size: (
        lambda context, k: propose_ngram_simple(context, ngram_size, k)
    ),
}


def lookup_for(drafter: DrafterConfig) -> Lookup | None:
    """A model-free drafter as a function: (context, k) -> the chain of at most ``k`` tokens it
    proposes; None for drafters that run a model."""
    make = LOOKUPS.get(drafter.kind)
    return make(**drafter.params) if make is not None else None
