"""Reading an engine log into finished requests, one line at a time.

A log holds one JSON object per line, in any of the shapes the engines' clients save:

- a response as the engine sent it, or wrapped as ``{"prompt_id": ..., "response": {...}}`` (the
  client's own id for the request);
- a raw Server-Sent Events capture: ``data: {...}`` lines, ``data: [DONE]``, blank lines and the
  other SSE fields (``event:``, ``id:``, ``retry:``, ``: comment``), which are skipped;
- one stream chunk per line: chunks are grouped by request id and only the final one (the one
  that carries the statistics) is read; a stream that never sends it is refused at the end;
- the gateway's records (``specscope gateway``): the wrapper above with ``domain``, ``backend``,
  ``path`` and, for a streamed answer, ``"stream": true`` (other fields are ignored).

Two kinds of line are read but not kept, and counted in :class:`Skipped` so that the caller says
so: a last line that is not JSON (a line cut short when its writer was killed or the disk
filled; the same in the middle of the log is refused, as it means the file is damaged), and a
gateway's streamed answer whose events carried no statistics (older gateways logged those in the
request log; a vLLM client that streams without ``stream_options.include_usage`` gets them), or a
line its format says it writes for a request without statistics (``EngineFormat.unstated``:
AIPerf's records without ``spec_decode_acceptance``). A
record of the gateway's errors log (a failed request: ``status``/``error``, no ``response``) is
refused naming that log.

This module does not join prompts or write files (:mod:`specscope.serving.ingest.run` does).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ...prompts.items import jsonl_objects
from ...schemas import parse
from ..request_stats import EngineFormat, IngestError, RequestStats
from .formats import engine_format

SSE_FIELDS = (b"event:", b"id:", b"retry:", b":")
STREAM_HINTS = {
    "vllm": "vLLM sends metrics only in the final usage chunk: set stream_options."
    "include_usage: true or start vLLM with --enable-force-include-usage",
    "llama.cpp": "llama-server sends timings in the final chunk (stop: true or a finish_reason)",
}
NAMED = 3  # lines named in a warning; the rest are counted


@dataclass(frozen=True)
class LoggedRequest:
    where: str  # path:line of the line that finished the request
    prompt_id: str | None  # the client's id (the wrapper's prompt_id), if the line has one
    stats: RequestStats | None  # None: an answer without statistics (counted in Skipped)


@dataclass
class Skipped:
    """The lines of a log that were read but not kept: a torn last line, and answers that
    carried no statistics (their count, and the first :data:`NAMED` of them by ``path:line``)."""

    fmt: str
    torn_last_line: str | None = None  # path:line
    without_statistics: int = 0
    first_without_statistics: list[str] = field(default_factory=list)

    def answer_without_statistics(self, where: str) -> None:
        self.without_statistics += 1
        if len(self.first_without_statistics) < NAMED:
            self.first_without_statistics.append(where)

    def warnings(self) -> list[str]:
        """One sentence per kind of line skipped (none: nothing was)."""
        out = []
        if self.without_statistics:
            n, named = self.without_statistics, ", ".join(self.first_without_statistics)
            more = f" and {n - NAMED} more" if n > NAMED else ""
            spec = engine_format(self.fmt)
            out.append(
                f"{n} line(s) without statistics skipped ({named}{more}): "
                + (
                    spec.unstated_why
                    or f"streamed answers whose events carried no {spec.stats_key}; "
                    + STREAM_HINTS.get(self.fmt, "the stream's last event, as logged, had none")
                )
            )
        if self.torn_last_line:
            out.append(
                f"{self.torn_last_line}: the last line is not valid JSON and was skipped (a "
                "line cut short when its writer was killed or the disk filled)"
            )
        return out

    def as_dict(self) -> dict:
        return {
            "torn_last_line": self.torn_last_line,
            "without_statistics": self.without_statistics,
        }


def _unframe(raw: bytes) -> bytes:
    """A log line's JSON: SSE framing removed (``data:`` unwrapped; ``[DONE]`` and the other SSE
    fields carry none)."""
    raw = raw.strip()
    if raw.startswith(b"data:"):
        raw = raw[5:].strip()
        return b"" if raw == b"[DONE]" else raw
    return b"" if raw.startswith(SSE_FIELDS) else raw


def _objects(path: Path, skipped: Skipped) -> Iterator[tuple[str, object]]:
    """``(path:line, JSON value)`` of each line holding JSON, SSE framing removed; a last line cut
    short is recorded in ``skipped``, any other line that is not JSON raises naming it."""

    def torn(where: str) -> None:
        skipped.torn_last_line = where

    return jsonl_objects(path, IngestError, "log file", _unframe, on_torn_end=torn)


def _failed_request(line: dict, where: str) -> IngestError:
    """The error for a record of the gateway's errors log (a failed request)."""
    status = line.get("status")
    what = f" (status {status})" if isinstance(status, int) else ""
    return IngestError(
        f"{where}: this line is a failed request{what} as the gateway's errors log records "
        "them (fields 'error'/'status', no 'response'), not an answer with statistics: ingest "
        "the gateway's request log (the --log file, not X.errors.jsonl)"
    )


def _client_id(line: dict, where: str) -> str | None:
    """The line's ``prompt_id`` (0 included), or None."""
    value = line.get("prompt_id")
    return None if value is None else str(parse(str | int, value, where, IngestError, "prompt_id"))


def _stream_key(body: dict) -> str:
    value = (
        body.get("data", body).get("id") if isinstance(body.get("data"), dict) else body.get("id")
    )
    return str(value) if value is not None else ""


def _choice_indices(body: dict) -> set:
    body = body["data"] if isinstance(body.get("data"), dict) else body
    choices = body.get("choices")
    return (
        {c.get("index", 0) for c in choices if isinstance(c, dict)}
        if isinstance(choices, list)
        else set()
    )


def _unstated(line: dict, body: dict, spec: EngineFormat) -> bool:
    """Whether ``line`` is a gateway's streamed answer whose events carried no statistics."""
    return (
        line.get("stream") is True
        and body is not line
        and spec.stats_key is not None
        and body.get(spec.stats_key) is None
    )


def iter_requests(path: Path, fmt: str, skipped: Skipped | None = None) -> Iterator[LoggedRequest]:
    """Each finished request of the log, in the order its statistics appear; every line is
    checked by the format's parser (a bad one raises naming ``path:line`` and the field).

    A torn last line and the gateway's streamed answers without statistics are counted in
    ``skipped``; the latter are also yielded, with ``stats`` None, so that a join by order still
    counts them."""
    spec: EngineFormat = engine_format(fmt)
    path = Path(path)
    skipped = skipped if skipped is not None else Skipped(fmt)
    streams: dict[str, set] = {}  # request id -> choice indices seen in its chunks so far
    for where, line in _objects(path, skipped):
        if not isinstance(line, dict):
            raise IngestError(f"{where}: expected a JSON object")
        if "response" not in line and "prompt_id" in line and ("error" in line or "status" in line):
            raise _failed_request(line, where)
        body = line["response"] if isinstance(line.get("response"), dict) else line
        client = _client_id(line, where)
        if _unstated(line, body, spec) or spec.unstated(body):
            skipped.answer_without_statistics(where)
            yield LoggedRequest(where, client, None)
            continue
        if spec.partial(body):
            streams.setdefault(_stream_key(body), set()).update(_choice_indices(body))
            continue
        seen = streams.pop(_stream_key(body), None)
        if seen and not _choice_indices(body):  # a final usage chunk has no choices
            body = {**body, "choices": [{"index": i} for i in sorted(seen)]}
        yield LoggedRequest(where, client, spec.parse(body, where))
    if streams:
        first = next(iter(streams))
        raise IngestError(
            f"{path}: the stream of request {first!r} ({len(streams)} stream(s) "
            "in all) ends without its final chunk; "
            + STREAM_HINTS.get(fmt, "the final chunk carries the statistics")
        )
