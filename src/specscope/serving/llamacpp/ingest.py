"""llama-server's per-request ``timings`` as :class:`~specscope.serving.request_stats.RequestStats`:
the parser, the stream-chunk test, the build check and the key of the statistics in an answer
(``timings``). It reads one answer; it does not read files or start llama-server.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from ...schemas import parse
from ..request_stats import Count, EngineFormat, IngestError, RequestStats, check_counts

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


class Timings(BaseModel):
    """llama-server's ``timings`` of one answer, as far as ingest reads it (its other keys, such as
    ``predicted_ms``, are allowed); no ``draft_n`` and no ``draft_n_accepted``: nothing drafted."""

    model_config = ConfigDict(extra="allow")
    predicted_n: Count
    draft_n: Count | None = None
    draft_n_accepted: Count | None = None
    draft_n_verif_steps: Count | None = None  # not written by llama-server (PR #27676 closed)


def _llamacpp(line: dict, where: str) -> RequestStats:
    if line.get("timings") is None:
        raise IngestError(f"{where}: no timings (a llama-server completion response)")
    timings = parse(Timings, line["timings"], where, IngestError, "timings")
    version = line.get("system_fingerprint")
    version = version if isinstance(version, str) and version else None
    where = f"{where}: timings"
    generated, drafted, accepted = timings.predicted_n, timings.draft_n, timings.draft_n_accepted
    request_id = line.get("id")
    request_id = (
        str(request_id)
        if isinstance(request_id, (str, int)) and not isinstance(request_id, bool)
        else ""
    )  # /completion: no id (id_slot is a slot)
    if drafted is None and accepted is None:
        return RequestStats(request_id, 0, 0, 0, generated, engine_version=version)
    if drafted is None or accepted is None:
        raise IngestError(
            f"{where}: {'draft_n' if drafted is None else 'draft_n_accepted'} is missing; "
            "llama-server writes draft_n and draft_n_accepted together (neither: nothing drafted)"
        )
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
    steps = timings.draft_n_verif_steps
    if steps is None:
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


def _llamacpp_version(version: str) -> None:
    if not re.match(r"^b\d+(-\w+)?$", version) and not re.match(r"^\d+\.\d+", version):
        raise IngestError(
            f"--engine-version {version!r} is not a llama.cpp build; allowed: "
            "bNNNN or bNNNN-COMMIT (llama-server's system_fingerprint), or the "
            "llama-cpp-python version (e.g. 0.3.36) whose llama.cpp it vendors"
        )


FORMAT = EngineFormat(
    "llama.cpp",
    _llamacpp,
    "timings",
    _llamacpp_partial,
    _llamacpp_version,
    derivations={"steps": LLAMACPP_STEPS},
    source="llama.cpp tools/server/server-common.cpp, server-context.cpp (vendored by "
    "llama-cpp-python 0.3.36)",
)
