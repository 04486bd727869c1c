"""The cached 4D-masked forward pass and the KV-cache surgery every speculation stage uses: the
only module of specscope that runs a model forward over a KV cache or touches a cache's insides
(the naive oracle and the bench's transformers baseline run their own forwards by design).

Every pass takes B rows (B = 1 is the single-prompt case): ids [B, Q], explicit position ids
[B, Q], and which cached entries [B, Q, T] and which new entries [Q, Q] each new token sees, as
one 4D additive mask per row. After a step each row keeps some of its cache entries
(:func:`keep_positions`: decoding the accepted path, measurement the context); rows of several
caches are repacked into one, right-aligned after padding (:func:`gather_rows`), when batched
measurement refills a finished row. This module knows nothing of trees, records or policies.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import cache as memoize

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


@memoize
def _cache_keyword(model_class: type) -> str:
    """The name ``forward`` takes the KV cache by: ``cache`` from transformers 5.24 on (the old
    ``past_key_values`` still works there, with a FutureWarning, until 5.40), else the old name."""
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def forward(model, cache, **inputs):
    """``model(**inputs)`` over ``cache``, which it extends."""
    return model(**inputs, **{_cache_keyword(type(model)): cache}, use_cache=True)


def decoder_body(model):
    """The causal LM without its LM head (transformers' ``base_model``: the embeddings, the
    decoder layers and the final norm), or ``model`` itself where it has none."""
    body = getattr(model, "base_model", model)
    return body if isinstance(body, torch.nn.Module) else model


def prefill(model, tokens: Sequence[int], logits: bool = False):
    """A fresh cache holding ``tokens``; with ``logits``, also the logits [V'] after the last.
    Without, only the decoder body runs: the cache is the same, bit for bit, and the LM head's
    pass over the vocabulary (in bfloat16 on a CPU, about a second for one row) is not made."""
    cache = new_cache(model)
    if not tokens:
        return cache, None
    ids = torch.tensor([list(tokens)], device=model.device)  # [1, L]
    if not logits:
        forward(decoder_body(model), cache, input_ids=ids)
        return cache, None
    return cache, forward(model, cache, input_ids=ids, logits_to_keep=1).logits[0, -1]


def additive_mask(past: torch.Tensor, block: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, Q, T + Q] additive attention mask from boolean visibility of the cached entries
    (``past`` [B, Q, T]) and of the new tokens (``block`` [Q, Q], the same for every row)."""
    B, Q, _ = past.shape
    allowed = torch.cat([past, block[None].expand(B, Q, Q)], dim=2)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def feed(
    model,
    cache,
    ids: torch.Tensor,
    positions: torch.Tensor,
    past: torch.Tensor,
    block: torch.Tensor,
    last: int = 0,
) -> torch.Tensor:
    """Run ``ids`` over ``cache`` with a 4D mask and explicit positions; logits [B, Q, V'].

    ids: [B, Q]; positions: [B, Q] position ids; past: [B, Q, T] which of the T cached entries
    each new token sees; block: [Q, Q] which new tokens it sees (shared by the rows). The cache
    grows by Q entries in every row. ``last`` > 0 computes the logits of the last ``last`` only.
    """
    dev = model.device
    assert ids.dim() == 2 and positions.shape == ids.shape and past.shape[:2] == ids.shape
    mask = additive_mask(past.to(dev), block.to(dev), model.dtype)
    out = forward(
        model,
        cache,
        input_ids=ids.to(dev),
        attention_mask=mask,
        position_ids=positions.to(dev),
        logits_to_keep=last,
    )
    return out.logits


def feed_causal(model, cache, ids: torch.Tensor, past: torch.Tensor, last: int = 0) -> torch.Tensor:
    """Feed ``ids`` [B, Q] after the cached entries marked in ``past`` [B, T], each id seeing
    those and the ids before it, at the positions that follow them; logits [B, Q or last, V']."""
    B, Q = ids.shape
    positions = past.sum(1, keepdim=True) + torch.arange(Q)
    causal = torch.ones(Q, Q, dtype=torch.bool).tril()
    return feed(
        model,
        cache,
        ids,
        positions,
        past[:, None, :].expand(B, Q, past.shape[1]),
        causal,
        last=last,
    )


def feed_one(model, cache, token: int) -> torch.Tensor:
    """Plain decoding's pass (gpt-fast's ``decode_one_token``): ``token`` after every cached
    entry, without a mask; its logits [V']."""
    return forward(
        model, cache, input_ids=torch.tensor([[token]], device=model.device), logits_to_keep=1
    ).logits[0, -1]


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
                raise CacheError(
                    f"cache layer {type(layer).__name__} (sliding window) cannot "
                    "keep selected positions; use a full-attention model"
                )
            out += [(layer, "keys"), (layer, "values")]
        return out
    return [(lst, i) for lst in (cache.key_cache, cache.value_cache) for i in range(len(lst))]


def keep_positions(cache, keep: Sequence[int] | torch.Tensor) -> None:
    """The commit: keep only the cache entries at sequence positions ``keep`` ([K] for every row,
    or [B, K], increasing along each row), in every layer; the cache is K entries long after."""
    keep = torch.as_tensor(keep, dtype=torch.long)
    keep = keep[None] if keep.dim() == 1 else keep  # [B or 1, K]
    K = keep.shape[1]
    moved = (keep != torch.arange(K)).any(0).nonzero()
    if len(moved):
        start = int(moved[0])
        for holder, key in _layer_tensors(cache):
            t = holder[key] if isinstance(key, int) else getattr(holder, key)
            if t is None or t.numel() == 0:
                continue
            index = keep[:, None, start:, None].to(t.device)  # [B, 1, K - start, 1]
            index = index.expand(t.shape[0], t.shape[1], K - start, t.shape[3])
            t[..., start:K, :] = t.gather(2, index)
    crop(cache, K)


def gather_rows(
    model, rows: Sequence[tuple[object, int, torch.Tensor]]
) -> tuple[object, torch.Tensor]:
    """A new cache for ``model`` whose row r holds, of ``rows[r] = (cache, b, index)``, row b's
    entries at positions ``index`` [K_r] of that cache, right-aligned after zero padding to the
    longest; and valid [R, T]: which entries are real. Needs the layered ``DynamicCache``."""
    lengths = [len(index) for _, _, index in rows]
    width = max(lengths, default=0)
    packed = new_cache(model)
    if width:
        for i, layer in enumerate(packed.layers):
            kv = []
            for name in ("keys", "values"):
                parts = [
                    getattr(cache.layers[i], name)[b].index_select(1, index.to(model.device))
                    if len(index)
                    else None
                    for cache, b, index in rows
                ]
                ref = next(t for t in parts if t is not None)  # [kv_heads, K, head_dim]
                parts = [ref[:, :0] if t is None else t for t in parts]
                kv.append(
                    torch.stack(
                        [
                            torch.cat(
                                [ref.new_zeros(ref.shape[0], width - t.shape[1], ref.shape[2]), t],
                                dim=1,
                            )
                            for t in parts
                        ]
                    )
                )
            layer.lazy_initialization(*kv)
            layer.keys, layer.values = kv
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for r, n in enumerate(lengths):
        valid[r, width - n :] = True
    return packed, valid
