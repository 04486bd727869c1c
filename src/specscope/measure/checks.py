"""What measurement reads of a run's config (:class:`MeasureConfig`), what it checks before
anything is measured, and the error it raises: how many prompts are measured together (the
default, the engine that allows it, the memory free now).

Reads the config, the pair's shapes and the free memory; measures nothing.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..errors import SpecscopeError
from ..models import ModelPair, PairConfig
from ..theory import CriteriaConfig
from ..trees import TreeConfig


class MeasureConfig(Protocol):
    """The fields of a run's config that measurement reads (:class:`specscope.run.config.RunConfig`
    has them all; measurement sits below ``run/`` and does not import it)."""

    pair: PairConfig  # its device and quantisation
    tree: TreeConfig
    engine: str  # "cached" or "naive" (specscope.run.config.ENGINES)
    max_new_tokens: int
    max_prompt_tokens: int
    rendering: str
    seed: int
    criteria: CriteriaConfig | None  # None: no certificates


class MeasureError(SpecscopeError, ValueError):
    """A measurement that cannot start (a batch that does not fit, a prompt too long for the
    models); the message says why and what would fit."""


def default_batch_size(config: MeasureConfig) -> int:
    """Prompts measured together by default (``run`` and ``sweep`` alike): 1 for the naive
    engine (it cannot batch), 32 on a GPU, else 8 (the fastest on a 2-core CPU; BENCHMARKS.md)."""
    if config.engine != "cached":
        return 1
    return 32 if config.pair.device.startswith("cuda") else 8


def check_batch_size(config: MeasureConfig, batch_size: int) -> None:
    """Refuse a batch size below 1, or above 1 for the naive engine."""
    if batch_size < 1:
        raise MeasureError(f"batch size must be >= 1, got {batch_size}")
    if batch_size > 1 and config.engine != "cached":
        raise MeasureError(
            f"--batch-size {batch_size} needs the cached engine; the naive "
            "engine (the paper's algorithm) measures one prompt at a time"
        )


def _available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62  # unknown: do not refuse


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * torch.finfo(model.dtype).bits // 8


def check_batch_memory(
    pair: ModelPair, batch_size: int, tokens_per_row: int, tree_size: int
) -> None:
    """Refuse a batch whose KV caches and logits would not fit in the memory free now, naming
    the largest batch size that would (checked before anything is measured or committed)."""
    per_row = 0
    for model in pair.models:
        per_row += kv_bytes_per_token(model) * (tokens_per_row + tree_size)
    per_row += 3 * (tree_size + 1) * pair.vocab_size * 4  # logits, softmax and p rows, float32
    free = _available_bytes(pair.target.device)
    budget = int(0.8 * free)
    if batch_size * per_row > budget:
        fits = max(budget // per_row, 0)
        raise MeasureError(
            f"--batch-size {batch_size} needs about {batch_size * per_row / 2**30:.1f} GiB for "
            f"KV caches and logits, more than the {free / 2**30:.1f} GiB free on "
            f"{pair.target.device}; the largest batch that fits is about {fits}"
        )
