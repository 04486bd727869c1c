"""Reading an engine log into finished requests, one line at a time.

A log holds one JSON object per line, in any of the shapes the engines' clients save:

- a response as the engine sent it, or wrapped as ``{"prompt_id": ..., "response": {...}}`` (the
  client's own id for the request);
- a raw Server-Sent Events capture: ``data: {...}`` lines, ``data: [DONE]``, blank lines and the
  other SSE fields (``event:``, ``id:``, ``retry:``, ``: comment``), which are skipped;
- one stream chunk per line: chunks are grouped by request id and only the final one (the one
  that carries the statistics) is read; a stream that never sends it is refused at the end.

This module does not join prompts or write files (:mod:`specscope.serving.ingest.run` does).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ...prompts.items import jsonl_objects
from .formats import EngineFormat, IngestError, RequestStats, engine_format, shown

SSE_FIELDS = (b"event:", b"id:", b"retry:", b":")
STREAM_HINTS = {
    "vllm": "vLLM sends metrics only in the final usage chunk: set stream_options."
    "include_usage: true or start vLLM with --enable-force-include-usage",
    "llama.cpp": "llama-server sends timings in the final chunk (stop: true or a finish_reason)",
}


@dataclass(frozen=True)
class LoggedRequest:
    where: str  # path:line of the line that finished the request
    prompt_id: str | None  # the client's id (the wrapper's prompt_id), if the line has one
    stats: RequestStats


def _unframe(raw: bytes) -> bytes:
    """A log line's JSON: SSE framing removed (``data:`` unwrapped; ``[DONE]`` and the other SSE
    fields carry none)."""
    raw = raw.strip()
    if raw.startswith(b"data:"):
        raw = raw[5:].strip()
        return b"" if raw == b"[DONE]" else raw
    return b"" if raw.startswith(SSE_FIELDS) else raw


def _objects(path: Path) -> Iterator[tuple[str, object]]:
    """``(path:line, JSON value)`` of each line holding JSON, SSE framing removed."""
    return jsonl_objects(path, IngestError, "log file", _unframe)


def _client_id(line: dict, where: str) -> str | None:
    """The line's ``prompt_id`` (0 included), or None."""
    value = line.get("prompt_id")
    if value is None:
        return None
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise IngestError(
            f"{where}: field 'prompt_id' must be a string or an integer, got {shown(value)}"
        )
    return str(value)


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


def iter_requests(path: Path, fmt: str) -> Iterator[LoggedRequest]:
    """Each finished request of the log, in the order its statistics appear; every line is
    checked by the format's parser (a bad one raises naming ``path:line`` and the field)."""
    spec: EngineFormat = engine_format(fmt)
    path = Path(path)
    streams: dict[str, set] = {}  # request id -> choice indices seen in its chunks so far
    for where, line in _objects(path):
        if not isinstance(line, dict):
            raise IngestError(f"{where}: expected a JSON object")
        body = line["response"] if isinstance(line.get("response"), dict) else line
        client = _client_id(line, where)
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
