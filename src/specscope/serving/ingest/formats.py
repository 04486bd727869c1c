"""The engines' per-request speculation statistics, one parser per engine format.

Each entry of :data:`FORMATS` reads one finished request (a JSON object, already unwrapped from
SSE framing and stream chunks by :mod:`specscope.serving.ingest.logs`) into :class:`RequestStats`, reading
the engine's own counts and deriving a count only where the engine logs none (the count's name
is then in ``RequestStats.derived`` and the format's ``derivations`` say how). The facts each
parser relies on are cited beside it (engine file at a commit). This module does not read files,
join prompts or write anything.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import SpecscopeError


class IngestError(SpecscopeError, ValueError):
    """A log line or prompt file that cannot be ingested; the message names the field."""


INT64_MAX = 2**63 - 1  # counts are stored as int64: a larger one is no count an engine logs


@dataclass(frozen=True)
class RequestStats:
    """One request's speculation, as an engine logged it.

    ``steps`` counts verify steps only (steps where something was drafted); a request that
    drafted nothing has 0 steps and 0 accepted. ``histogram[j]``: verify steps that accepted
    exactly j drafts (where the engine logs it or its per-step arrays give it). ``derived``:
    the counts computed by specscope rather than read from the log."""

    request_id: str
    steps: int  # verify steps
    accepted: int  # draft tokens accepted over those steps
    drafted: int | None = None  # draft tokens proposed (None: not logged)
    generated: int | None = None  # tokens generated
    per_step_accepted: tuple[int, ...] | None = None
    per_step_drafted: tuple[int, ...] | None = None
    histogram: tuple[int, ...] | None = None
    derived: tuple[str, ...] = ()
    engine_version: str | None = None  # as the line states it (llama-server system_fingerprint)


def _is_count(value, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= INT64_MAX


def shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _field(obj: dict, key: str, where: str, kind=int):
    if key not in obj:
        raise IngestError(f"{where}: missing field {key!r}")
    value = obj[key]
    if kind is int and not _is_count(value):
        raise IngestError(
            f"{where}: field {key!r} must be a non-negative integer of at most "
            f"2**63 - 1 (int64), got {shown(value)}"
        )
    if kind is list and not (isinstance(value, list) and all(_is_count(v) for v in value)):
        raise IngestError(
            f"{where}: field {key!r} must be a list of non-negative integers of "
            "at most 2**63 - 1 (int64)"
        )
    return value


def _first_field(obj: dict, keys: tuple[str, ...], where: str, kind=int):
    """The first of ``keys`` present in ``obj`` (engines renamed fields across versions), as
    ``(key, value)``; ``(None, None)`` if none is."""
    for key in keys:
        if key in obj:
            return key, _field(obj, key, where, kind)
    return None, None


def _section(line: dict, key: str, where: str, what: str) -> dict:
    value = line.get(key)
    if not isinstance(value, dict):
        raise IngestError(f"{where}: no {key} ({what})")
    return value


def check_counts(
    where: str,
    names: dict[str, str],
    steps: int,
    accepted: int,
    drafted: int | None = None,
    generated: int | None = None,
    last_step_max: int | None = None,
) -> None:
    """Refuse counts no engine can log.

    Accepted drafts never exceed drafted ones; no verify step, no accepted draft. The first
    token comes from the prefill and every verify step but the last yields all its accepted
    drafts and one token of the target; the last may be cut short by a stop (EOS, stop string,
    max_tokens) after its accepted drafts were counted: llama-server adds ``n_accepted`` to
    ``n_draft_accepted`` before the ``process_token`` loop that stops at EOS, a stop string or
    ``n_predict`` (tools/server/server-context.cpp, in the llama.cpp that llama-cpp-python 0.3.36
    vendors and on master @001d906a); vLLM's scheduler counts ``num_accepted`` before
    ``_update_request_with_output`` trims the tokens after a stop. So
    ``accepted + steps + 1 <= generated + (drafts the last step accepted)``, which is at most
    ``last_step_max`` (the draft length, where logged; else ``accepted``).
    ``names``: each count's field as the log spells it (keys steps, accepted, drafted,
    generated)."""
    if drafted is not None and accepted > drafted:
        raise IngestError(
            f"{where}: {names['accepted']} ({accepted}) exceeds {names['drafted']} "
            f"({drafted}); accepted drafts cannot outnumber drafted ones"
        )
    if steps == 0 and accepted:
        raise IngestError(
            f"{where}: {names['steps']} is 0 but {names['accepted']} is {accepted}; "
            "without a verify step no draft is accepted"
        )
    if generated is None or steps == 0:
        return
    cut = accepted if last_step_max is None else min(accepted, last_step_max)
    if accepted + steps + 1 > generated + cut:
        raise IngestError(
            f"{where}: {names['accepted']} + {names['steps']} ({accepted} + {steps}) exceeds "
            f"{names['generated']} - 1 ({generated - 1}) by more than the {cut} drafts the last "
            "step can have accepted; the first token comes from the prefill and each verify step "
            "yields its accepted drafts and one token of the target (only the last can be cut "
            "by a stop)"
        )


def _histogram(
    values: list[int],
    where: str,
    name: str,
    steps: int,
    accepted: int,
    steps_name: str,
    accepted_name: str,
) -> tuple[int, ...]:
    """A histogram of verify steps by accepted drafts, checked against the totals."""
    if sum(values) != steps:
        raise IngestError(
            f"{where}: {name} sums to {sum(values)} steps, not {steps_name} "
            f"({steps}); entry j counts the verify steps that accepted j drafts"
        )
    if sum(j * n for j, n in enumerate(values)) != accepted:
        raise IngestError(
            f"{where}: {name} gives {sum(j * n for j, n in enumerate(values))} "
            f"accepted drafts, not {accepted_name} ({accepted})"
        )
    return tuple(values)


def _from_steps(per_step: tuple[int, ...]) -> tuple[int, ...]:
    counts = [0] * (max(per_step, default=0) + 1)
    for a in per_step:
        counts[a] += 1
    return tuple(counts)


# --- vLLM ------------------------------------------------------------------------------------------
# docs/features/speculative_decoding/acceptance_metrics.md @02cf515f (vLLM >= 0.29, PR #48915):
# metrics.speculative_decoding {num_spec_steps, num_accepted_draft_tokens, num_draft_tokens,
# num_spec_tokens, acceptance_histogram (dense, num_spec_tokens + 1), per_step_* in detailed};
# "null for n > 1"; steps with no scheduled draft are omitted (so steps are verify steps only);
# streaming: only the final usage chunk carries it.

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
    if not isinstance(spec, dict):
        raise IngestError(
            f"{where}: no metrics.speculative_decoding (start vLLM >= 0.29 with "
            f"{VLLM_FLAG}; when streaming, also stream_options.include_usage)"
        )
    usage = body.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise IngestError(f"{where}: field 'usage' must be an object, got {shown(usage)}")
    generated = None
    if usage is not None and usage.get("completion_tokens") is not None:
        generated = _field(usage, "completion_tokens", f"{where}: usage")
    where = f"{where}: metrics.speculative_decoding"
    steps = _field(spec, "num_spec_steps", where)
    accepted = _field(spec, "num_accepted_draft_tokens", where)
    drafted = _field(spec, "num_draft_tokens", where)
    k = _field(spec, "num_spec_tokens", where) if spec.get("num_spec_tokens") is not None else None
    per_acc = per_draft = histogram = None
    if "per_step_accepted" in spec or "per_step_drafted" in spec:
        per_acc = tuple(_field(spec, "per_step_accepted", where, list))
        per_draft = tuple(_field(spec, "per_step_drafted", where, list))
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
        histogram = _from_steps(per_acc)
    if spec.get("acceptance_histogram") is not None:
        values = _field(spec, "acceptance_histogram", where, list)
        if k is not None and len(values) != k + 1:
            raise IngestError(
                f"{where}: acceptance_histogram has {len(values)} entries; vLLM "
                f"writes num_spec_tokens + 1 ({k + 1})"
            )
        logged = _histogram(
            values,
            where,
            "acceptance_histogram",
            steps,
            accepted,
            "num_spec_steps",
            "num_accepted_draft_tokens",
        )
        histogram = histogram if histogram is not None else logged
    last = (
        per_acc[-1]
        if per_acc
        else (k if k is not None else (len(histogram) - 1 if histogram else None))
    )
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


# --- SGLang ------------------------------------------------------------------------------------------
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
    meta = _section(line, "meta_info", where, "an SGLang /generate response")
    where = f"{where}: meta_info"
    steps = _field(meta, "spec_verify_ct", where) if meta.get("spec_verify_ct") is not None else 0
    generated = _field(meta, "completion_tokens", where)
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
    acc_key, accepted = _first_field(meta, SGLANG_ACCEPTED, where)
    _, drafted = _first_field(meta, SGLANG_DRAFTED, where)
    derived: tuple[str, ...] = ()
    if acc_key is None:
        accepted, derived = generated - 1 - steps, ("accepted",)
        acc_key = "accepted drafts (completion_tokens - 1 - spec_verify_ct)"
    hist_key, values = _first_field(meta, SGLANG_HISTOGRAM, where, list)
    histogram = (
        None
        if hist_key is None
        else _histogram(values, where, hist_key, steps, accepted, "spec_verify_ct", acc_key)
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


# --- llama.cpp -------------------------------------------------------------------------------------
# tools/server/server-common.cpp `server_slot_stats::to_json` (llama.cpp vendored by
# llama-cpp-python 0.3.36): draft_n and draft_n_accepted are written only `if (n_draft_tokens >
# 0)`; a missing pair means nothing was drafted. No verify-step count is written
# (n_draft_verif_steps is kept in the slot but not in `timings`; PR #27676 closed), so steps are
# derived. /v1/* responses carry system_fingerprint = llama_build_info() (server-task.cpp).

LLAMACPP_STEPS = (
    "predicted_n - 1 - draft_n_accepted (at least 1 where something was drafted): "
    "llama-server logs no verify-step count, so tokens decoded without a draft (e.g. "
    "the last token of a max_tokens budget, drafts emptied by --spec-draft-p-min or "
    "--spec-draft-n-min) count as steps and a stop inside an accepted run lowers it"
)


def _llamacpp(line: dict, where: str) -> RequestStats:
    timings = _section(line, "timings", where, "a llama-server completion response")
    version = line.get("system_fingerprint")
    version = version if isinstance(version, str) and version else None
    where = f"{where}: timings"
    generated = _field(timings, "predicted_n", where)
    request_id = line.get("id")
    request_id = (
        str(request_id)
        if isinstance(request_id, (str, int)) and not isinstance(request_id, bool)
        else ""
    )  # /completion: no id (id_slot is a slot)
    if "draft_n" not in timings and "draft_n_accepted" not in timings:
        return RequestStats(request_id, 0, 0, 0, generated, engine_version=version)
    drafted = _field(timings, "draft_n", where)
    accepted = _field(timings, "draft_n_accepted", where)
    names = {
        "steps": "draft_n_verif_steps",
        "accepted": "draft_n_accepted",
        "drafted": "draft_n",
        "generated": "predicted_n",
    }
    if drafted and generated < 2:
        raise IngestError(
            f"{where}: draft_n is {drafted} but predicted_n is {generated}; a "
            "request that drafted yields the prefill's token and at least one per "
            "verify step"
        )
    derived: tuple[str, ...] = ()
    if "draft_n_verif_steps" in timings:
        steps = _field(timings, "draft_n_verif_steps", where)
    else:
        steps = max(generated - 1 - accepted, 1) if drafted else 0
        names["steps"], derived = "verify steps (predicted_n - 1 - draft_n_accepted)", ("steps",)
    check_counts(where, names, steps, accepted, drafted, generated)
    return RequestStats(
        request_id, steps, accepted, drafted, generated, derived=derived, engine_version=version
    )


def _llamacpp_partial(line: dict) -> bool:
    """A stream chunk before the last: /completion's ``stop: false``, or an OpenAI chunk whose
    choices have no finish_reason yet."""
    if line.get("stop") is False:
        return True
    if str(line.get("object", "")).endswith(".chunk"):
        choices = line.get("choices")
        return not (
            isinstance(choices, list)
            and any(isinstance(c, dict) and c.get("finish_reason") for c in choices)
        )
    return False


# --- Spec-Bench ------------------------------------------------------------------------------------
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
    if not flat or not all(_is_count(x, least=1) for x in flat) or sum(flat) > INT64_MAX:
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
        _from_steps(per_acc),
    )


# --- the registry ------------------------------------------------------------------------------------

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


def _llamacpp_version(version: str) -> None:
    if not re.match(r"^b\d+(-\w+)?$", version) and not re.match(r"^\d+\.\d+", version):
        raise IngestError(
            f"--engine-version {version!r} is not a llama.cpp build; allowed: "
            "bNNNN or bNNNN-COMMIT (llama-server's system_fingerprint), or the "
            "llama-cpp-python version (e.g. 0.3.36) whose llama.cpp it vendors"
        )


@dataclass(frozen=True)
class EngineFormat:
    """One engine's log format: its parser, how to tell a stream chunk that is not the last,
    which versions it reads, and how each count it may derive is derived. ``stats_key``: the
    field of an answer that carries its statistics (the one the gateway looks for in a stream's
    events); None where no answer goes without them."""

    engine: str
    parse: Callable[[dict, str], RequestStats]
    stats_key: str | None = None
    partial: Callable[[dict], bool] = lambda line: False
    check_version: Callable[[str], None] = lambda version: None
    derivations: dict[str, str] = field(default_factory=dict)
    source: str = ""  # the engine file (and commit) the parser follows


FORMATS: dict[str, EngineFormat] = {
    "vllm": EngineFormat(
        "vLLM",
        _vllm,
        "metrics",
        _vllm_partial,
        _vllm_version,
        source="vllm docs/features/speculative_decoding/acceptance_metrics.md @02cf515f",
    ),
    "sglang": EngineFormat(
        "SGLang",
        _sglang,
        "meta_info",
        derivations={
            "accepted": "completion_tokens - 1 - spec_verify_ct (SGLang logged no "
            "accepted-draft count)"
        },
        source="sglang python/sglang/srt/managers/tokenizer_manager.py @001067ff",
    ),
    "llama.cpp": EngineFormat(
        "llama.cpp",
        _llamacpp,
        "timings",
        _llamacpp_partial,
        _llamacpp_version,
        derivations={"steps": LLAMACPP_STEPS},
        source="llama.cpp tools/server/server-common.cpp, server-context.cpp (vendored by "
        "llama-cpp-python 0.3.36)",
    ),
    "spec-bench": EngineFormat(
        "Spec-Bench", _spec_bench, source="Spec-Bench evaluation/inference_eagle.py"
    ),
}


def engine_format(name: str) -> EngineFormat:
    if name not in FORMATS:
        raise IngestError(f"unknown format {name!r}; allowed: {', '.join(FORMATS)}")
    return FORMATS[name]
