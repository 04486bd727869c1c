"""SGLang's per-request speculation counts (``meta_info`` of a native /generate answer) as
:class:`~specscope.serving.request_stats.RequestStats`: the parser and the key of the statistics
in an answer (``meta_info``). It reads one answer; it does not read files.
"""

from __future__ import annotations

from ..request_stats import (
    EngineFormat,
    IngestError,
    RequestStats,
    check_counts,
    checked_histogram,
    first_logged_field,
    logged_field,
    logged_section,
    shown,
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


def _sglang(line: dict, where: str) -> RequestStats:
    meta = logged_section(line, "meta_info", where, "an SGLang /generate response")
    where = f"{where}: meta_info"
    steps = (
        logged_field(meta, "spec_verify_ct", where) if meta.get("spec_verify_ct") is not None else 0
    )
    generated = logged_field(meta, "completion_tokens", where)
    request_id = str(meta.get("id", ""))
    if steps == 0:  # nothing verified: SGLang @001067ff writes no spec_* field at all then
        for key in SGLANG_ACCEPTED:
            if meta.get(key):
                raise IngestError(
                    f"{where}: spec_verify_ct is 0 but {key} is {shown(meta[key])};"
                    " without a verify step no draft is accepted"
                )
        return RequestStats(request_id, 0, 0, 0, generated)
    if generated < steps + 1:
        raise IngestError(
            f"{where}: completion_tokens ({generated}) is less than "
            f"spec_verify_ct + 1 ({steps + 1}); each verify step yields at least "
            "one token, and the prefill one"
        )
    acc_key, accepted = first_logged_field(meta, SGLANG_ACCEPTED, where)
    _, drafted = first_logged_field(meta, SGLANG_DRAFTED, where)
    derived: tuple[str, ...] = ()
    if acc_key is None:
        accepted, derived = generated - 1 - steps, ("accepted",)
        acc_key = "accepted drafts (completion_tokens - 1 - spec_verify_ct)"
    hist_key, values = first_logged_field(meta, SGLANG_HISTOGRAM, where, list)
    histogram = (
        None
        if hist_key is None
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
