"""Loading a ``.gguf`` file into transformers: the weights dequantised to a dense model (every
tensor from the file, or a :class:`~specscope.models.config.ModelLoadError`), and its tokenizer.
Knows nothing of the demo pair (demo.py assembles its GGUF files) or of pairs (load.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import require
from .checkpoint import refuse_incomplete


def load_gguf(path: Path, dtype: torch.dtype):
    """The model of a GGUF file, dequantised to a dense model in ``dtype``, and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers dequantise GGUF files on load anyway
        extra = {}
    else:
        extra = {"quantization_config": GgufConfig(dequantize=True)}
    require("gguf", f"loading {path.name}", ("gguf", "accelerate"))  # transformers needs both
    model, info = AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        dtype=dtype,
        attn_implementation="sdpa",
        output_loading_info=True,
        **extra,
    )
    refuse_incomplete(path, info)  # a tensor the file lacks would be random
    # A dequantised model is a plain dense model: drop the GGUF quantisation marker so that it
    # can be saved and used like any other checkpoint.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tokenizer
