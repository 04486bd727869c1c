"""What every engine's per-request speculation statistics become, and the checks they share.

:class:`RequestStats` is one finished request as an engine logged it; :class:`EngineFormat` is one
engine's log format (its parser, stream-chunk test, version check, derivations and the key of its
statistics in an answer). Each engine's parser lives with that engine
(:mod:`specscope.serving.vllm.ingest`, :mod:`specscope.serving.sglang.ingest`,
:mod:`specscope.serving.llamacpp.ingest`, :mod:`specscope.serving.specbench`), which declares its
statistics record as a pydantic model of :data:`Count` fields (read with
:func:`specscope.schemas.parse`) and makes the checks no schema can say with :func:`check_counts`
and :func:`checked_histogram` here; the registry of formats is
:mod:`specscope.serving.ingest.formats`. This module does not read files, join prompts or write
anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field

from ..errors import SpecscopeError


class IngestError(SpecscopeError, ValueError):
    """A log line or prompt file that cannot be ingested; the message names the field."""


INT64_MAX = 2**63 - 1  # counts are stored as int64: a larger one is no count an engine logs
# a count in an engine's statistics record (each engine's record is a pydantic model of these)
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]


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


def checked_histogram(
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


def last_step_max(
    per_step_accepted: tuple[int, ...] | None, k: int | None, histogram: tuple[int, ...] | None
) -> int | None:
    """The most drafts a request's last verify step can have accepted (:func:`check_counts`'s
    ``last_step_max``): its own count where per-step counts are logged, else the draft length
    ``k``, else the histogram's largest bin; None where none is known."""
    if per_step_accepted:
        return per_step_accepted[-1]
    if k is not None:
        return k
    return len(histogram) - 1 if histogram else None


def histogram_from_steps(per_step: tuple[int, ...]) -> tuple[int, ...]:
    counts = [0] * (max(per_step, default=0) + 1)
    for a in per_step:
        counts[a] += 1
    return tuple(counts)


@dataclass(frozen=True)
class EngineFormat:
    """One engine's log format: its parser, how to tell a stream chunk that is not the last,
    which versions it reads, and how each count it may derive is derived. ``stats_key``: the
    field of an answer that carries its statistics (the one the gateway looks for in a stream's
    events); None where no answer goes without them. ``unstated``: whether a line is one the
    format writes for a request without statistics (skipped and counted, not refused), and
    ``unstated_why`` says which lines those are, for the warning."""

    engine: str
    parse: Callable[[dict, str], RequestStats]
    stats_key: str | None = None
    partial: Callable[[dict], bool] = lambda line: False
    check_version: Callable[[str], None] = lambda version: None
    derivations: dict[str, str] = field(default_factory=dict)
    source: str = ""  # the engine file (and commit) the parser follows
    unstated: Callable[[dict], bool] = lambda line: False
    unstated_why: str = ""
