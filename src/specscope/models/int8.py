"""int8 on the CPU: per-channel int8 linears with per-token activation scales, and a row-wise
attention whose results do not depend on the batch (measurement records are then identical at
every batch size).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .config import ModelLoadError

# --- int8 on the CPU ------------------------------------------------------------------------------


class Int8Linear(torch.nn.Module):
    """A float32 ``nn.Linear`` run in int8 on the CPU (fbgemm), batch-invariant.

    Weights are int8 per output channel. Each input row (token) is scaled by its own absolute
    maximum to [-1, 1] and quantised to int8 on the fly: per-token dynamic quantisation. fbgemm's
    dynamic kernel picks one activation range per call, from the whole batch; a constant extra row
    holding -1 and 1 pins that range to [-1, 1], so a token's result depends on that token alone and
    a k-token tree pass gives bit for bit the logits of k one-token passes. That keeps greedy
    speculative decoding exactly lossless against plain decoding of the same int8 model. Integer
    products are exact, so the cost of a pass barely grows with the tokens in it up to about 8 on a
    small CPU, where float32 and bfloat16 passes grow several times (BENCHMARKS.md).
    """

    def __init__(self, qweight: torch.Tensor, bias: torch.Tensor | None):
        """``qweight``: the [out, in] weight quantised per output channel (qint8, zero point 0)."""
        super().__init__()
        self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("bias", bias)
        pin = torch.zeros(self.in_features)
        pin[0], pin[-1] = -1.0, 1.0
        self.register_buffer("pin", pin)

    @classmethod
    def quantize(cls, linear: torch.nn.Linear) -> Int8Linear:
        """Quantise a float ``nn.Linear``: each output channel scaled by its absolute maximum."""
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127
        with warnings.catch_warnings():  # quantized tensors are deprecated in favour of torchao
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(
                weight, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8
            )
        return cls(qweight, None if linear.bias is None else linear.bias.detach().float())

    @classmethod
    def from_int8(
        cls, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
    ) -> Int8Linear:
        """Rebuild from :meth:`int8_weight`'s integers and per-channel scales (bit for bit)."""
        zero = torch.zeros(len(scale), dtype=torch.long)
        with warnings.catch_warnings():  # as in quantize
            warnings.simplefilter("ignore")
            qweight = torch._make_per_channel_quantized_tensor(weight, scale, zero, 0)
        return cls(qweight, bias)

    def int8_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight's int8 values [out, in] and its per-channel scales (float64)."""
        qweight, _ = torch.ops.quantized.linear_unpack(self.packed)
        return qweight.int_repr(), qweight.q_per_channel_scales()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        # abs().amax(): the same values as vector_norm(inf), about 15x faster on the CPU
        absmax = rows.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12)
        unit = torch.empty(len(rows) + 1, self.in_features)
        torch.div(rows, absmax, out=unit[:-1])
        unit[-1] = self.pin
        out = torch.ops.quantized.linear_dynamic(unit, self.packed, True)[:-1]
        out = out.mul_(absmax) if self.bias is None else torch.addcmul(self.bias, out, absmax)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


ROWWISE_ATTENTION = "specscope_rowwise"


def rowwise_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs
):
    """Attention computed query by query over exactly the keys that query may see.

    Each query reads exactly its keys, in cache order, as one [kv_heads, n, dim] tensor (the
    keys every query of a sequence may see are gathered once, and a query reads its slice; a
    causal pass reads prefixes of the cache in place), so a tree node that sees the cache and its
    ancestors runs the same operations, on the same shapes and values, as the same token decoded
    alone after those ancestors: the results agree bit for bit. Batched
    kernels (SDPA, GEMMs over several queries) round differently as the number of queries changes,
    which int8 activation rounding then amplifies. Prefills run row-wise too (about 1.35x the
    time of an SDPA prefill of 300 tokens on 2 CPU cores), so that transformers' assisted
    generation, whose first pass feeds the prompt and the draft's tokens together, computes the
    prompt as plain decoding does. Each sequence of a batch is computed the same way, so batched
    measurement (:mod:`specscope.core.batch`) gives the logits of one sequence at a time, bit for bit.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, queries, dim = query.shape
    if dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    kv_heads, keys = key.shape[1], key.shape[2]
    scale = scaling if scaling is not None else dim**-0.5
    out = torch.empty(
        batch, queries, kv_heads, heads // kv_heads, dim, dtype=query.dtype, device=query.device
    )
    for b in range(batch):
        q = query[b].transpose(0, 1).reshape(queries, kv_heads, heads // kv_heads, dim)
        if attention_mask is None:  # causal, aligned to the end of the cache: key prefixes
            counts = range(keys - queries + 1, keys + 1)
            k_rows, v_rows = key[b], value[b]  # query i reads a view of the first keys
        else:
            allowed = attention_mask[b, 0]
            allowed = allowed if allowed.dtype == torch.bool else allowed == 0
            counts = allowed.sum(1).tolist()
            index = allowed.nonzero()[:, 1]  # row-major: each query's keys, in cache order
            k_rows, v_rows = key[b].index_select(1, index), value[b].index_select(1, index)
        start = 0
        for i, n in enumerate(counts):
            k = k_rows[:, start : start + n]  # [kv_heads, n, dim]
            v = v_rows[:, start : start + n]
            start += 0 if attention_mask is None else n
            weights = torch.softmax(torch.matmul(q[i], k.transpose(1, 2)).mul_(scale), dim=-1)
            torch.matmul(weights, v, out=out[b, i])
    return out.view(batch, queries, heads, dim), None


def use_rowwise_attention(model) -> None:
    """Switch ``model`` to :func:`rowwise_attention` (registered with transformers once)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ROWWISE_ATTENTION, rowwise_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ROWWISE_ATTENTION, sdpa_mask)
    model.set_attn_implementation(ROWWISE_ATTENTION)


@contextmanager
def rowwise_attention_during(model) -> Iterator[None]:
    """Run the block with ``model`` on :func:`rowwise_attention`, then give it back the attention
    it had (a pair loaded for measurement may decode after)."""
    before = model.config._attn_implementation
    use_rowwise_attention(model)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every ``nn.Linear`` of a float32 CPU model by :class:`Int8Linear`, in place."""
    if (
        next(model.parameters()).dtype != torch.float32
        or next(model.parameters()).device.type != "cpu"
    ):
        raise ModelLoadError("int8 quantisation needs a float32 model on the CPU (dtype float32)")
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ModelLoadError("int8 quantisation needs torch's fbgemm engine (an x86 CPU build)")
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, child_name, Int8Linear.quantize(child))
    return model
