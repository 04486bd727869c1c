"""Import the per-request speculation statistics that serving engines already emit.

:mod:`~specscope.serving.ingest.formats` is the registry of log formats, one per engine (each
engine's parser lives with that engine: vLLM per-request metrics, SGLang ``meta_info``,
llama-server ``timings``, Spec-Bench ``accept_lengths``);
:mod:`~specscope.serving.ingest.logs` reads a log of them (JSON lines, SSE captures, stream chunks);
:mod:`~specscope.serving.ingest.run` joins them to prompts and writes an ingested run that
``specscope analyze`` reads. Nothing here measures or invents node-level figures.
"""

from ..request_stats import EngineFormat, IngestError, RequestStats, check_counts
from .formats import FORMATS
from .logs import Skipped, iter_requests
from .run import (
    JOINS,
    ingest,
    is_ingested,
    iter_log,
    load_histogram,
    load_ingested,
    read_log,
)

__all__ = [
    "FORMATS",
    "JOINS",
    "EngineFormat",
    "IngestError",
    "RequestStats",
    "Skipped",
    "check_counts",
    "ingest",
    "is_ingested",
    "iter_log",
    "iter_requests",
    "load_histogram",
    "load_ingested",
    "read_log",
]
