"""The proxy itself: the ASGI application, its limits, each backend's client, the relay of
answers and the records it hands to the logs and observers, and the server that runs it, bounded
in time as well as in size (a deadline for each request's headers, one for an idle kept-alive
connection, a bound on the connections served at once, and one line per interval, not one per
attempt, while the process is out of descriptors).

It does not read deployment files (:mod:`.deployment`), open log files (:mod:`.logs`) or count
what it serves (:mod:`.metrics`).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import itertools
import json
import math
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

from ...errors import require
from ...files import os_error_reason
from .deployment import ENGINE_STATS_KEY, Backend, Deployment, request_text, routable_domains
from .logs import GatewayError, RequestLog, json_bytes, open_logs
from .metrics import GatewayMetrics, Prediction

# what each engine needs to put its statistics in an answer (ingest's hints say the same)
_STATS_HINT = {
    "llama.cpp": "llama-server adds timings to every answer, a stream's in its final chunk",
    "vllm": "vLLM adds them with --per-request-spec-decode-metrics summary|detailed (>= 0.29), "
    "and a streaming client must send stream_options.include_usage: true (or start vLLM with "
    "--enable-force-include-usage)",
    "sglang": "SGLang adds them to its native /generate answers",
}
ROUTES = ("/v1/chat/completions", "/v1/completions", "/completion")
MODELS_ROUTE = "/v1/models"
UNLISTED_HEADER = "x-specscope-unlisted"  # the backends whose /v1/models did not answer
PROMPT_ID_HEADER = b"x-prompt-id"
DOMAIN_HEADER = "x-specscope-domain"
STOPPED = "the gateway stopped before the engine answered"
# headers that describe one hop of a connection, not the message (RFC 9110 7.6.1), those that
# httpx recomputes for the body it sends or has already decoded, and the body's type (always JSON)
_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-encoding",
    }
)
_NOT_FORWARDED = _HOP_HEADERS | {"content-type", "accept-encoding", PROMPT_ID_HEADER.decode()}
MiB = 1 << 20


def _nominated(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[str]:
    """The header names that a message's ``Connection`` headers list (comma-separated, any
    case): hop-by-hop headers of that one connection, not forwarded (RFC 9110 7.6.1)."""
    return frozenset(
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.decode("latin-1").split(",")
    ) - {""}


@dataclass(frozen=True)
class GatewayLimits:
    """How much one request may ask of the gateway, how long it waits for a client's request and
    for a backend's answer."""

    max_request_bytes: int = 16 * MiB  # a larger request body: 413
    # a larger non-streamed answer: 502 (it is logged whole); a stream is cut after this many
    # bytes past its end (data: [DONE])
    max_answer_bytes: int = 64 * MiB
    max_event_bytes: int = 1 * MiB  # a longer SSE line is relayed but not read for statistics
    # per backend URL; beyond it: 503 at once. The server takes at most max_connections(...)
    # connections at once (see there)
    max_in_flight: int = 64
    connect_timeout: float = 5.0
    read_timeout: float = 600.0  # between two reads of an answer: a long generation is fine
    write_timeout: float = 60.0
    pool_timeout: float = 10.0  # waiting for one of the backend's max_in_flight connections
    graceful_timeout: float = 30.0  # at SIGTERM, for requests in flight to finish
    # from a connection (or the end of the answer before, on a kept-alive one) until the
    # request's headers are complete; a client slower than that is cut off (408 if it began)
    header_timeout: float = 10.0
    keep_alive_timeout: float = 5.0  # an idle kept-alive connection that sends nothing: closed

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise GatewayError(f"{f.name} must be a positive finite number, got {value!r}")

    def max_connections(self, backend_urls: int) -> int:
        """The connections the server serves at once: ``max_in_flight`` for each backend URL
        plus ``max_in_flight`` more for ``/health``, ``/metrics``, idle kept-alive connections
        and clients still sending their headers. It is uvicorn's ``limit_concurrency`` (a request
        that arrives while this many connections are open, or this many requests run, gets
        uvicorn's plain-text 503 without reaching the gateway, so it is in no log; the backends'
        own bound, a logged JSON 503, comes first) and the listen backlog (connections the
        kernel completes before the gateway accepts them; it caps the backlog at
        ``net.core.somaxconn``)."""
        return self.max_in_flight * (backend_urls + 1)


class _NonFinite(ValueError):
    pass


def _no_constant(name: str):
    raise _NonFinite(f"the request body holds {name}; JSON numbers must be finite")


def parse_request(raw: bytes) -> dict:
    """A request body as a JSON object; ValueError naming what is wrong (not JSON, nested too
    deeply, NaN or Infinity, not an object)."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("the request body is nested too deeply") from None
    except _NonFinite:
        raise
    except ValueError as e:
        raise ValueError(f"the request body must be a JSON object ({e})") from None
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    return body


class SseScanner:
    """The JSON objects of a server-sent event stream fed chunk by chunk: ``data:`` lines,
    ``[DONE]`` and other non-JSON data skipped. At most ``max_line`` bytes of an unfinished line
    are held: a longer line is skipped to its end (:attr:`overlong` says one was)."""

    def __init__(self, max_line: int = MiB):
        self.max_line = max_line
        self.done = False  # a ``data: [DONE]`` line was seen
        self.past_end: int | None = None  # bytes after that line in the chunk that held it
        self.overlong = False
        self._line = bytearray()
        self._skipping = False

    def feed(self, chunk: bytes) -> list[dict]:
        events, start = [], 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if not self._skipping and len(self._line) + end - start <= self.max_line:
                self._line += chunk[start:end]
                event = self._event(bytes(self._line).rstrip(b"\r"))
                if event is not None:
                    events.append(event)
                if self.done and self.past_end is None:
                    self.past_end = len(chunk) - end - 1
            self._line.clear()
            self._skipping = False
            start = end + 1
        if not self._skipping:
            if len(self._line) + len(chunk) - start > self.max_line:
                self._line.clear()
                self._skipping = self.overlong = True
            else:
                self._line += chunk[start:]
        return events

    def _event(self, line: bytes) -> dict | None:
        if not line.startswith(b"data:"):
            return None
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return None
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):
            return None
        return event if isinstance(event, dict) else None


Observer = Callable[[str, dict], None]


def _json_response(status: int, payload: dict, headers: Mapping[str, str] | None = None):
    from starlette.responses import JSONResponse  # the gateway extra

    return JSONResponse(payload, status_code=status, headers=headers)


def _error(status: int, message: str, kind: str, **extra) -> dict:
    return {"error": {"message": message, "type": kind, "code": status, **extra}}


class _Refusal(Exception):
    """A request the gateway answers itself with a JSON error."""

    def __init__(self, status: int, message: str, kind: str, **extra):
        super().__init__(message)
        self.status, self.message, self.kind, self.extra = status, message, kind, extra

    def response(self):
        headers = {"retry-after": "1"} if self.status == 503 else None
        return _json_response(
            self.status, _error(self.status, self.message, self.kind, **self.extra), headers
        )


class _ClientLeft(Exception):
    """The client disconnected before its answer was complete."""


async def _until_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(work: Awaitable, receive):
    """``work``'s result, or :class:`_ClientLeft` (``work`` cancelled) if the client disconnects
    first. Cancelling the caller (a gateway that stops) cancels ``work`` too."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watch):
            t.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.cancelled():
        raise _ClientLeft
    return task.result()


@dataclass
class _Upstream:
    """One backend URL's client (its own pool and timeouts) and its requests in flight."""

    client: object  # httpx.AsyncClient
    in_flight: int = 0


@dataclass
class _Pending:
    entry: dict
    started: float


class _Gateway:
    """The state behind the ASGI app: the logs, each backend's client, the requests in flight."""

    def __init__(
        self,
        deployment: Deployment,
        logs: Mapping[str, RequestLog],
        limits: GatewayLimits,
        observers: Sequence[Observer],
    ):
        import httpx  # the gateway extra, like starlette and uvicorn

        self.httpx = httpx
        self.deployment, self.logs, self.limits = deployment, logs, limits
        self.observers = tuple(observers)
        self.stats_key = ENGINE_STATS_KEY[deployment.engine]
        timeout = httpx.Timeout(
            connect=limits.connect_timeout,
            read=limits.read_timeout,
            write=limits.write_timeout,
            pool=limits.pool_timeout,
        )
        pool = httpx.Limits(
            max_connections=limits.max_in_flight,
            max_keepalive_connections=min(limits.max_in_flight, 16),
        )
        self.upstreams = {
            url: _Upstream(httpx.AsyncClient(timeout=timeout, limits=pool))
            for url in deployment.backend_urls()
        }
        self.pending: dict[int, _Pending] = {}
        self.ids = itertools.count()

    # --- records ---

    def _record(self, kind: str, entry: dict) -> None:
        """Append ``entry`` to the ``kind`` log; if that fails, to the errors log (the answer as
        ``answer``), else a line on stderr. Never raises: a log is no reason to fail an answer."""
        written = kind
        try:
            self.logs[kind].append(entry)
        except (OSError, ValueError, RecursionError) as e:
            reason = f"the {kind} log {self.logs[kind].path} could not be written: " + (
                os_error_reason(e) if isinstance(e, OSError) else str(e)
            )
            written = None
            if kind == "requests":
                # the answer kept as "answer": no errors-log line has a "response" to ingest
                entry = {k: v for k, v in entry.items() if k != "response"} | {
                    "answer": entry.get("response"),
                    "error": reason,
                }
                try:
                    self.logs["errors"].append(entry)
                    written = "errors"
                except (OSError, ValueError, RecursionError):
                    pass
            if written is None:
                print(
                    f"specscope gateway: {reason}; request {entry['prompt_id']!r} is in no log",
                    file=sys.stderr,
                )
        if written is not None:
            for observer in self.observers:
                try:
                    observer(written, entry)
                except Exception as e:  # an observer's bug must not fail the answer
                    print(f"specscope gateway: observer {observer!r}: {e!r}", file=sys.stderr)

    def _begin(self, entry: dict, started: float) -> int:
        token = next(self.ids)
        self.pending[token] = _Pending(entry, started)
        return token

    def _finish(self, token: int, kind: str, **fields_) -> None:
        """Log a request in flight once (a second call, e.g. after :meth:`stop`, does nothing)."""
        pending = self.pending.pop(token, None)
        if pending is not None:
            latency = round(time.monotonic() - pending.started, 6)
            self._record(kind, {**pending.entry, **fields_, "latency_s": latency})

    def _refused(self, entry: dict, started: float, refusal: _Refusal):
        latency = round(time.monotonic() - started, 6)
        self._record(
            "errors",
            {**entry, "status": refusal.status, "error": refusal.message, "latency_s": latency},
        )
        return refusal.response()

    def _stats_missing(self, overlong: bool = False) -> str:
        return (
            f"an event line longer than {self.limits.max_event_bytes} bytes was relayed "
            "unread, and "
            if overlong
            else ""
        ) + f"the answer carries no {self.stats_key} ({_STATS_HINT[self.deployment.engine]})"

    async def stop(self) -> None:
        for token in list(self.pending):
            self._finish(token, "errors", status=503, error=STOPPED)
        for upstream in self.upstreams.values():
            await upstream.client.aclose()
        for opened in self.logs.values():
            opened.close()

    # --- requests ---

    async def _read_body(self, request) -> bytes:
        limit = self.limits.max_request_bytes
        too_large = _Refusal(
            413,
            f"the request body is larger than the gateway's limit of {limit} bytes",
            "invalid_request_error",
        )
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large
        return bytes(body)

    def _route(self, body: dict) -> tuple[str, Backend]:
        return self.deployment.route(request_text(body))

    @staticmethod
    def _prompt_id(scope) -> str | None:
        for name, value in scope["headers"]:
            if name == PROMPT_ID_HEADER:
                try:
                    return value.decode("utf-8") or None
                except UnicodeDecodeError:
                    return value.decode("latin-1")
        return None

    async def proxy(self, request):
        import anyio

        started = time.monotonic()
        entry = {
            "prompt_id": self._prompt_id(request.scope)
            or f"gw-{uuid.uuid4().hex[:12]}-{next(self.ids)}",
            "domain": None,
            "backend": None,
            "model": None,
            "path": request.url.path,
        }
        try:
            try:
                body = parse_request(await self._read_body(request))
            except ValueError as e:
                raise _Refusal(400, str(e), "invalid_request_error") from None
            try:  # deep but parsed JSON can still be too deep to walk or write again
                domain, backend = await anyio.to_thread.run_sync(self._route, body)
                if backend.model is not None:
                    body = {**body, "model": backend.model}
                content = json_bytes(body, allow_nan=False)
            except RecursionError:
                message = "the request body is nested too deeply"
                raise _Refusal(400, message, "invalid_request_error") from None
            entry.update(domain=domain, backend=backend.display, model=backend.model)
            upstream = self.upstreams[backend.url]
            if upstream.in_flight >= self.limits.max_in_flight:
                raise _Refusal(
                    503,
                    f"backend {backend.name} for domain {domain!r} has "
                    f"{self.limits.max_in_flight} requests in flight, the gateway's limit; "
                    "try again later",
                    "backend_busy",
                    domain=domain,
                    backend=backend.display,
                )
        except _Refusal as refusal:
            return self._refused(entry, started, refusal)
        except Exception as e:  # a bug: logged and answered, never a traceback to the client
            message = f"the gateway failed: {type(e).__name__}: {e}"
            return self._refused(entry, started, _Refusal(500, message, "internal_error"))
        upstream.in_flight += 1
        token = self._begin(entry, started)
        relayed = False
        try:
            received = request.scope["headers"]
            dropped = _NOT_FORWARDED | _nominated(received)
            headers = [(k, v) for k, v in received if k.decode("latin-1").lower() not in dropped]
            headers.append((b"content-type", b"application/json"))
            # an answer as the engine writes it: a compressed one would be inflated chunk by
            # chunk before any size bound could see it (httpx asks for gzip by default)
            headers.append((b"accept-encoding", b"identity"))
            outgoing = upstream.client.build_request(
                "POST",
                backend.url + request.url.path,
                params=request.query_params,
                content=content,
                headers=headers,
            )
            answer, body = await _unless_client_leaves(
                self._exchange(upstream.client, outgoing), request.receive
            )
            # the engine's headers as it sent them (bytes: not re-encoded)
            dropped = _HOP_HEADERS | _nominated(answer.headers.raw)
            out_headers = [
                (k, v) for k, v in answer.headers.raw if k.decode("latin-1").lower() not in dropped
            ]
            out_headers.append((DOMAIN_HEADER.encode(), domain.encode()))
            if body is None:
                relayed = True
                return _Relay(self, answer, out_headers, token, upstream)
            self._log_answer(token, answer.status_code, body)
            from starlette.responses import Response

            whole = Response(body, status_code=answer.status_code)
            whole.raw_headers = [*out_headers, (b"content-length", str(len(body)).encode())]
            return whole
        except _ClientLeft:
            self._finish(token, "errors", status=499, error="the client left before the answer")
            return _json_response(499, _error(499, "client left", "client_closed_request"))
        except self.httpx.HTTPError as e:
            return self._backend_fault(token, backend, domain, e)
        except _AnswerTooLarge:
            message = (
                f"backend {backend.name} for domain {domain!r} answered more than the "
                f"gateway's limit of {self.limits.max_answer_bytes} bytes"
            )
            self._finish(token, "errors", status=502, error=message)
            return _json_response(
                502, _error(502, message, "backend_error", domain=domain, backend=backend.display)
            )
        except asyncio.CancelledError:
            self._finish(token, "errors", status=503, error=STOPPED)
            raise
        except Exception as e:  # a bug: logged and answered, never a traceback to the client
            message = f"the gateway failed: {type(e).__name__}: {backend.redact(str(e))}"
            self._finish(token, "errors", status=500, error=message)
            return _json_response(500, _error(500, message, "internal_error"))
        finally:
            if not relayed:
                upstream.in_flight -= 1

    async def _exchange(self, client, outgoing):
        """The backend's answer and its body; the body is None for a stream (still open)."""
        answer = await client.send(outgoing, stream=True)
        try:
            streamed = answer.is_success and "text/event-stream" in answer.headers.get(
                "content-type", ""
            )
            if streamed:
                return answer, None
            body = bytearray()
            async for chunk in answer.aiter_bytes():  # decoded: content-encoding is not relayed
                body += chunk
                if len(body) > self.limits.max_answer_bytes:
                    raise _AnswerTooLarge
            await answer.aclose()
            return answer, bytes(body)
        except BaseException:
            await answer.aclose()
            raise

    def _log_answer(self, token: int, status: int, content: bytes) -> None:
        """Log a whole answer: an engine error or one without statistics in the errors log."""
        if not 200 <= status < 300:
            self._finish(token, "errors", status=status, body=content.decode("utf-8", "replace"))
            return
        try:
            response = json.loads(content)
        except ValueError:
            response, reason = None, "the engine's answer is not a JSON object"
        except RecursionError:
            response, reason = None, "the engine's answer is nested too deeply to read"
        else:
            reason = "the engine's answer is not a JSON object"
        if not isinstance(response, dict):
            self._finish(token, "errors", status=status, error=reason)
        elif response.get(self.stats_key) is None:
            self._finish(
                token, "errors", status=status, error=self._stats_missing(), answer=response
            )
        else:
            self._finish(token, "requests", status=status, response=response)

    def _backend_fault(self, token: int, backend: Backend, domain: str, error: Exception):
        httpx = self.httpx
        if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
            what, kind = "is unreachable", "backend_unavailable"
        elif isinstance(error, httpx.PoolTimeout):
            what, kind = "has no free connection", "backend_unavailable"
        elif isinstance(error, httpx.TimeoutException):
            what, kind = "did not answer in time", "backend_timeout"
        else:
            what, kind = "failed", "backend_error"
        message = (
            f"backend {backend.name} for domain {domain!r} {what}: "
            f"{type(error).__name__}: {backend.redact(str(error)) or 'no answer'}"
        )
        self._finish(token, "errors", status=502, error=message)
        return _json_response(
            502, _error(502, message, kind, domain=domain, backend=backend.display)
        )

    async def _backend_models(self, url: str) -> list[dict]:
        """The entries of one backend's ``GET /v1/models`` that have a string ``id``; raises if
        it does not answer 200 with OpenAI's list within ``connect_timeout`` seconds (connecting,
        waiting for a pooled connection and reading included), or answers more than
        ``max_event_bytes``."""
        client, limit = self.upstreams[url].client, self.limits.connect_timeout

        async def fetch() -> bytes:
            outgoing = client.build_request(
                "GET", url + MODELS_ROUTE, headers={"accept-encoding": "identity"}
            )
            answer = await client.send(outgoing, stream=True)
            try:
                answer.raise_for_status()
                body = bytearray()
                async for chunk in answer.aiter_bytes():
                    body += chunk
                    if len(body) > self.limits.max_event_bytes:
                        raise ValueError("the model list is larger than max_event_bytes")
                return bytes(body)
            finally:
                await answer.aclose()

        listed = json.loads(await asyncio.wait_for(fetch(), limit))
        data = listed.get("data") if isinstance(listed, dict) else None
        if not isinstance(data, list):
            raise ValueError("the answer is not OpenAI's model list")
        return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]

    async def models(self, request):
        """``GET /v1/models`` in OpenAI's list format: the models the backends list (each
        backend asked at once, each within ``connect_timeout``), and each ``model`` the
        deployment sets that no backend listed; an id listed twice is given once, first
        backend first. A backend that does not answer is left out and named in the
        ``x-specscope-unlisted`` header; 502 when no model is known at all."""
        backends = self.deployment.backends()
        urls = self.deployment.backend_urls()
        answers = await asyncio.gather(
            *(self._backend_models(url) for url in urls), return_exceptions=True
        )
        shown = {b.url: b.display for b in backends}
        unlisted = [shown[u] for u, a in zip(urls, answers) if isinstance(a, BaseException)]
        owner = f"specscope-gateway ({self.deployment.engine})"
        entries: dict[str, dict] = {}
        for answer in answers:
            for m in () if isinstance(answer, BaseException) else answer:
                created = m.get("created")
                owned_by = m.get("owned_by")
                entries.setdefault(
                    m["id"],
                    {
                        "id": m["id"],
                        "object": "model",
                        "created": created if type(created) is int else 0,
                        "owned_by": owned_by if isinstance(owned_by, str) else owner,
                    },
                )
        for backend in backends:
            if backend.model is not None:
                entries.setdefault(
                    backend.model,
                    {"id": backend.model, "object": "model", "created": 0, "owned_by": owner},
                )
        named = ", ".join(unlisted).encode("ascii", "backslashreplace").decode()
        headers = {UNLISTED_HEADER: named} if unlisted else None
        if not entries:
            message = f"no backend listed its models ({', '.join(unlisted)} did not answer)"
            return _json_response(502, _error(502, message, "backend_unavailable"), headers)
        return _json_response(200, {"object": "list", "data": list(entries.values())}, headers)

    async def health(self, request):
        return _json_response(
            200,
            {
                "status": "ok",
                "engine": self.deployment.engine,
                "domains": {d: b.name for d, b in self.deployment.domains.items()},
                "fallback": self.deployment.fallback.name,
                "in_flight": sum(u.in_flight for u in self.upstreams.values()),
            },
        )


class _AnswerTooLarge(Exception):
    """A non-streamed answer beyond the gateway's limit."""


class _Relay:
    """An ASGI response relaying the engine's stream chunk by chunk while the client listens.

    The latest chunk that holds a statistics event is held back until the next chunk shows the
    stream goes on (a chunk without statistics is sent with it; one with newer statistics is
    held in its place), so at most one chunk is held. The request is logged when ``data: [DONE]``
    arrives (events after it are not read) or, without one, when the stream ends; only then do
    the held chunk and the end reach the client: a client never sees the end of a stream whose
    record is not written. Bytes after ``[DONE]`` are relayed as they come, at most
    ``max_answer_bytes`` of them; beyond that the gateway stops reading, closes the engine's
    connection and ends the client's answer."""

    def __init__(self, gateway: _Gateway, answer, headers: list, token: int, upstream: _Upstream):
        self.gateway, self.answer, self.token, self.upstream = gateway, answer, token, upstream
        self.headers = headers

    async def __call__(self, scope, receive, send) -> None:
        gateway, answer = self.gateway, self.answer
        outcome: dict = {"status": 499, "error": "the client left before the stream ended"}
        try:
            outcome = await _unless_client_leaves(self._pump(send), receive)
        except (_ClientLeft, OSError):  # uvicorn's ClientDisconnected is an OSError
            pass
        except asyncio.CancelledError:
            outcome = {"status": 503, "error": STOPPED}
            raise
        except Exception as e:  # a bug, once the answer has begun: logged, the stream cut
            outcome = {"status": 500, "error": f"the gateway failed: {type(e).__name__}: {e}"}
        finally:
            await asyncio.shield(answer.aclose())
            self.upstream.in_flight -= 1
            gateway._finish(self.token, "errors", stream=True, **outcome)

    def _log(self, scanner: SseScanner, stats: dict | None, last: dict | None) -> None:
        gateway, status = self.gateway, self.answer.status_code
        if stats is not None:
            gateway._finish(self.token, "requests", stream=True, status=status, response=stats)
            return
        reason = (
            gateway._stats_missing(scanner.overlong)
            if last is not None or scanner.overlong
            else "the stream held no JSON event"
        )
        gateway._finish(
            self.token,
            "errors",
            stream=True,
            status=status,
            error=reason,
            **({"answer": last} if last is not None else {}),
        )

    async def _pump(self, send) -> dict:
        """Relay the stream; the fields of its errors-log record if it is not logged."""
        gateway, answer = self.gateway, self.answer
        key = gateway.stats_key
        scanner = SseScanner(gateway.limits.max_event_bytes)
        cap = gateway.limits.max_answer_bytes
        last = stats = held = None
        after_end = 0  # bytes read after the data: [DONE] line

        async def body(piece: bytes) -> None:
            await send({"type": "http.response.body", "body": piece, "more_body": True})

        await send(
            {"type": "http.response.start", "status": answer.status_code, "headers": self.headers}
        )
        try:
            async for chunk in answer.aiter_bytes():  # decoded: content-encoding is not relayed
                if scanner.done:
                    past_end = len(chunk)
                else:
                    carries = False
                    for event in scanner.feed(chunk):
                        last = event
                        if event.get(key) is not None:
                            stats, carries = event, True
                    if not scanner.done:
                        if held is not None:  # the stream went on: the held chunk was not last
                            await body(held)
                            held = None
                        if carries:  # maybe the last statistics: held till the stream goes on
                            held = chunk
                        else:
                            await body(chunk)
                        continue
                    self._log(scanner, stats, last)  # the end: logged before the client sees it
                    if held is not None:
                        await body(held)
                        held = None
                    past_end = scanner.past_end
                # the last past_end bytes of chunk follow the end: at most cap of those in all
                over = after_end + past_end - cap
                after_end += past_end
                if over > 0:
                    if len(chunk) > over:
                        await body(chunk[: len(chunk) - over])
                    break  # the engine's connection is closed when the relay ends
                await body(chunk)
        except gateway.httpx.HTTPError as e:
            if not scanner.done:  # else the record is written and only what follows is cut
                error = f"the stream ended early: {type(e).__name__}: {e or 'no answer'}"
                return {"status": answer.status_code, "error": error}
        if not scanner.done:
            self._log(scanner, stats, last)
            if held is not None:
                await body(held)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return {}


def make_app(
    deployment: Deployment,
    log: str | Path,
    errors_log: str | Path | None = None,
    limits: GatewayLimits | None = None,
    observers: Sequence[Observer] = (),
    predictions: Mapping[str, Prediction | None] | None = None,
):
    """The gateway as an ASGI application (Starlette); run it with uvicorn.

    ``observers`` are called as ``observer(kind, entry)`` after each record is written to the
    ``kind`` log (``"requests"`` or ``"errors"``); ``entry`` holds ``status`` and ``latency_s``
    (seconds from the request to the end of its answer). The gateway's own
    :class:`~specscope.serving.gateway.metrics.GatewayMetrics` is one of them, served at
    ``/metrics``; ``predictions`` (each domain's predicted tokens per step, from the policy)
    give its drift signal."""
    require("gateway", "specscope gateway", ("starlette", "httpx", "uvicorn", "prometheus_client"))
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    # opened now, so that a log that cannot be written fails at start, not at the first request
    logs = open_logs(log, errors_log)
    metrics = GatewayMetrics(
        deployment.engine,
        routable_domains(deployment.router),
        predictions,
        vllm_compatible=deployment.vllm_compatible_metrics,
    )
    observers = (metrics.observe, *observers)
    gateway = _Gateway(deployment, logs, limits or GatewayLimits(), observers)

    async def exposition(request):
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            await gateway.stop()

    async def internal_error(request, error: Exception):
        print(f"specscope gateway: {type(error).__name__}: {error}", file=sys.stderr)
        return _json_response(500, _error(500, "the gateway failed", "internal_error"))

    routes = [Route(path, gateway.proxy, methods=["POST"]) for path in ROUTES]
    routes.append(Route("/health", gateway.health, methods=["GET"]))
    routes.append(Route(MODELS_ROUTE, gateway.models, methods=["GET"]))
    routes.append(Route("/metrics", exposition, methods=["GET"]))
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={Exception: internal_error},
    )


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (as uvicorn binds one), or a :class:`GatewayError`
    naming why not (an address in use, a host that does not resolve)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise GatewayError(f"--host {host}: cannot listen there ({os_error_reason(e)})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise GatewayError(
            f"cannot listen on {host}:{port} ({os_error_reason(e)}); "
            "choose another --port or --host"
        ) from None
    return sock


_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class AcceptFailureLog:
    """The serving loop's exception handler: a process out of descriptors (or buffers) fails
    every ``accept`` of every waiting connection, and asyncio reports each failure (up to the
    listen backlog per attempt, an attempt a second); this writes one line per ``interval``
    seconds, with the count of failures it did not write since the line before. Anything else
    goes to the loop's default handler."""

    interval: float = 10.0
    clock: Callable[[], float] = time.monotonic
    write: Callable[[str], None] = _stderr_line
    _last: float | None = field(default=None, init=False)
    _unwritten: int = field(default=0, init=False)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        error = context.get("exception")
        if not (isinstance(error, OSError) and error.errno in _OUT_OF_RESOURCES):
            loop.default_exception_handler(context)
            return
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            self._unwritten += 1
            return
        since = (
            f"; {self._unwritten} more in the {now - self._last:.0f} s since the line before"
            if self._last is not None
            else ""
        )
        self.write(
            f"specscope gateway: {context.get('message', 'out of resources')}: "
            f"{os_error_reason(error)}{since} (raise the descriptor limit, ulimit -n, or lower "
            "--max-in-flight or --header-timeout; such failures are written once every "
            f"{self.interval:g} s)"
        )
        self._last, self._unwritten = now, 0


@functools.cache
def _h11_protocol():
    """uvicorn's h11 protocol with a deadline for each request's headers (uvicorn has none):
    armed when the connection is made and when an answer ends on a kept-alive connection,
    disarmed once a request's headers are complete; when it passes, the connection is closed,
    after a 408 if part of a request arrived. Idle kept-alive connections are closed by
    uvicorn's own ``timeout_keep_alive``, which is shorter by default."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadlineH11(H11Protocol):
        header_timeout: float = GatewayLimits.header_timeout  # set per server by a subclass

        _header_timer: asyncio.TimerHandle | None = None

        def _watch_headers(self) -> None:
            idle = self.cycle is None or self.cycle.response_complete  # no request being served
            waiting = idle and not self.transport.is_closing()
            if waiting and self._header_timer is None:
                self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)
            elif not waiting and self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
                self.transport.write(
                    b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n"
                    b"connection: close\r\n\r\n"
                )
            self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._watch_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch_headers()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._watch_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

    return HeaderDeadlineH11


def gateway_server(app, limits: GatewayLimits, backend_urls: int):
    """The uvicorn server that runs ``app`` within ``limits``: h11 with the header deadline
    (never httptools, whose protocol has none), no WebSockets, ``keep_alive_timeout``, and
    :meth:`GatewayLimits.max_connections` as both ``limit_concurrency`` and the listen
    backlog."""
    import uvicorn  # the gateway extra

    protocol = type(
        "GatewayH11Protocol", (_h11_protocol(),), {"header_timeout": limits.header_timeout}
    )
    connections = limits.max_connections(backend_urls)
    config = uvicorn.Config(
        app,
        http=protocol,
        ws="none",
        log_level="warning",
        timeout_keep_alive=limits.keep_alive_timeout,
        limit_concurrency=connections,
        backlog=connections,
        timeout_graceful_shutdown=math.ceil(limits.graceful_timeout),
    )
    return uvicorn.Server(config)


async def run_server(server, sock: socket.socket) -> None:
    """Serve on ``sock`` (bound, see :func:`listen`) until ``server`` exits, with
    :class:`AcceptFailureLog` as the loop's exception handler."""
    asyncio.get_running_loop().set_exception_handler(AcceptFailureLog())
    await server.serve(sockets=[sock])


def serve(
    deployment: Deployment,
    log: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    errors_log: str | Path | None = None,
    limits: GatewayLimits | None = None,
    observers: Sequence[Observer] = (),
    predictions: Mapping[str, Prediction | None] | None = None,
    ready: Callable[[], None] | None = None,
) -> None:
    """Run the gateway until SIGINT or SIGTERM (uvicorn, one process, asyncio's own event loop);
    ``ready`` is called once the address is bound and the logs are open. At a stop, requests in
    flight get ``limits.graceful_timeout`` seconds to finish; those left are logged as
    stopped."""
    limits = limits or GatewayLimits()
    sock = listen(host, port)
    try:
        app = make_app(deployment, log, errors_log, limits, observers, predictions)
    except BaseException:
        sock.close()
        raise
    if ready is not None:
        ready()
    server = gateway_server(app, limits, len(deployment.backend_urls()))
    asyncio.run(run_server(server, sock))
