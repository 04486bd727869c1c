"""`specscope export`, `ingest`, `llamacpp` and `doctor`: serving engines and this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import command


# --- export (serving engines) -------------------------------------------------------------------


@command()
def export(
    policy: Path = typer.Argument(..., help="A policy file written by specscope tune (JSON or TOML)."),
    to: str = typer.Option(..., "--to", help="Engine: vllm, sglang, llama.cpp, trtllm or transformers."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the settings here (JSON; default: print them)."),
    draft: Optional[str] = typer.Option(None, "--draft", help="The draft model as the engine loads it (path or hub id); vllm, sglang, trtllm and transformers need it."),
    method: str = typer.Option("draft_model", "--method", help="vLLM speculative method: draft_model (chains), eagle or eagle3 (trees too)."),
) -> None:
    """Each domain's speculation setting in an engine's own format, and the routing rule.

    -o is written whole or not at all; a FIFO or /dev/stdout is written in place, a link to a
    regular file is replaced by the file (the link's target is left alone)."""
    from ..export import ExportOptions, export_policy
    from ..files import check_output_file, json_text, write_json
    from ..tune.policy import PolicyFile

    if out is not None:
        check_output_file(out, inputs=(policy,), option="--out")
    document = export_policy(PolicyFile.load(policy), to, ExportOptions(draft=draft, method=method),
                             source=str(policy))
    if out is None:
        typer.echo(json_text(document), nl=False)
        return
    write_json(out, document)
    for domain, setting in [*document["domains"].items(), ("other", document["fallback"])]:
        typer.echo(f"{domain}: {setting['tree']}")
    typer.echo(f"wrote {out}")



# --- ingest (engine logs) -------------------------------------------------------------------------


@command()
def ingest(
    log: Path = typer.Argument(..., help="Per-request speculation stats, one JSON object per line."),
    fmt: str = typer.Option(..., "--format", "-f", help="vllm, sglang, llama.cpp or spec-bench."),
    prompts: Path = typer.Option(..., "--prompts", "-p", help="The requests' prompts: JSONL with id, domain and prompt (or messages)."),
    out: Path = typer.Option(..., "--out", "-o", help="New run directory to write."),
) -> None:
    """Turn an engine's per-request speculation stats into a run that `specscope analyze` reads.

    Each line is joined to its prompt by its `prompt_id` (a line may wrap the engine's response
    as {"prompt_id": ..., "response": {...}}) or else by the engine's request id."""
    from ..ingest import ingest as ingest_log

    manifest = ingest_log(log, fmt, prompts, out)
    counts = manifest["counts"]
    typer.echo(f"wrote {out}: {counts['requests']} requests ({', '.join(counts['domains'])}), "
               f"{counts['steps_logged'] or 'no'} per-step rows; next: specscope analyze {out}")



# --- llama.cpp --------------------------------------------------------------------------------------


@command()
def llamacpp(
    run_dir: Path = typer.Argument(..., help="A measurement run with node records (specscope run): its top-1 chain acceptance per domain predicts each K."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Directory for the cost grid, policy, requests and tables (default: RUN_DIR/llamacpp)."),
    target_gguf: Optional[Path] = typer.Option(None, "--target-gguf", help="Target GGUF file (default: the demo pair's target, Q4_K_M)."),
    draft_gguf: Optional[Path] = typer.Option(None, "--draft-gguf", help="Draft GGUF file (default: the demo pair's draft, Q4_K_M)."),
    per_domain: int = typer.Option(10, "--per-domain", "-n", min=1, help="Held-out prompts per domain (from the run's sources, none of the run's prompts); 10 is specscope's minimum for a verdict."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=1, help="Tokens generated per request."),
    ks: list[int] = typer.Option(list((1, 2, 3, 4)), "--k", help="Chain lengths to price and benchmark (repeat the option)."),
    costs: Optional[Path] = typer.Option(None, "--costs", help="A cost grid measured before (cost_grid.json, e.g. by benchmarks/bench_llama_costs.py): skips llama-bench."),
    threads: list[int] = typer.Option([2], "--threads", min=1, help="Target threads to price (repeat the option)."),
    draft_threads: list[int] = typer.Option([2], "--draft-threads", min=1, help="Draft threads to price (repeat the option)."),
    poll: list[int] = typer.Option([0, 50], "--poll", min=0, max=100, help="llama.cpp polling levels to price, both models (repeat the option; 0: sleep while idle, 50: the default)."),
    quant: list[str] = typer.Option([], "--quant", help="Target quantisations to price (Q4_0, Q8_0, ...), made from the target GGUF with llama-quantize (repeat the option; default: the GGUF as given)."),
    max_pass: int = typer.Option(8, "--max-pass", min=2, help="Price passes of 1..N tokens."),
    repetitions: int = typer.Option(5, "--repetitions", min=1, help="llama-bench repetitions per pass size."),
    n_boot: int = typer.Option(1000, "--n-boot", min=0, help="Prompt resamples for the intervals."),
) -> None:
    """llama-server end to end: price settings with llama-bench, choose the fastest per domain
    (plain included) from RUN_DIR's acceptance, then time them side by side in llama-server on
    held-out prompts. Builds llama.cpp's programs first if needed (once, minutes)."""
    from ..errors import SpecscopeError
    from ..serving import GridOptions, run_llamacpp_study

    if max(ks) >= max_pass:
        raise SpecscopeError(f"--max-pass {max_pass} must exceed the largest --k "
                                 f"({max(ks)}): a step of K verifies K + 1 tokens")
    grid = GridOptions(tuple(threads), tuple(poll), tuple(draft_threads), ((2048, 512),),
                       tuple(quant), max_pass, 192, repetitions)
    study = run_llamacpp_study(run_dir, out or run_dir / "llamacpp", target_gguf, draft_gguf,
                               per_domain, max_new_tokens, tuple(ks), grid, costs, n_boot,
                               echo=lambda line: typer.echo(line, err=True))
    typer.echo(study.render())



# --- doctor ---------------------------------------------------------------------------------------


@command()
def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (for a bug report)."),
) -> None:
    """What this machine has for specscope: versions, extras, the demo pair's cache, CPU and GPU."""
    import json

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ..doctor import diagnose

    report = diagnose()
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
        return
    console = Console()
    hw = report.hardware
    console.print(f"Python {report.python} on {report.platform}")
    console.print("  ".join(f"{k} {v or '[red]not installed[/]'}" for k, v in report.versions.items()))
    extras = Table(title="extras")
    for column in ("extra", "for", "installed"):
        extras.add_column(column)
    for e in report.extras:
        extras.add_row(e.name, e.purpose, "[green]yes[/]" if e.ok else
                       "[red]no[/]: " + escape(f"{', '.join(e.missing)} (pip install 'specscope[{e.name}]')"))
    console.print(extras)
    console.print(f"cache: {report.cache_dir}")
    for d in report.demo:
        console.print(f"demo {d.role}: {d.parts_installed}/{d.parts_needed} part packages; bf16 "
                      f"cache {'built' if d.cache_built else 'not built'} at {d.cache}")
    console.print(f"CPU: {hw.cpu}, {hw.cores} cores, torch threads {hw.torch_threads}, "
                  f"AVX2 {hw.avx2}, AVX512-BF16 {hw.avx512_bf16}, AMX {hw.amx}, torch kernels "
                  f"{hw.torch_cpu_capability}")
    console.print("GPU: " + (", ".join(hw.gpus) if hw.gpus else "none"))
    for r in report.recommendations:
        console.print(f"recommendation: {escape(r)}")
