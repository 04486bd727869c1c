"""One OpenAI-compatible endpoint in front of a per-domain deployment (``specscope gateway``).

No serving engine takes a speculation setting per request (llama-server compiles those fields
out; vLLM and SGLang take one speculative config per server), so a per-domain policy is deployed
as one engine configuration per domain: a llama-server router-mode preset (the request's
``model`` picks it), or a vLLM/SGLang server per domain. This module is the thin proxy that makes
that deployment look like one server:

1. it reads the request body (``/v1/chat/completions``, ``/v1/completions`` or llama-server's
   ``/completion``) and classifies the prompt with specscope's router
   (:class:`~specscope.tune.router.RuleRouter` over :func:`~specscope.tune.router.prompt_text`);
2. it forwards the body to the backend that the :class:`Deployment` names for that domain (or the
   fallback), setting ``model`` where the deployment gives a preset name;
3. it returns the engine's answer unchanged: a streamed answer (server-sent events) chunk by chunk
   as the engine sends them, an engine's error with its own status and body;
4. it appends one JSON line per answered request to a log that ``specscope ingest --format
   llama.cpp|vllm|sglang`` reads: ``{"prompt_id", "domain", "backend", "model", "path",
   "response"}``, where ``response`` is the engine's answer or, streamed, its last event that
   carries the engine's statistics (llama-server ``timings``, vLLM ``metrics``, SGLang
   ``meta_info``). Failures go to a second log (the errors log), so the first stays ingestible.

A backend that cannot be reached gets a 502 JSON error naming it and its domain; the other
domains keep being served. The prompt id is the client's ``X-Prompt-Id`` header (so that the log
joins the client's prompts file), else one the gateway makes up.

It does not start or stop engines (:mod:`specscope.serving.llamaserver` does for llama-server), choose
settings (``specscope tune``/``llamacpp``) or read the log (:mod:`specscope.serving.ingest`).
"""

from __future__ import annotations

import itertools
import json
import os
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import SpecscopeError, require
from ..files import read_json_object, read_toml_table
from ..tune.router import Rule, RuleRouter, prompt_text

# the ingest formats whose engines the gateway can stand in front of, and the key of each
# engine's per-request statistics in its answer (the event to keep from a stream)
ENGINE_STATS_KEY: dict[str, str] = {
    "llama.cpp": "timings",
    "vllm": "metrics",
    "sglang": "meta_info",
}
ROUTES = ("/v1/chat/completions", "/v1/completions", "/completion")
PROMPT_ID_HEADER = "x-prompt-id"
DOMAIN_HEADER = "x-specscope-domain"
# headers that describe one hop of a connection, not the message (RFC 9110 7.6.1), and those
# that httpx recomputes for the body it sends or has already decoded
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


class DeploymentError(SpecscopeError, ValueError):
    """A deployment file that cannot be served; the message names the field and what is allowed."""


@dataclass(frozen=True)
class Backend:
    """Where one domain's requests go."""

    url: str  # base URL of the engine's server, e.g. http://127.0.0.1:8080
    model: str | None = None  # the body's ``model`` to set (llama-server router: the preset name)

    @property
    def name(self) -> str:
        return self.url + (f" (model {self.model!r})" if self.model else "")


@dataclass(frozen=True)
class Deployment:
    """Each domain's backend, the fallback's, and the engine whose statistics the log keeps."""

    engine: str
    domains: Mapping[str, Backend]
    fallback: Backend
    router: RuleRouter = field(default_factory=RuleRouter)

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_STATS_KEY:
            raise DeploymentError(
                f"engine {self.engine!r} is not one the gateway logs for; "
                f"allowed: {', '.join(ENGINE_STATS_KEY)}"
            )
        produced = routable_domains(self.router)
        for domain in self.domains:
            if domain not in produced:
                raise DeploymentError(
                    f"domain {domain!r}: specscope's router never routes to it (it produces "
                    f"{', '.join(produced)}); remove it or name one of those"
                )

    def route(self, text: str) -> tuple[str, Backend]:
        """The domain of a prompt and the backend that serves it."""
        domain = self.router.classify(text)
        return domain, self.domains.get(domain, self.fallback)

    @classmethod
    def from_table(cls, table: Mapping, where: str = "deployment") -> Deployment:
        """From a deployment table: ``engine``, ``[fallback]`` and ``[domains.NAME]`` tables of
        ``url`` and optional ``model`` (see the README)."""
        unknown = set(table) - {"engine", "fallback", "domains"}
        if unknown:
            raise DeploymentError(
                f"{where}: unknown key {min(unknown)!r}; allowed: engine, fallback, domains"
            )
        engine = table.get("engine", "llama.cpp")
        if not isinstance(engine, str):
            raise DeploymentError(
                f"{where}: engine must be a string, one of {', '.join(ENGINE_STATS_KEY)}"
            )
        if "fallback" not in table:
            raise DeploymentError(
                f"{where}: no [fallback] table (the backend of any prompt "
                "whose domain has no table of its own)"
            )
        domains = table.get("domains", {})
        if not isinstance(domains, Mapping):
            raise DeploymentError(f"{where}: domains must be a table of [domains.NAME] tables")
        return cls(
            engine,
            {str(d): _backend(b, f"{where}: domains.{d}") for d, b in domains.items()},
            _backend(table["fallback"], f"{where}: fallback"),
        )

    @classmethod
    def from_export(
        cls, document: Mapping, backends: Mapping[str, str], where: str = "export"
    ) -> Deployment:
        """From a ``specscope export`` document: its engine, its routing rule (the gateway
        routes exactly as exported) and each domain's ``model`` (llama.cpp: the preset named
        after the domain). ``backends``: domain -> base URL, ``"*"`` for every domain not named
        (one llama-server in router mode serves them all)."""
        engine, domains = document.get("engine"), document.get("domains")
        if not isinstance(domains, Mapping) or not domains:
            raise DeploymentError(f"{where}: not a specscope export document (no 'domains')")
        router = _router(document.get("routing"), where)

        def backend(domain: str, entry) -> Backend:
            url = backends.get(domain, backends.get("*"))
            if url is None:
                raise DeploymentError(
                    f"{where}: no backend URL for domain {domain!r}; pass "
                    f"--backend {domain}=URL (or --backend URL for all)"
                )
            model = entry.get("model") if isinstance(entry, Mapping) else None
            if model is None and engine == "llama.cpp":
                model = domain  # the router-mode preset is named after its domain
            return _backend(
                {"url": url, **({"model": model} if model else {})}, f"{where}: domains.{domain}"
            )

        named = {str(d): backend(str(d), e) for d, e in domains.items()}
        # the router's fallback domain is itself a domain of the export: its backend serves
        # prompts no rule claims
        if router.fallback in named:
            fallback = named[router.fallback]
        elif "fallback" in document:
            fallback = backend("fallback", document["fallback"])
        else:
            raise DeploymentError(
                f"{where}: no setting for the router's fallback domain {router.fallback!r}"
            )
        return cls(engine if isinstance(engine, str) else "", named, fallback, router)

    @classmethod
    def load(cls, path: str | Path, backends: Mapping[str, str] | None = None) -> Deployment:
        """A deployment file (TOML), or an export document (JSON) with ``backends``."""
        if Path(path).suffix == ".json":
            return cls.from_export(
                read_json_object(path, DeploymentError, "export document"),
                backends or {},
                str(path),
            )
        if backends:
            raise DeploymentError(
                f"{path}: a deployment file names its backends itself; "
                "--backend is for an export document (JSON)"
            )
        return cls.from_table(read_toml_table(path, DeploymentError, "deployment file"), str(path))


def _router(routing, where: str) -> RuleRouter:
    """The router an export document's routing rule describes (specscope's by default)."""
    if routing is None:
        return RuleRouter()
    try:
        rules = tuple(
            Rule(str(r["domain"]), str(r["pattern"]), float(r["weight"])) for r in routing["rules"]
        )
        return RuleRouter(rules, float(routing["threshold"]), str(routing["fallback"]))
    except (KeyError, TypeError, ValueError) as e:
        raise DeploymentError(
            f"{where}: routing rule unreadable (missing or bad {e}); export the policy again"
        ) from None


def routable_domains(router: RuleRouter) -> tuple[str, ...]:
    """The domains ``router`` can produce: those its rules score, and its fallback."""
    return tuple(dict.fromkeys([*(r.domain for r in router.rules), router.fallback]))


def _backend(entry, where: str) -> Backend:
    if not isinstance(entry, Mapping):
        raise DeploymentError(f"{where}: must be a table with url (and optionally model)")
    unknown = set(entry) - {"url", "model"}
    if unknown:
        raise DeploymentError(f"{where}: unknown key {min(unknown)!r}; allowed: url, model")
    url, model = entry.get("url"), entry.get("model")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise DeploymentError(
            f"{where}: url must be an http:// or https:// base URL with a host, got {url!r}"
        )
    if model is not None and (not isinstance(model, str) or not model):
        raise DeploymentError(
            f"{where}: model must be a non-empty string (the preset or model "
            f"name the engine serves), got {model!r}"
        )
    return Backend(url.rstrip("/"), model)


# --- what a request says -----------------------------------------------------------------------


def request_text(body: Mapping) -> str:
    """The text to classify: the user turns of a chat request, or a completion's prompt (a
    string or a list of strings; token ids are no text and classify as the fallback)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return prompt_text([m for m in messages if isinstance(m, Mapping)])
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n\n".join(p for p in prompt if isinstance(p, str))
    return ""


def sse_events(buffer: bytearray) -> list[dict]:
    """The JSON objects of the complete ``data:`` lines at the start of ``buffer`` (removed from
    it); what is left is an incomplete line. ``data: [DONE]`` and other non-JSON data are skipped."""
    events = []
    while (end := buffer.find(b"\n")) >= 0:
        line = bytes(buffer[:end]).rstrip(b"\r")
        del buffer[: end + 1]
        if not line.startswith(b"data:"):
            continue
        try:
            event = json.loads(line[5:])
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


class RequestLog:
    """An append-only JSON-lines file: each record one line, written by one ``write`` call
    (``O_APPEND``), so concurrent requests never interleave within a line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    def append(self, record: dict) -> None:
        os.write(self._fd, (json.dumps(record, ensure_ascii=False) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def errors_path(log: str | Path) -> Path:
    """The errors log beside a request log: ``gateway.jsonl`` -> ``gateway.errors.jsonl``."""
    log = Path(log)
    return log.with_name(log.stem + ".errors" + (log.suffix or ".jsonl"))


# --- the proxy -------------------------------------------------------------------------------


def _json_response(status: int, payload: dict):
    from starlette.responses import JSONResponse  # the gateway extra

    return JSONResponse(payload, status_code=status)


def _error(status: int, message: str, kind: str, **extra) -> dict:
    return {"error": {"message": message, "type": kind, "code": status, **extra}}


def make_app(
    deployment: Deployment,
    log: str | Path,
    errors_log: str | Path | None = None,
    connect_timeout: float = 5.0,
):
    """The gateway as an ASGI application (Starlette); run it with uvicorn."""
    require("gateway", "specscope gateway", ("starlette", "httpx", "uvicorn"))
    import httpx  # the gateway extra, like starlette and uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    stats_key = ENGINE_STATS_KEY[deployment.engine]
    ids = itertools.count()
    # opened now, so that a log that cannot be written fails at start, not at the first request
    logs = {"requests": RequestLog(log), "errors": RequestLog(errors_log or errors_path(log))}
    # no read timeout: a long generation is not a failure; a backend that is down fails to connect
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=connect_timeout))

    def record(kind: str, entry: dict) -> None:
        logs[kind].append(entry)

    async def proxy(request: Request):
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _json_response(
                400, _error(400, "the request body must be a JSON object", "invalid_request_error")
            )
        domain, backend = deployment.route(request_text(body))
        if backend.model is not None:
            body = {**body, "model": backend.model}
        prompt_id = (
            request.headers.get(PROMPT_ID_HEADER) or f"gw-{uuid.uuid4().hex[:12]}-{next(ids)}"
        )
        entry = {
            "prompt_id": prompt_id,
            "domain": domain,
            "backend": backend.url,
            "model": backend.model,
            "path": request.url.path,
        }
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _HOP_HEADERS and k.lower() != PROMPT_ID_HEADER
        }
        upstream = client.build_request(
            "POST",
            backend.url + request.url.path,
            params=request.query_params,
            json=body,
            headers=headers,
        )
        try:
            answer = await client.send(upstream, stream=True)
        except httpx.TransportError as e:
            message = (
                f"backend {backend.name} for domain {domain!r} is unreachable: "
                f"{type(e).__name__}: {e or 'no answer'}"
            )
            record("errors", {**entry, "status": 502, "error": message})
            return _json_response(
                502, _error(502, message, "backend_unavailable", domain=domain, backend=backend.url)
            )
        out_headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_HEADERS}
        out_headers[DOMAIN_HEADER] = domain
        if answer.is_success and "text/event-stream" in answer.headers.get("content-type", ""):
            return StreamingResponse(
                _relay(answer, entry), status_code=answer.status_code, headers=out_headers
            )
        content = await answer.aread()
        await answer.aclose()
        if not answer.is_success:
            record(
                "errors",
                {**entry, "status": answer.status_code, "body": content.decode("utf-8", "replace")},
            )
            return Response(content, status_code=answer.status_code, headers=out_headers)
        try:
            response = json.loads(content)
        except ValueError:
            response = None
        if isinstance(response, dict):
            record("requests", {**entry, "response": response})
        else:
            record(
                "errors",
                {
                    **entry,
                    "status": answer.status_code,
                    "error": "the engine's answer is not a JSON object",
                },
            )
        return Response(content, status_code=answer.status_code, headers=out_headers)

    async def _relay(answer, entry: dict) -> AsyncIterator[bytes]:
        """The engine's stream, chunk by chunk; then its last event with statistics is logged."""
        buffer, last, stats = bytearray(), None, None
        complete = False
        try:
            async for chunk in answer.aiter_bytes():  # decoded: content-encoding is not relayed
                buffer += chunk
                for event in sse_events(buffer):
                    last = event
                    if stats_key in event and event[stats_key] is not None:
                        stats = event
                yield chunk
            complete = True
        finally:
            await answer.aclose()
            final = stats or last
            if complete and final is not None:
                record("requests", {**entry, "stream": True, "response": final})
            else:
                record(
                    "errors",
                    {
                        **entry,
                        "stream": True,
                        "status": answer.status_code,
                        "error": "the stream ended early"
                        if not complete
                        else "the stream held no JSON event",
                    },
                )

    async def health(request: Request):
        return _json_response(
            200,
            {
                "status": "ok",
                "engine": deployment.engine,
                "domains": {d: b.name for d, b in deployment.domains.items()},
                "fallback": deployment.fallback.name,
            },
        )

    @asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            await client.aclose()
            for opened in logs.values():
                opened.close()

    routes = [Route(path, proxy, methods=["POST"]) for path in ROUTES]
    routes.append(Route("/health", health, methods=["GET"]))
    return Starlette(routes=routes, lifespan=lifespan)


def serve(
    deployment: Deployment,
    log: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    errors_log: str | Path | None = None,
) -> None:
    """Run the gateway until interrupted (uvicorn, one process)."""
    import uvicorn  # the gateway extra

    uvicorn.run(make_app(deployment, log, errors_log), host=host, port=port, log_level="warning")


__all__ = [
    "ENGINE_STATS_KEY",
    "ROUTES",
    "Backend",
    "Deployment",
    "DeploymentError",
    "RequestLog",
    "errors_path",
    "make_app",
    "request_text",
    "routable_domains",
    "serve",
    "sse_events",
]
