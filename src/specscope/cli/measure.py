"""`specscope run`, `sweep` and `domains`: measuring acceptance into run directories."""

from __future__ import annotations

from pathlib import Path

import typer

from ..limits import MAX_GRID, MAX_PROMPTS, MAX_RETRIES
from ..progress import current
from . import options
from .app import MEASURE, command, set_threads
from .drafting import drafter_config
from .progress import ProgressBar

# --- run (measurement engine) ------------------------------------------------------------------


def _bar(quiet: bool):
    """The command's own observer (its bars stack with any stage under the run's), or notes only
    with ``--quiet``."""
    return ProgressBar(bar=False) if quiet else current()


@command(panel=MEASURE)
def run(
    out: str = typer.Option(
        "runs/demo",
        "--out",
        "-o",
        help="Run directory to write (or resume): a local path or a file:// URI.",
        rich_help_panel=options.OUTPUT,
    ),
    config: str | None = typer.Option(
        None, "--config", "-c", help="Preset (paper, demo) or TOML file; options below override it."
    ),
    draft: str | None = options.DRAFT,
    target: str | None = options.TARGET,
    draft_revision: str | None = options.DRAFT_REVISION,
    target_revision: str | None = options.TARGET_REVISION,
    dtype: str | None = options.DTYPE,
    device: str | None = options.DEVICE,
    draft_device: str | None = typer.Option(
        None, help="Draft device (default: --device).", rich_help_panel=options.MODELS
    ),
    trust_remote_code: bool = options.TRUST_REMOTE_CODE,
    policy: str | None = options.with_choices(options.TREE_POLICY, options.MEASURED_POLICIES),
    # checked by TreeConfig, as a config file's [tree] is
    top_k: int | None = options.checked_by_library(options.TOP_K),
    branch: int | None = options.checked_by_library(options.BRANCH),
    depth: int | None = options.checked_by_library(options.TREE_DEPTH),
    max_nodes: int | None = options.checked_by_library(options.MAX_NODES),
    paths: str | None = options.PATHS,
    engine: str | None = typer.Option(
        None,
        "--measure-engine",
        metavar=options.one_of(options.MEASURE_ENGINES),
        help="How each step is measured: cached (KV caches, one tree pass) or naive (the paper's "
        "full recompute). Default: the config's.",
        rich_help_panel=options.EXECUTION,
    ),
    prompts: Path | None = options.PROMPTS,
    domains: list[str] | None = options.DOMAINS,
    per_domain: int | None = options.PER_DOMAIN,
    source: list[str] | None = typer.Option(
        None,
        "--source",
        help="DOMAIN=SOURCE: use another prompt source for a domain (see specscope domains).",
        rich_help_panel=options.PROMPTS_PANEL,
    ),
    smoke: bool = typer.Option(
        False,
        "--smoke",
        help="Use the built-in 4-prompt smoke set.",
        rich_help_panel=options.PROMPTS_PANEL,
    ),
    max_new_tokens: int | None = options.MAX_NEW_TOKENS,
    max_prompt_tokens: int | None = options.MAX_PROMPT_TOKENS,
    rendering: str | None = options.RENDERING,
    seed: int | None = options.SEED,
    batch_size: int | None = options.BATCH_SIZE,
    threads: int | None = options.THREADS,
    int8: bool = options.INT8,
    overwrite: bool = options.OVERWRITE,
    quiet: bool = options.QUIET,
    drafter: str | None = options.DRAFTER,
    prompt_lookup_min: int | None = options.PROMPT_LOOKUP_MIN,
    prompt_lookup_max: int | None = options.PROMPT_LOOKUP_MAX,
    ngram_size: int | None = options.NGRAM_SIZE,
    exit_layer: int | None = options.EXIT_LAYER,
) -> None:
    """Measure draft-tree acceptance node by node (the paper protocol) into a run directory."""
    import dataclasses

    from ..files import local_location
    from ..measure.checks import default_batch_size
    from ..run.config import RunConfigError, load_config
    from ..run.study import run_study
    from ..trees import check_policy_options

    out = local_location(out, "--out")
    prompt_file = str(prompts) if prompts else None
    domain_list = options.names(domains)
    overrides = tuple(tuple(s.split("=", 1)) for s in source or ())
    if any(len(pair) != 2 for pair in overrides):
        raise RunConfigError(f"--source takes DOMAIN=SOURCE, got {source}")
    base = load_config(config)
    chosen = drafter_config(
        drafter, prompt_lookup_min, prompt_lookup_max, ngram_size, exit_layer, base.drafter
    )
    if smoke or prompt_file:  # an explicit prompt choice replaces the preset's
        base = base.replace(**{"prompts.domains": (), "prompts.per_domain": None})
    cfg = base.replace(
        **{
            "pair.draft": draft,
            "pair.target": target,
            "pair.draft_revision": draft_revision,
            "pair.target_revision": target_revision,
            "pair.dtype": dtype,
            "pair.device": device,
            "pair.draft_device": draft_device,
            "pair.trust_remote_code": trust_remote_code or None,  # else the config's
            "tree.policy": policy,
            "tree.top_k": top_k,
            "tree.branch": branch,
            "tree.depth": depth,
            "tree.max_nodes": max_nodes,
            "tree.paths": paths,
            "engine": engine,
            "prompts.file": prompt_file,
            "prompts.domains": domain_list,
            "prompts.per_domain": per_domain,
            "prompts.smoke": smoke or None,
            "prompts.sources": overrides or None,
            "max_new_tokens": max_new_tokens,
            "max_prompt_tokens": max_prompt_tokens,
            "rendering": rendering,
            "seed": seed,
            "drafter": dataclasses.asdict(chosen) if chosen else None,
        }
    )
    if int8:
        cfg = cfg.replace(**{"pair.quantize": "int8", "pair.dtype": dtype or "float32"})
    given = {
        name
        for name, value in (
            ("top_k", top_k),
            ("branch", branch),
            ("depth", depth),
            ("max_nodes", max_nodes),
            ("paths", paths),
        )
        if value is not None
    }
    check_policy_options(cfg.tree.policy, given)
    if batch_size is None:
        batch_size = default_batch_size(cfg)
    set_threads(threads)
    summary = run_study(cfg, out, overwrite=overwrite, progress=_bar(quiet), batch_size=batch_size)
    if summary.already_complete:
        typer.echo(
            f"{out}: run {summary.run_id} is already complete ({summary.prompts_total} prompts); nothing to do"
        )
        return
    rate = summary.nodes / summary.seconds if summary.seconds else 0.0
    typer.echo(
        f"{out}: measured {summary.prompts_measured} prompt(s), {summary.nodes} nodes "
        f"in {summary.seconds:.1f} s ({rate:.1f} nodes/s); "
        f"{summary.prompts_skipped_empty} empty prompt(s) skipped"
    )


# --- sweep ------------------------------------------------------------------------------------


@command(panel=MEASURE)
def sweep(
    sweep_file: str = typer.Argument(..., help="Sweep file (TOML): base config, axes, execution."),
    out: str | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Sweep directory or URI, e.g. s3://bucket/sweeps/x or file:///data/x (default: sweeps/NAME).",
        rich_help_panel=options.OUTPUT,
    ),
    executor: str = typer.Option(
        "local",
        "--executor",
        "-e",
        metavar=options.one_of(options.EXECUTORS),
        help="local (one process) or ray (shards as Ray tasks; needs the ray extra).",
        rich_help_panel=options.EXECUTION,
    ),
    address: str | None = typer.Option(
        None,
        "--address",
        help="Ray cluster: auto or HOST:PORT (default: start Ray on this machine).",
        rich_help_panel=options.EXECUTION,
    ),
    prompts_per_shard: int | None = typer.Option(
        None,
        min=1,
        max=MAX_PROMPTS,
        help="Prompts per shard (a worker loads its pair once per shard).",
        rich_help_panel=options.EXECUTION,
    ),
    max_retries: int | None = typer.Option(
        None,
        min=0,
        max=MAX_RETRIES,
        help="Ray retries of a shard whose worker died.",
        rich_help_panel=options.EXECUTION,
    ),
    cpus_per_shard: float | None = typer.Option(
        None, help="CPUs a shard reserves on Ray.", rich_help_panel=options.EXECUTION
    ),
    gpus_per_shard: float | None = typer.Option(
        None,
        help="GPUs a cuda shard reserves on Ray (default: one per cuda device of the pair; 0.5 packs two per GPU).",
        rich_help_panel=options.EXECUTION,
    ),
    threads: int | None = options.THREADS,
    batch_size: int | None = options.BATCH_SIZE,
    max_points: int | None = typer.Option(
        None,
        "--max-points",
        min=1,
        max=MAX_GRID,
        help="Refuse a grid of more points than this (default: [execution] max_points, else 10,000).",
        rich_help_panel=options.EXECUTION,
    ),
    trust_remote_code: bool = options.TRUST_REMOTE_CODE,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="List the grid points and exit.", rich_help_panel=options.OUTPUT
    ),
    overwrite: bool = options.OVERWRITE,
    quiet: bool = options.QUIET,
) -> None:
    """Run a grid of runs (pairs x trees x domains x decode settings), locally or on a Ray cluster.

    Each grid point is a run directory under OUT/runs/; re-running the same command resumes.
    `specscope compare OUT` and `specscope report OUT` cover the whole sweep.
    """
    from ..files import local_location
    from ..sweep import load_sweep, run_sweep

    spec = load_sweep(
        local_location(sweep_file, "SWEEP_FILE"),
        max_points=max_points,
        trust_remote_code=trust_remote_code,
    )
    execution = spec.execution.replace(
        prompts_per_shard=prompts_per_shard,
        max_retries=max_retries,
        cpus_per_shard=cpus_per_shard,
        gpus_per_shard=gpus_per_shard,
        threads=threads,
        batch_size=batch_size,
    )
    out = out or str(Path("sweeps") / spec.name)
    if dry_run:
        points = spec.points()
        for point in points:
            typer.echo(
                f"{point.label}  run {point.config.run_id}  "
                + "  ".join(f"{axis}={name}" for axis, name in point.axes)
            )
        typer.echo(f"{len(points)} grid point(s); sweep {spec.sweep_id} -> {out}")
        return
    set_threads(None)  # local shards without [execution] threads run with the capped default
    summary = run_sweep(
        spec,
        out,
        executor=executor,
        address=address,
        execution=execution,
        overwrite=overwrite,
        progress=_bar(quiet),
    )
    if not summary.shards_run:
        typer.echo(
            f"{out}: sweep {summary.sweep_id} is already complete ({summary.points} runs); "
            "nothing to do"
        )
        return
    rate = summary.nodes / summary.seconds if summary.seconds else 0.0
    typer.echo(
        f"{out}: {summary.points_complete}/{summary.points} runs complete; ran "
        f"{summary.shards_run} of {summary.shards_total} shard(s) "
        f"({summary.shards_skipped} done before), {summary.prompts_measured} prompt(s), "
        f"{summary.nodes} nodes in {summary.seconds:.1f} s ({rate:.1f} nodes/s) "
        f"with the {summary.executor} executor"
    )
    if "://" in out and not out.lower().startswith("file://"):
        typer.echo(
            "compare the grid points: copy the sweep to a local directory DIR, then "
            "specscope compare DIR"
        )
    else:
        typer.echo(f"compare the grid points: specscope compare {out}")


# --- domains ----------------------------------------------------------------------------------


@command(panel=MEASURE)
def domains() -> None:
    """List the prompt domains, their sources, item counts and what works offline now."""
    from rich.table import Table

    from ..console import make_console
    from ..prompts.domains import list_domains

    table = Table(title="prompt domains and sources")
    for column in ("domain", "source", "dataset", "items", "offline now", "note"):
        table.add_column(column, justify="right" if column == "items" else "left")
    for row in list_domains():
        table.add_row(
            row.domain,
            row.source + (" *" if row.is_default else ""),
            row.dataset,
            "?" if row.items is None else str(row.items),
            "[green]yes[/]" if row.ready_offline else "[red]no[/]",
            row.note,
        )
    console = make_console()
    console.print(table)
    console.print("* the domain's default source; a run can name another source, or jsonl:PATH")
