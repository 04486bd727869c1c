"""The cached 4D-masked forward pass and the KV-cache surgery every speculation stage uses.

A draft tree is fed to a model over its KV cache in one call: explicit position ids (context
length + depth - 1) and a 4D additive mask saying which cached and which new entries each new
token sees. After a step, cache entries are cropped (measurement) or gathered along the sequence
(decoding keeps the accepted path). This module knows nothing of trees, records or policies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import SpecscopeError


class CacheError(SpecscopeError, ValueError):
    """A KV cache that cannot do what speculation needs (e.g. a sliding-window layer)."""


def softmax(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 probabilities over the first ``vocab`` logits (models may pad their output)."""
    return torch.softmax(logits[..., :vocab].float(), dim=-1)


def greedy_token(scores: torch.Tensor) -> torch.Tensor:
    """The greedy choice at each row of logits or probabilities: the argmax, and on an exact tie
    (common in bfloat16) the lowest token id. The one tie rule of specscope: the recorded
    ``greedy_accept``, ``target_rank`` and emitted token, and the decoder's verifier, all use it."""
    return scores.argmax(dim=-1)


def position_limit(*models: torch.nn.Module) -> int:
    """The most positions every one of ``models`` was built for (``max_position_embeddings``)."""
    return min(getattr(m.config, "max_position_embeddings", None) or 1 << 30 for m in models)


def new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def prefill(model, tokens: Sequence[int], logits: bool = False):
    """A fresh cache holding ``tokens``; with ``logits``, also the logits [V'] after the last."""
    cache = new_cache(model)
    if not tokens:
        return cache, None
    out = model(input_ids=torch.tensor([list(tokens)], device=model.device),
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache, out.logits[0, -1] if logits else None


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


def feed_causal(model, cache, ids: Sequence[int] | torch.Tensor, cached: int,
                last: int = 0) -> torch.Tensor:
    """Feed ``ids`` after ``cached`` cache entries, each seeing all of them and the ids before it."""
    causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    past = torch.ones(len(ids), cached, dtype=torch.bool)
    return feed(model, cache, ids, torch.arange(cached, cached + len(ids)), past, causal,
                last=last)


def crop(cache, length: int) -> None:
    """Drop cache entries past ``length`` (works with the old and new ``crop`` conventions)."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def _layer_tensors(cache) -> list[tuple[object, str | int]]:
    """(holder, attribute) of every key and value tensor, for old and new ``DynamicCache``."""
    if hasattr(cache, "layers"):
        out = []
        for layer in cache.layers:
            if hasattr(layer, "cumulative_length") or getattr(layer, "is_sliding", False):
                raise CacheError(f"cache layer {type(layer).__name__} (sliding window) cannot "
                                 "keep selected positions; use a full-attention model")
            out += [(layer, "keys"), (layer, "values")]
        return out
    return [(lst, i) for lst in (cache.key_cache, cache.value_cache) for i in range(len(lst))]


def keep_positions(cache, keep: Sequence[int]) -> None:
    """Keep only the cache entries at sequence positions ``keep`` (increasing), in every layer."""
    keep = list(keep)
    start = next((i for i, k in enumerate(keep) if k != i), len(keep))
    if start < len(keep):
        for holder, key in _layer_tensors(cache):
            t = holder[key] if isinstance(key, int) else getattr(holder, key)
            if t is None or t.numel() == 0:
                continue
            index = torch.tensor(keep[start:], device=t.device)
            t[..., start:len(keep), :] = t.index_select(-2, index)
    crop(cache, len(keep))
