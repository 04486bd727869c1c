"""`specscope export`, `ingest`, `llamacpp` and `doctor`: serving engines and this machine."""

from __future__ import annotations

from pathlib import Path

import typer

from ..limits import MAX_THREADS, MAX_TREE_NODES
from . import options
from .app import MACHINE, SERVE, command

# --- export (serving engines) -------------------------------------------------------------------


@command(panel=SERVE)
def export(
    policy: Path = typer.Argument(
        ..., help="A policy file written by specscope tune (JSON or TOML)."
    ),
    to: str = typer.Option(
        ..., "--to", help="Engine: vllm, sglang, llama.cpp, trtllm or transformers."
    ),
    engine_version: str | None = options.ENGINE_VERSION,
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Write the settings here (JSON; default: print them). llama.cpp: the presets file goes beside it, with .ini.",
    ),
    draft: str | None = typer.Option(
        None,
        "--draft",
        help="The draft model as the engine loads it (path, hub id; llama.cpp: the draft GGUF, default: the demo pair's).",
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        help="llama.cpp: the target GGUF file every preset serves (default: the demo pair's).",
    ),
    poll: int = typer.Option(
        0,
        "--poll",
        min=0,
        max=100,
        help="llama.cpp: --poll of the drafting presets (0: threads sleep; busy-waiting threads of the idle model slow two-model decoding on CPU).",
    ),
) -> None:
    """Each routed domain's speculation setting in an engine's own format, checked against that
    engine version's rules, with the routing rule.

    -o is written whole or not at all (and for llama.cpp, its presets file -o with .ini); a FIFO
    or /dev/stdout is written in place, a link to a regular file is replaced by the file."""
    from ..files import check_output_file, json_text, write_json, write_output
    from ..serving.export import ExportOptions, export_policy
    from ..serving.export_plan import presets_path
    from ..tune.policy import PolicyFile

    presets = None
    if out is not None:
        check_output_file(out, inputs=(policy,), option="--out")
        if to == "llama.cpp" and not str(out.absolute()).startswith(("/dev/", "/proc/")):
            presets = presets_path(out)
            check_output_file(presets, inputs=(policy, out), option="--out (presets file)")
    if to == "llama.cpp":  # the demo pair's GGUF files, where specscope llamacpp keeps them
        from ..models.demo import _kept_gguf

        draft = draft or str(_kept_gguf("draft"))
        target = target or str(_kept_gguf("target"))
    options = ExportOptions(
        draft=draft,
        target=target,
        poll=poll,
        presets_file=str(presets) if presets else "presets.ini",
    )
    document = export_policy(
        PolicyFile.load(policy), to, options, source=str(policy), engine_version=engine_version
    )
    if out is None:
        typer.echo(json_text(document), nl=False)
        return
    if presets is not None:
        write_output(presets, document["presets_ini"])
    write_json(out, document)
    for domain, setting in document["domains"].items():
        typer.echo(f"{domain}: {setting['tree']} ({setting['source']})")
    if document["approximation"]:
        typer.echo(f"approximation: {document['approximation']}")
    typer.echo(
        f"wrote {out}"
        + (f" and {presets}" if presets else "")
        + f" ({to} {document['engine_version']})"
    )


# --- ingest (engine logs) -------------------------------------------------------------------------


@command(panel=SERVE)
def ingest(
    log: Path = typer.Argument(
        ...,
        help="The engine's responses: one JSON object per line, a raw SSE capture (data: lines) or one stream chunk per line.",
    ),
    fmt: str = typer.Option(..., "--format", "-f", help="vllm, sglang, llama.cpp or spec-bench."),
    prompts: Path = options.with_default(options.PROMPTS, ...),
    out: Path = typer.Option(..., "--out", "-o", help="New run directory to write."),
    join: str = typer.Option(
        "id",
        "--join",
        help="id: by each line's prompt_id, else the engine's request id; order: the n-th request of the log joins the n-th prompt, only for lines that carry no id (llama-server /completion responses) and are in the prompts file's order (one client sending the prompts one at a time; the gateway logs in completion order).",
    ),
    engine_version: str | None = options.ENGINE_VERSION,
) -> None:
    """Turn an engine's per-request speculation stats into a run that `specscope analyze` reads.

    A line may wrap the engine's response as {"prompt_id": ..., "response": {...}} (the client's
    own id), as the gateway's request log does. Counts the engine does not log are derived and
    named in the run's manifest. A torn last line and streamed answers without statistics are
    skipped with a warning; any other bad line refuses the log, naming it."""
    from ..serving.ingest import ingest as ingest_log

    manifest = ingest_log(log, fmt, prompts, out, join=join, engine_version=engine_version)
    for warning in manifest["warnings"]:
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    counts = manifest["counts"]
    version = manifest["engine_version"] or "version not stated (--engine-version)"
    typer.echo(
        f"wrote {out}: {counts['requests']} requests ({', '.join(counts['domains'])}) "
        f"from {manifest['engine']} {version}, "
        f"{counts['steps_logged'] or 'no'} per-step rows; next: specscope analyze {out}"
    )
    for name, how in manifest["derived"].items():
        typer.echo(f"derived, not logged: {name} = {how}")


# --- llama.cpp --------------------------------------------------------------------------------------


@command(panel=SERVE)
def llamacpp(
    run_dir: Path = typer.Argument(
        ...,
        help="A measurement run with node records (specscope run): its top-1 chain acceptance per domain predicts each K.",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Directory for the cost grid, policy, requests and tables (default: RUN_DIR/llamacpp).",
    ),
    target_gguf: Path | None = typer.Option(
        None, "--target-gguf", help="Target GGUF file (default: the demo pair's target, Q4_K_M)."
    ),
    draft_gguf: Path | None = typer.Option(
        None, "--draft-gguf", help="Draft GGUF file (default: the demo pair's draft, Q4_K_M)."
    ),
    per_domain: int = options.with_default(options.PER_DOMAIN, 10),
    max_new_tokens: int = options.with_default(options.MAX_NEW_TOKENS, 64),
    ks: list[int] = typer.Option(
        list((1, 2, 3, 4)),
        "--k",
        min=1,
        max=MAX_TREE_NODES,
        help="Chain lengths to price and benchmark (repeat the option).",
    ),
    cost_grid: Path | None = options.COST_GRID,
    threads: list[int] = typer.Option(
        [2],
        "--grid-threads",
        min=1,
        max=MAX_THREADS,
        help="Target threads to price (repeat the option).",
    ),
    draft_threads: list[int] = typer.Option(
        [2],
        "--grid-draft-threads",
        min=1,
        max=MAX_THREADS,
        help="Draft threads to price (repeat the option).",
    ),
    poll: list[int] = typer.Option(
        [0, 50],
        "--grid-poll",
        min=0,
        max=100,
        help="llama.cpp polling levels to price, both models (repeat the option; 0: sleep while idle, 50: the default).",
    ),
    quant: list[str] = typer.Option(
        [],
        "--quant",
        help="Target quantisations to price (Q4_0, Q8_0, ...), made from the target GGUF with llama-quantize (repeat the option; default: the GGUF as given).",
    ),
    max_pass: int = typer.Option(
        8, "--max-pass", min=2, max=MAX_TREE_NODES, help="Price passes of 1..N tokens."
    ),
    repeats: int = options.with_default(options.REPEATS, 5),
    n_boot: int = options.BOOT,
) -> None:
    """llama-server end to end: price settings with llama-bench, choose the fastest per domain
    (plain included) from RUN_DIR's acceptance, then time them side by side in llama-server on
    held-out prompts. Builds llama.cpp's programs first if needed (once, minutes)."""
    from ..errors import SpecscopeError
    from ..serving.llamacpp.study import GridOptions, run_llamacpp_study

    if max(ks) >= max_pass:
        raise SpecscopeError(
            f"--max-pass {max_pass} must exceed the largest --k "
            f"({max(ks)}): a step of K verifies K + 1 tokens"
        )
    grid = GridOptions(
        tuple(threads),
        tuple(poll),
        tuple(draft_threads),
        ((2048, 512),),
        tuple(quant),
        max_pass,
        192,
        repeats,
    )
    study = run_llamacpp_study(
        run_dir,
        out or run_dir / "llamacpp",
        target_gguf,
        draft_gguf,
        per_domain,
        max_new_tokens,
        tuple(ks),
        grid,
        cost_grid,
        n_boot,
        echo=lambda line: typer.echo(line, err=True),
    )
    typer.echo(study.render())


# --- doctor ---------------------------------------------------------------------------------------


@command(panel=MACHINE)
def doctor(
    as_json: bool = typer.Option(
        False, "--json", help="Print the report as JSON (for a bug report)."
    ),
) -> None:
    """What this machine has for specscope: versions, extras, the demo pair's cache, CPU and GPU."""
    import json

    from rich.markup import escape
    from rich.table import Table

    from ..console import make_console
    from ..doctor import diagnose

    report = diagnose()
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
        return
    console = make_console()
    hw = report.hardware
    console.print(f"Python {report.python} on {report.platform}")
    console.print(
        "  ".join(f"{k} {v or '[red]not installed[/]'}" for k, v in report.versions.items())
    )
    extras = Table(title="extras")
    for column in ("extra", "for", "installed"):
        extras.add_column(column)
    for e in report.extras:
        extras.add_row(
            e.name,
            e.purpose,
            "[green]yes[/]"
            if e.ok
            else "[red]no[/]: "
            + escape(f"{', '.join(e.missing)} (pip install 'specscope[{e.name}]')"),
        )
    console.print(extras)
    console.print(f"cache: {report.cache_dir}")
    for d in report.demo:
        console.print(
            f"demo {d.role}: {d.parts_installed}/{d.parts_needed} part packages; bf16 "
            f"cache {'built' if d.cache_built else 'not built'} at {d.cache}"
        )
    console.print(
        f"CPU: {hw.cpu}, {hw.cores} CPUs ({hw.usable_cpus} usable here"
        + (f", quota {hw.cpu_quota:g}" if hw.cpu_quota else "")
        + f"), torch threads {hw.torch_threads}, "
        f"AVX2 {hw.avx2}, AVX512-BF16 {hw.avx512_bf16}, AMX {hw.amx}, torch kernels "
        f"{hw.torch_cpu_capability}"
    )
    console.print("GPU: " + (", ".join(hw.gpus) if hw.gpus else "none"))
    for r in report.recommendations:
        console.print(f"recommendation: {escape(r)}")
