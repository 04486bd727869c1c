"""`specscope gateway`: one OpenAI-compatible endpoint in front of a per-domain deployment."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import command


@command()
def gateway(
    deployment: Path = typer.Argument(
        ...,
        help="Deployment file (TOML: engine, [fallback] and [domains.NAME] tables of url and model), or a specscope export document (JSON) with --backend.",
    ),
    backend: list[str] = typer.Option(
        [],
        "--backend",
        help="For an export document: URL of the server for every domain, or DOMAIN=URL (repeat).",
    ),
    log: Path = typer.Option(
        Path("gateway.jsonl"),
        "--log",
        help="Request log that specscope ingest reads (appended to).",
    ),
    errors_log: Path | None = typer.Option(
        None,
        "--errors-log",
        help="Log of failed requests (default: LOG with .errors before its suffix).",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
) -> None:
    """Route each request by its prompt's domain to that domain's engine, pass the answer
    (streamed or not, errors included) back unchanged, and log the engine's speculation stats.

    Serves POST /v1/chat/completions, /v1/completions and /completion, and GET /health. A
    client's X-Prompt-Id header names the request in the log (for specscope ingest --prompts)."""
    from ..serving.gateway import Deployment, serve

    backends = {}
    for value in backend:
        domain, sep, url = value.partition("=")
        backends.update({domain: url} if sep and "://" not in domain else {"*": value})
    plan = Deployment.load(deployment, backends)
    for domain, server in [*plan.domains.items(), ("other", plan.fallback)]:
        typer.echo(f"{domain}: {server.name}", err=True)
    typer.echo(f"specscope gateway on http://{host}:{port} ({plan.engine}); log {log}", err=True)
    serve(plan, log, host, port, errors_log)
