"""`specscope export`, `ingest`, `llamacpp` and `doctor`: serving engines and this machine."""

from __future__ import annotations

import functools
from pathlib import Path

import typer

from ..console import terminal_safe
from . import options
from .app import MACHINE, SERVE, command, fail

# --- export (serving engines) -------------------------------------------------------------------


@command(panel=SERVE)
def export(
    policy: Path = typer.Argument(
        ..., help="A policy file written by specscope tune (JSON or TOML)."
    ),
    to: str = typer.Option(
        ...,
        "--to",
        metavar=options.one_of(options.EXPORT_ENGINES),
        help="The serving engine whose format the settings are written in.",
        rich_help_panel=options.ENGINE_PANEL,
    ),
    engine_version: str | None = options.ENGINE_VERSION,
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Write the settings here (JSON; default: print them). llama.cpp: the presets file goes beside it, with .ini.",
        rich_help_panel=options.OUTPUT,
    ),
    draft: str | None = typer.Option(
        None,
        "--draft",
        help="The draft model as the engine loads it (path, hub id; llama.cpp: the draft GGUF, default: the demo pair's).",
        rich_help_panel=options.MODELS,
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        help="The target model (path, hub id, GGUF file): an early exit's layer must be below its layer count (read from its config, no weights). llama.cpp: the target GGUF file every preset serves (default: the demo pair's).",
        rich_help_panel=options.MODELS,
    ),
    poll: int = typer.Option(
        0,
        "--server-poll",
        min=0,
        max=100,
        help="llama.cpp: --poll of the drafting presets (0: threads sleep; busy-waiting threads of the idle model slow two-model decoding on CPU).",
        rich_help_panel=options.ENGINE_PANEL,
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
    fmt: str = typer.Option(
        ...,
        "--format",
        "-f",
        metavar=options.one_of(options.INGEST_FORMATS),
        help="The engine whose log it is (aiperf: AIPerf's profile_export.jsonl).",
        rich_help_panel=options.ENGINE_PANEL,
    ),
    prompts: Path = options.with_default(options.PROMPTS, ...),
    out: Path = typer.Option(
        ..., "--out", "-o", help="New run directory to write.", rich_help_panel=options.OUTPUT
    ),
    join: str = typer.Option(
        "id",
        "--join",
        metavar=options.one_of(options.JOINS),
        help="id: by each line's prompt_id, else the engine's request id (AIPerf: its conversation_id); order: the n-th request of the log joins the n-th prompt, only for lines that carry no id (llama-server /completion responses) and are in the prompts file's order (one client sending the prompts one at a time; the gateway logs in completion order).",
        rich_help_panel=options.PROMPTS_PANEL,
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
        typer.secho(f"warning: {terminal_safe(warning)}", fg=typer.colors.YELLOW, err=True)
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
        help="A measurement run (specscope run --domains ...): its prompts are the tuning prompts, its records replay the draft model's chains, its sources give the held-out prompts.",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Directory for the policy, the requests and the bench (default: RUN_DIR/llamacpp).",
        rich_help_panel=options.OUTPUT,
    ),
    policy_file: Path | None = options.POLICY_FILE,
    target_gguf: Path | None = options.TARGET_GGUF,
    draft_gguf: Path | None = options.DRAFT_GGUF,
    candidates: list[str] = options.CANDIDATE,
    tune_per_domain: int | None = options.TUNE_PER_DOMAIN,
    tune_repeats: int = options.TUNE_REPEATS,
    domains: list[str] | None = options.DOMAINS,
    per_domain: int = options.with_default(options.PER_DOMAIN, 10),
    max_new_tokens: int = options.with_default(options.MAX_NEW_TOKENS, 64),
    repeats: int = options.REPEATS,
    threads: int = options.SERVER_THREADS,
    costs: Path | None = options.COST_GRID,
    max_k: int = options.MAX_K,
    p_mins: list[float] = options.PRICE_P_MIN,
    tune_timings: Path | None = options.TUNE_TIMINGS,
    tune_only: bool = typer.Option(
        False,
        "--tune-only",
        help="Tune and write the policy; bench nothing (it takes hours).",
        rich_help_panel=options.TUNING,
    ),
    min_speedup: float = options.MIN_SPEEDUP,
    in_sample: bool = options.IN_SAMPLE,
    seed: int | None = options.SEED,
    n_boot: int = options.BOOT,
) -> None:
    """llama-server through tune and bench: time the candidate settings on RUN_DIR's prompts,
    price every draft-model chain up to --max-k (and at each --price-p-min) from RUN_DIR's records and
    a step model that plain and one draft-model candidate calibrate, choose per domain (plain
    included) and uniformly, then time the candidates and the choice on held-out prompts (seed
    2026 by default), predicted against measured; with --policy-file, bench that policy without
    tuning. Builds llama.cpp's programs first if needed (once, minutes)."""
    from ..files import inside_of
    from ..serving.llamacpp.study import llama_server_plan
    from .speculate import BENCH_DOMAINS, run_plan, tune_on_llama_server

    out = out or run_dir / "llamacpp"
    log = functools.partial(typer.echo, err=True)
    if tune_only and policy_file is not None:
        fail("--tune-only tunes a policy; --policy-file benches one: give one of them")
    log(
        "note: specscope llamacpp is now specscope tune RUN_DIR --backend llama-server, then "
        "specscope bench --backend llama-server --policy-file POLICY; this alias goes in the "
        "next release"
    )
    if policy_file is None:
        policy_file = out / "policy.json"
        tune_on_llama_server(
            run_dir,
            policy_file,
            candidates,
            target_gguf,
            draft_gguf,
            tune_per_domain,
            tune_repeats,
            threads,
            costs,
            max_k,
            p_mins,
            tune_timings,
            max_new_tokens,
            min_speedup,
            n_boot,
        )
        if tune_only:
            return
    inside = inside_of(out, policy_file.parent)  # links refused before any work
    plan = llama_server_plan(
        policy_file,
        out,
        list(options.names(domains) or BENCH_DOMAINS),
        per_domain,
        repeats,
        max_new_tokens,
        2026 if seed is None else seed,
        in_sample,
        n_boot,
        log=log,
    )
    run_plan(plan, out, inside)


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
