"""What a loaded checkpoint must satisfy before it is measured: every tensor came from its files.

transformers fills a tensor a checkpoint lacks (or holds in another shape, with
``ignore_mismatched_sizes``) with random values and only prints a load report; a model measured
that way is another model. :func:`refuse_incomplete` reads the ``output_loading_info`` of a
``from_pretrained`` call, safetensors checkpoints and GGUF files alike. It does not load anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .config import ModelLoadError


def refuse_incomplete(where: Path | str, info: Mapping) -> None:
    """A :class:`ModelLoadError` naming the tensors ``where`` lacks or holds in the wrong shape
    (tied weights, such as a head tied to the embeddings, are not missing: transformers does not
    list them)."""
    missing = sorted(info.get("missing_keys") or ())
    mismatched = [
        f"{key} of shape {_shape(stored)} where its config needs {_shape(needed)}"
        for key, stored, needed in sorted(info.get("mismatched_keys") or ())
    ]
    if missing or mismatched:
        lacks = f"lacks {_names(missing)}" if missing else ""
        wrong = f"has {_names(mismatched)}" if mismatched else ""
        raise ModelLoadError(
            f"{where}: the checkpoint {' and '.join(filter(None, (lacks, wrong)))}; refusing "
            "to measure a model with randomly initialised tensors"
        )


def _shape(shape) -> str:
    return "x".join(str(n) for n in shape) or "scalar"


def _names(keys: list[str], shown: int = 5) -> str:
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return f"tensor{'s' if len(keys) > 1 else ''} " + ", ".join(keys[:shown]) + more
