"""The engines' per-request speculation log formats, by name: the registry ``specscope ingest``
and the gateway read.

Each entry of :data:`FORMATS` is an engine's :class:`~specscope.serving.request_stats.EngineFormat`,
defined beside that engine's export (:mod:`specscope.serving.vllm.ingest`,
:mod:`specscope.serving.sglang.ingest`, :mod:`specscope.serving.llamacpp.ingest`) or on its own
(:mod:`specscope.serving.specbench`, :mod:`specscope.serving.aiperf`). This module parses nothing
itself.
"""

from __future__ import annotations

from ..aiperf import FORMAT as AIPERF
from ..llamacpp import ingest as llamacpp
from ..request_stats import EngineFormat, IngestError
from ..sglang import ingest as sglang
from ..specbench import FORMAT as SPEC_BENCH
from ..vllm import ingest as vllm

FORMATS: dict[str, EngineFormat] = {
    "vllm": vllm.FORMAT,
    "sglang": sglang.FORMAT,
    "llama.cpp": llamacpp.FORMAT,
    "spec-bench": SPEC_BENCH,
    "aiperf": AIPERF,
}


def engine_format(name: str) -> EngineFormat:
    if name not in FORMATS:
        raise IngestError(f"unknown format {name!r}; allowed: {', '.join(FORMATS)}")
    return FORMATS[name]
