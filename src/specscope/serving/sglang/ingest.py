"""SGLang's per-request speculation counts (``meta_info`` of a native /generate answer) as
:class:`~specscope.serving.request_stats.RequestStats`: the parser and the key of the statistics
in an answer (``meta_info``). It reads one answer; it does not read files.
"""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from ...schemas import parse
from ..request_stats import (
    Count,
    EngineFormat,
    IngestError,
    RequestStats,
    check_counts,
    checked_histogram,
)

# python/sglang/srt/managers/tokenizer_manager.py `_calculate_spec_decoding_metrics`, three
# generations of names for the same counts (read newest first):
#   @001067ff: spec_num_correct_drafts, spec_num_proposed_drafts, spec_correct_drafts_histogram
#              (+ aliases spec_accepted_drafts, spec_proposed_drafts, spec_accept_histogram),
#              all written only when spec_verify_ct > 0;
#   earlier:   spec_accept_token_num, spec_draft_token_num, spec_accept_histogram (PR #18332).
# histogram[j] = verify steps that accepted exactly j drafts (schedule_batch.py
# update_spec_correct_drafts_histogram). Older SGLang logs only spec_verify_ct: accepted drafts
# are then derived as completion_tokens - 1 - spec_verify_ct.

SGLANG_ACCEPTED = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
SGLANG_DRAFTED = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
SGLANG_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def _renamed(names: tuple[str, ...]):
    return Field(
        None,
        validation_alias=AliasChoices(*names),
        description=f"the first present of {', '.join(names)} (newest name first)",
    )


class MetaInfo(BaseModel):
    """The ``meta_info`` of an SGLang /generate answer, as far as ingest reads it (its other keys
    are allowed); a renamed count is read under the first of its names present."""

    model_config = ConfigDict(extra="allow")
    spec_verify_ct: Count | None = None  # null or absent: nothing verified
    completion_tokens: Count
    spec_num_correct_drafts: Count | None = _renamed(SGLANG_ACCEPTED)
    spec_num_proposed_drafts: Count | None = _renamed(SGLANG_DRAFTED)
    spec_correct_drafts_histogram: list[Count] | None = _renamed(SGLANG_HISTOGRAM)


def _logged_as(meta: dict, names: tuple[str, ...]) -> str | None:
    return next((name for name in names if name in meta), None)


def _sglang(line: dict, where: str) -> RequestStats:
    meta = line.get("meta_info")
    if meta is None:
        raise IngestError(f"{where}: no meta_info (an SGLang /generate response)")
    info = parse(MetaInfo, meta, where, IngestError, "meta_info")
    where = f"{where}: meta_info"
    steps, generated = info.spec_verify_ct or 0, info.completion_tokens
    accepted, drafted = info.spec_num_correct_drafts, info.spec_num_proposed_drafts
    acc_key = _logged_as(meta, SGLANG_ACCEPTED)
    request_id = str(meta.get("id", ""))
    if steps == 0:  # nothing verified: SGLang @001067ff writes no spec_* field at all then
        if accepted:
            raise IngestError(
                f"{where}: spec_verify_ct is 0 but {acc_key} is {accepted};"
                " without a verify step no draft is accepted"
            )
        return RequestStats(request_id, 0, 0, 0, generated)
    if generated < steps + 1:
        raise IngestError(
            f"{where}: completion_tokens ({generated}) is less than "
            f"spec_verify_ct + 1 ({steps + 1}); each verify step yields at least "
            "one token, and the prefill one"
        )
    derived: tuple[str, ...] = ()
    if accepted is None:
        accepted, derived = generated - 1 - steps, ("accepted",)
        acc_key = "accepted drafts (completion_tokens - 1 - spec_verify_ct)"
    values, hist_key = info.spec_correct_drafts_histogram, _logged_as(meta, SGLANG_HISTOGRAM)
    histogram = (
        None
        if values is None
        else checked_histogram(values, where, hist_key, steps, accepted, "spec_verify_ct", acc_key)
    )
    check_counts(
        where,
        {
            "steps": "spec_verify_ct",
            "accepted": acc_key,
            "drafted": SGLANG_DRAFTED[0],
            "generated": "completion_tokens",
        },
        steps,
        accepted,
        drafted,
        generated,
        len(histogram) - 1 if histogram else None,
    )
    return RequestStats(
        request_id, steps, accepted, drafted, generated, histogram=histogram, derived=derived
    )


FORMAT = EngineFormat(
    "SGLang",
    _sglang,
    "meta_info",
    derivations={
        "accepted": "completion_tokens - 1 - spec_verify_ct (SGLang logged no accepted-draft count)"
    },
    source="sglang python/sglang/srt/managers/tokenizer_manager.py @001067ff",
)
