"""`specscope gateway`: one OpenAI-compatible endpoint in front of a per-domain deployment."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from . import options
from .app import SERVE, command
from .helptext import ENGINE, OUTPUT, SERVER


@command(panel=SERVE)
def gateway(
    deployment: Path = typer.Argument(
        ...,
        help="Deployment file (TOML: engine, [fallback] and [domains.NAME] tables of url and model), or a specscope export document (JSON) with --url.",
    ),
    backend: list[str] = typer.Option(
        [],
        "--url",
        help="For an export document: URL of the server for every domain, or DOMAIN=URL (repeat; DOMAIN must be one of the document's).",
        rich_help_panel=ENGINE,
    ),
    log: Path = typer.Option(
        Path("gateway.jsonl"),
        "--log",
        help="Request log that specscope ingest reads (appended to; a symbolic link is refused). A device or FIFO (/dev/null) is written as it is and needs --errors-log.",
        rich_help_panel=OUTPUT,
    ),
    errors_log: Path | None = typer.Option(
        None,
        "--errors-log",
        help="Log of every request that is not in the request log, with the reason (default: LOG with .errors before its suffix; never the request log itself).",
        rich_help_panel=OUTPUT,
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on.", rich_help_panel=SERVER
    ),
    port: int = typer.Option(
        8000, "--port", min=1, max=65535, help="Port to listen on.", rich_help_panel=SERVER
    ),
    max_in_flight: int = typer.Option(
        64,
        "--max-in-flight",
        min=1,
        max=100_000,
        help="Requests in flight per backend URL (its connection pool); beyond: 503 at once. The server takes MAX-IN-FLIGHT x (backend URLs + 1) connections at once (its listen backlog too); beyond: a plain 503, in no log.",
        rich_help_panel=ENGINE,
    ),
    connect_timeout: float = typer.Option(
        5.0,
        "--connect-timeout",
        min=0.001,
        max=3600,
        help="Seconds to connect to a backend.",
        rich_help_panel=ENGINE,
    ),
    read_timeout: float = typer.Option(
        600.0,
        "--read-timeout",
        min=0.001,
        max=86_400,
        help="Seconds a backend may stay silent within an answer (a streamed one between chunks) before a 502.",
        rich_help_panel=ENGINE,
    ),
    max_request_mb: int = typer.Option(
        16,
        "--max-request-mb",
        min=1,
        max=4096,
        help="Largest request body in MiB (beyond: 413).",
        rich_help_panel=SERVER,
    ),
    max_answer_mb: int = typer.Option(
        64,
        "--max-answer-mb",
        min=1,
        max=4096,
        help="Largest non-streamed answer in MiB (beyond: 502); it is logged whole. A stream is cut after this much past its end (data: [DONE]).",
        rich_help_panel=ENGINE,
    ),
    header_timeout: float = typer.Option(
        10.0,
        "--header-timeout",
        min=0.001,
        max=3600,
        help="Seconds a client has to send a request's headers, from its connection or the end of the answer before; a slower one is cut off.",
        rich_help_panel=SERVER,
    ),
    keep_alive_timeout: float = typer.Option(
        5.0,
        "--keep-alive-timeout",
        min=0.001,
        max=3600,
        help="Seconds an idle kept-alive client connection stays open.",
        rich_help_panel=SERVER,
    ),
    policy: Path | None = options.POLICY_FILE,
    vllm_compatible_metrics: bool = typer.Option(
        False,
        "--vllm-compatible-metrics",
        help="Export /metrics under vLLM's names too (vllm:spec_decode_num_drafts, ...), beside specscope_gateway_*, as the deployment file's vllm_compatible_metrics = true does; only where no vLLM's own /metrics is scraped beside the gateway's (each count would be summed twice).",
        rich_help_panel=OUTPUT,
    ),
    graceful_timeout: float = typer.Option(
        30.0,
        "--graceful-timeout",
        min=0.001,
        max=86_400,
        help="At SIGTERM/Ctrl-C, seconds for requests in flight to finish; those left go to the errors log.",
        rich_help_panel=SERVER,
    ),
) -> None:
    """Route each request by its prompt's domain to that domain's engine, pass the answer
    (streamed or not, errors included) back unchanged, and log the engine's speculation stats.

    Serves POST /v1/chat/completions, /v1/completions and /completion, GET /v1/models (the
    backends' models, merged), GET /health and GET /metrics (Prometheus, specscope_gateway_*
    per domain; with --policy-file, the drift from its predictions). A
    client's X-Prompt-Id header (UTF-8) names the request in the log (for specscope ingest
    --prompts). Each backend URL gets its own connections and timeouts, so a backend that hangs
    delays only its own domains; a client slower than --header-timeout with its headers, or
    idle longer than --keep-alive-timeout, is disconnected. The request log holds only answers
    that carry the engine's statistics; every other request (an engine error, an answer without
    statistics, a refused or stopped request, a backend fault) is in the errors log with the
    reason. Backend credentials (http://user:pw@host) are sent, and shown nowhere."""
    from ..serving.gateway import Deployment, GatewayLimits, MiB, serve
    from ..serving.gateway.metrics import load_predictions

    limits = GatewayLimits(
        max_request_bytes=max_request_mb * MiB,
        max_answer_bytes=max_answer_mb * MiB,
        max_in_flight=max_in_flight,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        graceful_timeout=graceful_timeout,
        header_timeout=header_timeout,
        keep_alive_timeout=keep_alive_timeout,
    )
    backends = {}
    for value in backend:
        domain, sep, url = value.partition("=")
        backends.update({domain: url} if sep and "://" not in domain else {"*": value})
    plan = Deployment.load(deployment, backends)
    if vllm_compatible_metrics:
        plan = dataclasses.replace(plan, vllm_compatible_metrics=True)
    predictions = load_predictions(policy) if policy is not None else None
    for domain, server in [*plan.domains.items(), ("other", plan.fallback)]:
        typer.echo(f"{domain}: {server.name}", err=True)

    def ready() -> None:
        typer.echo(
            f"specscope gateway on http://{host}:{port} ({plan.engine}); log {log}", err=True
        )

    serve(plan, log, host, port, errors_log, limits, predictions=predictions, ready=ready)
