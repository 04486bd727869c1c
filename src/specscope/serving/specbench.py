"""Spec-Bench's answer files (``choices[0].accept_lengths``, tokens per step) as
:class:`~specscope.serving.request_stats.RequestStats`: a log format of an evaluation harness, not
of a serving engine, so it has no export. It reads one answer line; it does not read files.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from ..schemas import parse
from .request_stats import INT64_MAX, EngineFormat, IngestError, RequestStats, histogram_from_steps

# evaluation/inference_eagle.py `ea_forward`: accept_lengths = input_ids growth per step (the
# target's own token included); evaluation/eval.py writes choices[i].accept_lengths.

Tokens = Annotated[int, Field(ge=1, le=INT64_MAX)]  # a step's tokens: its accepted drafts + 1


class Choice(BaseModel):
    """A choice of a Spec-Bench answer: tokens per step, for the answer or for each turn."""

    model_config = ConfigDict(extra="allow")
    accept_lengths: list[Tokens] | list[list[Tokens]]


class Answer(BaseModel):
    """A line of a Spec-Bench answer file, as far as ingest reads it (its other keys, such as
    ``model_id``, are allowed); the first choice is read."""

    model_config = ConfigDict(extra="allow")
    question_id: int | str
    choices: Annotated[list[Choice], Field(min_length=1)]


def _spec_bench(line: dict, where: str) -> RequestStats:
    answer = parse(Answer, line, where, IngestError)
    lengths = answer.choices[0].accept_lengths
    flat = [x for turn in lengths for x in (turn if isinstance(turn, list) else [turn])]
    if not flat or sum(flat) > INT64_MAX:
        raise IngestError(
            f"{where}: choices[0].accept_lengths must be a list of integers >= 1 "
            f"(tokens per step) whose sum is at most 2**63 - 1 (int64), got {len(flat)} "
            f"steps summing to {sum(flat)}"
        )
    per_acc = tuple(x - 1 for x in flat)
    return RequestStats(
        str(answer.question_id),
        len(flat),
        sum(per_acc),
        None,
        sum(flat),
        per_acc,
        None,
        histogram_from_steps(per_acc),
    )


FORMAT = EngineFormat("Spec-Bench", _spec_bench, source="Spec-Bench evaluation/inference_eagle.py")
