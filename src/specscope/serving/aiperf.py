"""AIPerf's per-request records (``profile_export.jsonl``) as
:class:`~specscope.serving.request_stats.RequestStats`: a format of a benchmarking client, not of
a serving engine, so it has no export and no key in an answer. It reads one line; it does not read
files.

What AIPerf exports per request, and where (ai-dynamo/aiperf, file@commit):

- ``profile_export.jsonl`` (written at ``--export-level records`` or ``raw``) holds one
  ``MetricRecordInfo`` per request: ``metadata`` (``MetricRecordMetadata``), ``metrics`` (tag ->
  ``{value, unit}``), ``spec_decode_acceptance`` (a ``SpecDecodeAcceptanceRecord``, or absent)
  and ``error`` (src/aiperf/common/models/record_models.py@1849cd1b). This is the file read here.
- ``spec_decode_acceptance`` is AIPerf's engine-neutral record, filled by an engine adapter
  (src/aiperf/spec_decode/): vLLM's ``metrics.speculative_decoding`` (vllm_adapter.py@7bb5f5c8),
  TensorRT-LLM's ``speculative_decoding`` (trtllm_adapter.py@038b7df1) or llama-server's
  ``timings`` (llamacpp_adapter.py@5850dd43):
  ``num_spec_steps``, ``num_accepted_draft_tokens``, ``num_draft_tokens``, ``num_spec_tokens``
  (or null), ``completion_tokens`` (the response's ``usage.completion_tokens``, or null),
  ``acceptance_histogram`` (sparse ``{"j": steps}``, zero buckets left out), ``per_step_accepted``
  and ``per_step_drafted`` (or null), ``engine``, ``mean_acceptance_length`` and
  ``draft_acceptance_rate`` (src/aiperf/common/models/spec_decode_models.py@0786f0ca).
- ``metrics`` also holds the same counts as record metrics, ``spec_decode_steps``,
  ``spec_decode_accepted_draft_tokens`` and ``spec_decode_draft_tokens``
  (src/aiperf/metrics/types/spec_decode_metrics.py@1849cd1b). They are not read alone: they do
  not name the engine, and for llama-server AIPerf's steps are its own derivation (below). Where
  both are on a line they must agree.
- ``profile_export_raw.jsonl`` (``--export-level raw``) holds the request and the engine's raw
  responses; ``profile_export_aiperf.json`` holds run-level aggregates and the pooled histogram:
  neither is read here.

Counts (vLLM, TensorRT-LLM): ``steps`` = ``num_spec_steps``, ``accepted`` =
``num_accepted_draft_tokens``, ``drafted`` = ``num_draft_tokens``, ``generated`` =
``completion_tokens`` (None where AIPerf wrote null; AIPerf's ``output_sequence_length`` metric is
not used, as its own tokenizer may count it), the histogram from ``acceptance_histogram`` or the
per-step lists. Nothing is derived.

llama-server (``engine: "llamacpp"``) logs no verify-step count: AIPerf sets ``num_spec_steps =
predicted_n - draft_n_accepted`` (which counts the prefill's token as a step) and spreads the
accepted drafts evenly over those steps to make an ``acceptance_histogram``. That histogram is
AIPerf's invention and is not read; ``generated`` is ``predicted_n`` recovered exactly as
``num_spec_steps + num_accepted_draft_tokens`` where ``completion_tokens`` is null; ``steps``
is derived as specscope's llama.cpp format derives it, ``predicted_n - 1 - draft_n_accepted``
(at least 1; 0 where nothing was drafted), and labelled derived.

A line without these counts is skipped and counted: AIPerf writes no record for a request whose
spec decode was off, that ran no verify step (``spec_decode_zero_step``: counted only in the
run-level ``spec_decode_zero_step_requests``, never per request), that asked for ``n > 1``, whose
payload its adapter rejected, or that failed (``error``). So an AIPerf export leaves out the
requests that verified nothing; the figures of the others are as above.

The join id is ``metadata.conversation_id``: the ``session_id`` of a line of AIPerf's
``single_turn`` custom dataset (src/aiperf/dataset/loader/single_turn.py@39545f68), or the
``question_id`` of a SPEED-Bench row (src/aiperf/dataset/loader/speed_bench.py@02b0d5c3); a
later turn of a conversation (``turn_index`` > 0) joins ``CONVERSATION_ID:TURN_INDEX``. Without a
conversation id the line's ``x_request_id`` (a UUID AIPerf makes) is used, which joins no prompt.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from ..schemas import parse
from .llamacpp.ingest import LLAMACPP_STEPS
from .request_stats import (
    Count,
    EngineFormat,
    IngestError,
    RequestStats,
    check_counts,
    checked_histogram,
    histogram_from_steps,
    last_step_max,
)

ACCEPTANCE = "spec_decode_acceptance"
METRICS = {  # the record metric of each count (spec_decode_metrics.py@1849cd1b)
    "steps": "spec_decode_steps",
    "accepted": "spec_decode_accepted_draft_tokens",
    "drafted": "spec_decode_draft_tokens",
}
LLAMACPP = "llamacpp"  # AIPerf's name of llama-server's adapter (llamacpp_adapter.py@5850dd43)
LLAMACPP_GENERATED = (
    "llama-server (AIPerf's engine llamacpp) without completion_tokens: predicted_n, recovered "
    "as num_spec_steps + num_accepted_draft_tokens (AIPerf's num_spec_steps is predicted_n - "
    "draft_n_accepted)"
)
_BUCKET = re.compile(r"^(0|[1-9][0-9]{0,17})$")  # a histogram key: a decimal count of drafts


class Acceptance(BaseModel):
    """AIPerf's ``spec_decode_acceptance`` of one request (``SpecDecodeAcceptanceRecord``; its
    other keys, such as ``mean_acceptance_length``, are allowed and not read)."""

    model_config = ConfigDict(extra="allow")
    engine: str | None = None  # the adapter's: "vllm", "tensorrt_llm", "llamacpp"
    num_spec_steps: Count
    num_accepted_draft_tokens: Count
    num_draft_tokens: Count
    acceptance_histogram: dict[str, Count] | None = None  # sparse: {"j": steps}
    num_spec_tokens: Count | None = None
    completion_tokens: Count | None = None
    per_step_accepted: list[Count] | None = None
    per_step_drafted: list[Count] | None = None


class MetricCount(BaseModel):
    """A record metric that is a count: ``{value, unit}``."""

    model_config = ConfigDict(extra="allow")
    value: Count
    unit: str | None = None


class Metrics(BaseModel):
    """A line's ``metrics``, as far as ingest reads them (the other metrics are allowed)."""

    model_config = ConfigDict(extra="allow")
    spec_decode_steps: MetricCount | None = None
    spec_decode_accepted_draft_tokens: MetricCount | None = None
    spec_decode_draft_tokens: MetricCount | None = None


class Metadata(BaseModel):
    """A line's ``metadata`` (``MetricRecordMetadata``), as far as ingest reads it."""

    model_config = ConfigDict(extra="allow")
    conversation_id: str | None = None
    turn_index: Count | None = None
    x_request_id: str | None = None


class Record(BaseModel):
    """A line of AIPerf's ``profile_export.jsonl`` (``MetricRecordInfo``), as far as ingest reads
    it (its other keys, such as ``trace_data`` and ``error``, are allowed)."""

    model_config = ConfigDict(extra="allow")
    metadata: Metadata
    metrics: Metrics
    spec_decode_acceptance: Acceptance | None = None


def _without_counts(line: dict) -> bool:
    """A line AIPerf wrote with no acceptance record (see the module's docstring)."""
    return line.get(ACCEPTANCE) is None


def _join_id(meta: Metadata) -> str:
    if meta.conversation_id is None:
        return meta.x_request_id or ""
    if meta.turn_index:
        return f"{meta.conversation_id}:{meta.turn_index}"
    return meta.conversation_id


def _histogram(spec: Acceptance, where: str) -> tuple[int, ...] | None:
    """The dense histogram of the sparse ``acceptance_histogram``."""
    if spec.acceptance_histogram is None:
        return None
    buckets = {}
    for key, steps in spec.acceptance_histogram.items():
        if not _BUCKET.match(key):
            raise IngestError(
                f"{where}: acceptance_histogram has a key {key!r}; AIPerf writes each as a "
                'decimal count of accepted drafts ("0", "1", ...)'
            )
        buckets[int(key)] = steps
    k = spec.num_spec_tokens
    top = max(buckets, default=0)
    if k is not None and top > k:
        raise IngestError(
            f"{where}: acceptance_histogram has a bucket {top} above num_spec_tokens ({k}); a "
            "step accepts at most num_spec_tokens drafts"
        )
    values = [buckets.get(j, 0) for j in range(top + 1)]
    return checked_histogram(
        values,
        where,
        "acceptance_histogram",
        spec.num_spec_steps,
        spec.num_accepted_draft_tokens,
        "num_spec_steps",
        "num_accepted_draft_tokens",
    )


def _per_step(spec: Acceptance, where: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    if spec.per_step_accepted is None and spec.per_step_drafted is None:
        return None
    if spec.per_step_accepted is None or spec.per_step_drafted is None:
        missing = "per_step_accepted" if spec.per_step_accepted is None else "per_step_drafted"
        raise IngestError(
            f"{where}: {missing} is missing; AIPerf copies per_step_accepted and "
            "per_step_drafted together from the engine's detailed metrics"
        )
    acc, drafted = tuple(spec.per_step_accepted), tuple(spec.per_step_drafted)
    steps = spec.num_spec_steps
    if not len(acc) == len(drafted) == steps:
        raise IngestError(
            f"{where}: per_step_accepted ({len(acc)}) and per_step_drafted ({len(drafted)}) "
            f"must have num_spec_steps ({steps}) entries"
        )
    if sum(acc) != spec.num_accepted_draft_tokens or any(a > d for a, d in zip(acc, drafted)):
        raise IngestError(
            f"{where}: per_step_accepted must sum to num_accepted_draft_tokens "
            f"({spec.num_accepted_draft_tokens}) and never exceed per_step_drafted"
        )
    if sum(drafted) != spec.num_draft_tokens:
        raise IngestError(
            f"{where}: per_step_drafted must sum to num_draft_tokens "
            f"({spec.num_draft_tokens}), not {sum(drafted)}"
        )
    return acc, drafted


def _from_llamacpp(spec: Acceptance, at: str, request_id: str) -> RequestStats:
    """llama-server's counts from AIPerf's record (see the module's docstring): its histogram and
    steps are AIPerf's derivations, so only draft_n, draft_n_accepted and predicted_n are kept."""
    accepted, drafted = spec.num_accepted_draft_tokens, spec.num_draft_tokens
    derived = ["steps"]
    generated = spec.completion_tokens
    if generated is None:
        generated = spec.num_spec_steps + accepted
        derived.append("generated")
    steps = max(generated - 1 - accepted, 1) if drafted else 0
    names = {
        "steps": "verify steps (predicted_n - 1 - num_accepted_draft_tokens)",
        "accepted": "num_accepted_draft_tokens",
        "drafted": "num_draft_tokens",
        "generated": "completion_tokens" if spec.completion_tokens is not None else "predicted_n",
    }
    check_counts(at, names, steps, accepted, drafted, generated)
    return RequestStats(
        request_id, steps, accepted, drafted, generated, derived=tuple(sorted(derived))
    )


def _from_record(spec: Acceptance, metrics: Metrics, where: str, request_id: str) -> RequestStats:
    at = f"{where}: {ACCEPTANCE}"
    for count, field in (
        ("num_spec_steps", METRICS["steps"]),
        ("num_accepted_draft_tokens", METRICS["accepted"]),
        ("num_draft_tokens", METRICS["drafted"]),
    ):
        metric = getattr(metrics, field)
        if metric is not None and metric.value != getattr(spec, count):
            raise IngestError(
                f"{where}: metrics.{field}.value ({metric.value}) differs from "
                f"{ACCEPTANCE}.{count} ({getattr(spec, count)}); AIPerf writes both from one "
                "record"
            )
    if spec.engine == LLAMACPP:
        return _from_llamacpp(spec, at, request_id)
    per_step = _per_step(spec, at)
    histogram = _histogram(spec, at)
    per_acc, per_drafted = per_step if per_step else (None, None)
    if per_acc is not None:
        histogram = histogram_from_steps(per_acc)
    k = spec.num_spec_tokens
    last = last_step_max(per_acc, k, histogram)
    check_counts(
        at,
        {
            "steps": "num_spec_steps",
            "accepted": "num_accepted_draft_tokens",
            "drafted": "num_draft_tokens",
            "generated": "completion_tokens",
        },
        spec.num_spec_steps,
        spec.num_accepted_draft_tokens,
        spec.num_draft_tokens,
        spec.completion_tokens,
        last,
    )
    return RequestStats(
        request_id,
        spec.num_spec_steps,
        spec.num_accepted_draft_tokens,
        spec.num_draft_tokens,
        spec.completion_tokens,
        per_acc,
        per_drafted,
        histogram,
    )


def _aiperf(line: dict, where: str) -> RequestStats:
    record = parse(Record, line, where, IngestError)
    request_id = _join_id(record.metadata)
    if record.spec_decode_acceptance is None:  # iter_requests skips these (FORMAT.unstated)
        raise IngestError(f"{where}: {ACCEPTANCE} is null; AIPerf omits it when it has none")
    return _from_record(record.spec_decode_acceptance, record.metrics, where, request_id)


FORMAT = EngineFormat(
    "AIPerf",
    _aiperf,
    unstated=_without_counts,
    derivations={"steps": LLAMACPP_STEPS, "generated": LLAMACPP_GENERATED},
    unstated_why=(
        f"AIPerf records without {ACCEPTANCE}: AIPerf writes none for a "
        "request that ran no verify step, had spec decode off, asked for n > 1, failed (error) "
        "or whose engine payload it rejected"
    ),
    source=(
        "ai-dynamo/aiperf src/aiperf/common/models/record_models.py@1849cd1b (MetricRecordInfo), "
        "spec_decode_models.py@0786f0ca, metrics/types/spec_decode_metrics.py@1849cd1b"
    ),
)
