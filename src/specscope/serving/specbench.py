"""Spec-Bench's answer files (``choices[0].accept_lengths``, tokens per step) as
:class:`~specscope.serving.request_stats.RequestStats`: a log format of an evaluation harness, not
of a serving engine, so it has no export. It reads one answer line; it does not read files.
"""

from __future__ import annotations

from .request_stats import (
    INT64_MAX,
    EngineFormat,
    IngestError,
    RequestStats,
    histogram_from_steps,
    is_count,
)

# evaluation/inference_eagle.py `ea_forward`: accept_lengths = input_ids growth per step (the
# target's own token included); evaluation/eval.py writes choices[i].accept_lengths.


def _spec_bench(line: dict, where: str) -> RequestStats:
    choices = line.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise IngestError(f"{where}: no choices (a Spec-Bench answer line)")
    lengths = choices[0].get("accept_lengths")
    flat = (
        [x for turn in lengths for x in (turn if isinstance(turn, list) else [turn])]
        if isinstance(lengths, list)
        else None
    )
    if not flat or not all(is_count(x, least=1) for x in flat) or sum(flat) > INT64_MAX:
        raise IngestError(
            f"{where}: choices[0].accept_lengths must be a list of integers >= 1 "
            "(tokens per step) whose sum is at most 2**63 - 1 (int64)"
        )
    per_acc = tuple(x - 1 for x in flat)
    if "question_id" not in line:
        raise IngestError(f"{where}: missing field 'question_id'")
    return RequestStats(
        str(line["question_id"]),
        len(flat),
        sum(per_acc),
        None,
        sum(flat),
        per_acc,
        None,
        histogram_from_steps(per_acc),
    )


FORMAT = EngineFormat("Spec-Bench", _spec_bench, source="Spec-Bench evaluation/inference_eagle.py")
