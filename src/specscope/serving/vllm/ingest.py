"""vLLM's per-request speculative-decoding metrics (``metrics.speculative_decoding``, vLLM 0.29
and later) as :class:`~specscope.serving.request_stats.RequestStats`: the parser, the stream-chunk
test, the version check and the key of the statistics in an answer (``metrics``). It reads one
answer; it does not read files.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from ...schemas import parse
from ..request_stats import (
    Count,
    EngineFormat,
    IngestError,
    RequestStats,
    check_counts,
    checked_histogram,
    histogram_from_steps,
    last_step_max,
)

# docs/features/speculative_decoding/acceptance_metrics.md @02cf515f (vLLM >= 0.29, PR #48915):
# metrics.speculative_decoding {num_spec_steps, num_accepted_draft_tokens, num_draft_tokens,
# num_spec_tokens, acceptance_histogram (dense, num_spec_tokens + 1), per_step_* in detailed};
# "null for n > 1"; steps with no scheduled draft are omitted (so steps are verify steps only);
# streaming: only the final usage chunk carries it.


class SpecDecodingMetrics(BaseModel):
    """vLLM's ``metrics.speculative_decoding`` of one answer (its other keys, such as
    ``mean_acceptance_length``, are allowed and not read); null: not logged."""

    model_config = ConfigDict(extra="allow")
    num_spec_steps: Count
    num_accepted_draft_tokens: Count
    num_draft_tokens: Count
    num_spec_tokens: Count | None = None
    acceptance_histogram: list[Count] | None = None
    per_step_accepted: list[Count] | None = None  # detailed metrics: both per_step_* lists
    per_step_drafted: list[Count] | None = None


class Usage(BaseModel):
    """The ``usage`` of a vLLM answer, as far as ingest reads it."""

    model_config = ConfigDict(extra="allow")
    completion_tokens: Count | None = None


VLLM_FLAG = "--per-request-spec-decode-metrics summary or detailed"


def _vllm_body(line: dict) -> dict:
    return line["data"] if isinstance(line.get("data"), dict) else line


def _vllm_choices(body: dict) -> int:
    choices = body.get("choices")
    if not isinstance(choices, list):
        return 0
    indices = {c.get("index", 0) for c in choices if isinstance(c, dict)}
    return max(len(choices), len(indices))


def _vllm(line: dict, where: str) -> RequestStats:
    body = _vllm_body(line)
    metrics = body.get("metrics")
    if (
        isinstance(metrics, dict)
        and "speculative_decoding" in metrics
        and metrics["speculative_decoding"] is None
    ):
        n = _vllm_choices(body)
        if n > 1:
            raise IngestError(
                f"{where}: metrics.speculative_decoding is null for a request of "
                f"{n} choices: vLLM reports it only for n == 1 (unsupported by "
                "vLLM for n > 1); send such requests with n = 1"
            )
        raise IngestError(
            f"{where}: metrics.speculative_decoding is null (vLLM fills it only "
            f"with {VLLM_FLAG}, speculative decoding on and n == 1)"
        )
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if spec is None:
        raise IngestError(
            f"{where}: no metrics.speculative_decoding (start vLLM >= 0.29 with "
            f"{VLLM_FLAG}; when streaming, also stream_options.include_usage)"
        )
    usage = parse(Usage | None, body.get("usage"), where, IngestError, "usage")
    generated = usage.completion_tokens if usage is not None else None
    spec = parse(SpecDecodingMetrics, spec, where, IngestError, "metrics.speculative_decoding")
    where = f"{where}: metrics.speculative_decoding"
    steps, accepted = spec.num_spec_steps, spec.num_accepted_draft_tokens
    drafted, k = spec.num_draft_tokens, spec.num_spec_tokens
    per_acc = per_draft = histogram = None
    if spec.per_step_accepted is not None or spec.per_step_drafted is not None:
        if spec.per_step_accepted is None or spec.per_step_drafted is None:
            missing = "per_step_accepted" if spec.per_step_accepted is None else "per_step_drafted"
            raise IngestError(
                f"{where}: {missing} is missing; vLLM's detailed metrics hold per_step_accepted "
                "and per_step_drafted together"
            )
        per_acc, per_draft = tuple(spec.per_step_accepted), tuple(spec.per_step_drafted)
        if not len(per_acc) == len(per_draft) == steps:
            raise IngestError(
                f"{where}: per_step_accepted ({len(per_acc)}) and per_step_drafted "
                f"({len(per_draft)}) must have num_spec_steps ({steps}) entries"
            )
        if sum(per_acc) != accepted or any(a > d for a, d in zip(per_acc, per_draft)):
            raise IngestError(
                f"{where}: per_step_accepted must sum to num_accepted_draft_tokens "
                "and never exceed per_step_drafted"
            )
        if sum(per_draft) != drafted:
            raise IngestError(
                f"{where}: per_step_drafted must sum to num_draft_tokens "
                f"({drafted}), not {sum(per_draft)}"
            )
        histogram = histogram_from_steps(per_acc)
    if spec.acceptance_histogram is not None:
        values = spec.acceptance_histogram
        if k is not None and len(values) != k + 1:
            raise IngestError(
                f"{where}: acceptance_histogram has {len(values)} entries; vLLM "
                f"writes num_spec_tokens + 1 ({k + 1})"
            )
        logged = checked_histogram(
            values,
            where,
            "acceptance_histogram",
            steps,
            accepted,
            "num_spec_steps",
            "num_accepted_draft_tokens",
        )
        histogram = histogram if histogram is not None else logged
    last = last_step_max(per_acc, k, histogram)
    check_counts(
        where,
        {
            "steps": "num_spec_steps",
            "accepted": "num_accepted_draft_tokens",
            "drafted": "num_draft_tokens",
            "generated": "usage.completion_tokens",
        },
        steps,
        accepted,
        drafted,
        generated,
        last,
    )
    return RequestStats(
        str(body.get("id", "")), steps, accepted, drafted, generated, per_acc, per_draft, histogram
    )


def _vllm_partial(line: dict) -> bool:
    """A stream chunk before the final usage chunk: no metrics and no usage yet."""
    body = _vllm_body(line)
    if body.get("metrics") is not None or body.get("usage") is not None:
        return False
    return str(body.get("object", "")).endswith(".chunk") or "choices" in body


_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def _vllm_version(version: str) -> None:
    match = _VERSION.match(version)
    if not match:
        raise IngestError(
            f"--engine-version {version!r} is not a vLLM version; allowed: "
            "MAJOR.MINOR[.PATCH], 0.29 or later"
        )
    if (int(match[1]), int(match[2])) < (0, 29):
        raise IngestError(
            f"vLLM {version} has no per-request speculative metrics (added in "
            "0.29, PR #48915); allowed: 0.29 or later"
        )


FORMAT = EngineFormat(
    "vLLM",
    _vllm,
    "metrics",
    _vllm_partial,
    _vllm_version,
    source="vllm docs/features/speculative_decoding/acceptance_metrics.md @02cf515f",
)
