"""One OpenAI-compatible endpoint in front of a per-domain deployment (``specscope gateway``).

No serving engine takes a speculation setting per request (llama-server compiles those fields
out; vLLM and SGLang take one speculative config per server), so a per-domain policy is deployed
as one engine configuration per domain: a llama-server router-mode preset (the request's
``model`` picks it), or a vLLM/SGLang server per domain. This module is the thin proxy that makes
that deployment look like one server:

1. it reads the request body (``/v1/chat/completions``, ``/v1/completions`` or llama-server's
   ``/completion``; at most :attr:`GatewayLimits.max_request_bytes`, else 413; nested too deeply
   or holding NaN/Infinity, 400) and classifies the prompt with specscope's router
   (:class:`~specscope.tune.router.RuleRouter` over :func:`~specscope.tune.router.prompt_text`)
   in a worker thread, so that no prompt holds up the other requests or ``/health``;
2. it forwards the body as ``application/json`` to the backend that the :class:`Deployment`
   names for that domain (or the fallback), setting ``model`` where the deployment gives a preset
   name. Each backend URL has its own connection pool, timeouts (connect, read, write, pool) and
   a bound on the requests in flight (beyond it: 503 at once), so a backend that hangs holds up
   only its own domains; a client that leaves cancels its upstream request. Headers that the
   client's ``Connection`` header names are not forwarded (nor the engine's, back);
3. it returns the engine's answer unchanged: a streamed answer (server-sent events) chunk by chunk
   as the engine sends them, an engine's error with its own status and body. A non-streamed
   answer larger than :attr:`GatewayLimits.max_answer_bytes`, one cut short, or any other
   backend fault is a JSON 502 naming the backend and its domain; no answer carries a traceback;
4. it appends one JSON line per request to one of two logs. The request log holds only what
   ``specscope ingest --format llama.cpp|vllm|sglang`` reads: ``{"prompt_id", "domain",
   "backend", "model", "path", "status", "latency_s", "response"}``, where ``response`` is the
   engine's answer or, streamed, its last event that carries the engine's statistics
   (llama-server ``timings``, vLLM ``metrics``, SGLang ``meta_info``). Everything else goes to
   the errors log with an ``error`` naming why: answers without those statistics, engine errors,
   refused requests, backend faults, clients that left, and requests still in flight when the
   gateway stops. A record is written before the client receives the end of its answer (a
   stream's latest chunk with statistics is held back until then; the record is written at its
   ``data: [DONE]``, after which at most :attr:`GatewayLimits.max_answer_bytes` are relayed),
   each line whole or not at all (a failed write is cut back and reported, never a torn line or
   a failed answer).

The prompt id is the client's ``X-Prompt-Id`` header read as UTF-8 (so that the log joins the
client's prompts file), else one the gateway makes up. Backend URLs are checked at start, and
their credentials (``http://user:pw@host``, sent as Basic auth) are shown nowhere: ``/health``,
log lines, messages and start-up output name :attr:`Backend.display`. Observers are told of
every record written: :class:`~specscope.serving.gateway.metrics.GatewayMetrics` is one, served
at ``/metrics`` (Prometheus, ``specscope_gateway_*``: per-domain requests, tokens, drafted and
accepted tokens, latency, and the drift of tokens per step from the policy's prediction; vLLM's
``vllm:*`` names too only where the deployment sets ``vllm_compatible_metrics``). ``GET
/v1/models`` lists the backends' own models, merged, in OpenAI's format, each backend given
``connect_timeout`` to answer.

It does not start or stop engines (:mod:`specscope.serving.llamacpp.server` does for llama-server), choose
settings (``specscope tune``/``llamacpp``) or read the logs (:mod:`specscope.serving.ingest`);
it does not authenticate clients (it listens on 127.0.0.1 by default). :func:`serve` bounds
clients in time and number (:class:`GatewayLimits`: ``header_timeout``, ``keep_alive_timeout``,
:meth:`GatewayLimits.max_connections`).

The package: :mod:`.deployment` (backends, URL checks, routing), :mod:`.logs` (the two logs),
:mod:`.proxy` (the ASGI application and ``serve``), :mod:`.metrics` (``/metrics``).
"""

from .deployment import (
    ENGINE_STATS_KEY,
    Backend,
    Deployment,
    DeploymentError,
    check_backend_url,
    request_text,
    routable_domains,
)
from .logs import GatewayError, RequestLog, errors_path, json_bytes, open_logs
from .proxy import (
    ROUTES,
    STOPPED,
    GatewayLimits,
    MiB,
    SseScanner,
    listen,
    make_app,
    parse_request,
    serve,
)

__all__ = [
    "ENGINE_STATS_KEY",
    "ROUTES",
    "STOPPED",
    "Backend",
    "Deployment",
    "DeploymentError",
    "GatewayError",
    "GatewayLimits",
    "MiB",
    "RequestLog",
    "SseScanner",
    "check_backend_url",
    "errors_path",
    "json_bytes",
    "listen",
    "make_app",
    "open_logs",
    "parse_request",
    "request_text",
    "routable_domains",
    "serve",
]
