"""The ``specscope`` command line: a thin layer over the library.

Every command turns specscope's expected failures (:class:`specscope.errors.SpecscopeError`) into
one line on stderr and exit status 2; exit status 1 is a finding the command reports (certify's
soundness violation); anything else with a traceback is a bug.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

import typer

from .errors import SpecscopeError

app = typer.Typer(
    name="specscope",
    help="Acceptance dynamics of tree-based speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """Acceptance dynamics of tree-based speculative decoding: measure, analyse, certify, speculate."""


def fail(message: str) -> None:
    """Print a one-line error and exit with status 2."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def command(*args, **kwargs):
    """``app.command`` whose function turns any SpecscopeError into :func:`fail`."""
    def register(function):
        @functools.wraps(function)
        def guarded(*a, **k):
            try:
                return function(*a, **k)
            except SpecscopeError as e:
                fail(str(e))
        return app.command(*args, **kwargs)(guarded)
    return register


# --- run (measurement engine) ------------------------------------------------------------------


@command()
def run(
    out: Path = typer.Option(Path("runs/demo"), "--out", "-o", help="Run directory to write (or resume)."),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Preset (paper, demo) or TOML file; options below override it."),
    draft: Optional[str] = typer.Option(None, help="Draft model: hub id, local dir, .gguf file, or demo:draft."),
    target: Optional[str] = typer.Option(None, help="Target model: hub id, local dir, .gguf file, or demo:target."),
    dtype: Optional[str] = typer.Option(None, help="bfloat16, float16, float32, or auto (the fastest here: bfloat16 on a GPU or a CPU with AMX or AVX512-BF16, else float32)."),
    device: Optional[str] = typer.Option(None, help="Target device, e.g. cpu or cuda:0."),
    draft_device: Optional[str] = typer.Option(None, help="Draft device (defaults to --device)."),
    trust_remote_code: Optional[bool] = typer.Option(None, "--trust-remote-code", help="Allow model code from the hub."),
    policy: Optional[str] = typer.Option(None, help="Tree policy: paper, paper-text, chain, static."),
    top_k: Optional[int] = typer.Option(None, help="Root candidates (paper: min(top_k, branch) roots)."),
    branch: Optional[int] = typer.Option(None, help="Children per node."),
    depth: Optional[int] = typer.Option(None, help="Tree depth (chain length for 'chain')."),
    max_nodes: Optional[int] = typer.Option(None, help="Node cap, breadth-first."),
    paths: Optional[str] = typer.Option(None, help='Static tree as path tuples, e.g. "[(0,), (1,), (0, 0)]".'),
    engine: Optional[str] = typer.Option(None, help="cached (KV caches, one tree pass) or naive (paper's full recompute)."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="JSONL file of {id, domain, prompt|messages}."),
    domains: Optional[str] = typer.Option(None, help="Comma-separated domains, e.g. code,math,reasoning,chat."),
    per_domain: Optional[int] = typer.Option(None, help="Prompts sampled per domain."),
    source: Optional[list[str]] = typer.Option(None, "--source", help="DOMAIN=SOURCE: use another prompt source for a domain (see specscope domains)."),
    smoke: bool = typer.Option(False, "--smoke", help="Use the built-in 4-prompt smoke set."),
    max_new_tokens: Optional[int] = typer.Option(None, help="Tokens to generate per prompt."),
    max_prompt_tokens: Optional[int] = typer.Option(None, help="Keep the last N prompt tokens."),
    chat_template: Optional[bool] = typer.Option(None, "--chat-template/--no-chat-template", help="Apply the model's chat template."),
    seed: Optional[int] = typer.Option(None, help="Seed for prompt sampling."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", "-b", help="Prompts measured together (cached engine; default: 8 on a CPU, 32 on a GPU). Same records as one at a time, faster."),
    int8: bool = typer.Option(False, "--int8", help="Both models' linear layers in int8 on the CPU (implies --dtype float32); records then do not depend on the batch size."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the specscope run in --out (only a run; after every input is checked) and start over."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Measure draft-tree acceptance node by node (the paper protocol) into a run directory."""
    from .prompts.items import PromptSourceError
    from .models import ModelLoadError
    from .records import RunDirError
    from .run.config import RunConfigError, load_config
    from .run.study import default_batch_size, run_study
    from .trees import TreeConfigError, check_policy_options

    prompt_file = str(prompts) if prompts else None
    domain_list = tuple(d.strip() for d in domains.split(",") if d.strip()) if domains else None
    try:
        overrides = tuple(tuple(s.split("=", 1)) for s in source or ())
        if any(len(pair) != 2 for pair in overrides):
            raise RunConfigError(f"--source takes DOMAIN=SOURCE, got {source}")
        base = load_config(config)
        if smoke or prompt_file:  # an explicit prompt choice replaces the preset's
            base = base.replace(**{"prompts.domains": (), "prompts.per_domain": None})
        cfg = base.replace(**{
            "pair.draft": draft, "pair.target": target, "pair.dtype": dtype,
            "pair.device": device, "pair.draft_device": draft_device,
            "pair.trust_remote_code": trust_remote_code,
            "tree.policy": policy, "tree.top_k": top_k, "tree.branch": branch,
            "tree.depth": depth, "tree.max_nodes": max_nodes, "tree.paths": paths,
            "engine": engine, "prompts.file": prompt_file, "prompts.domains": domain_list,
            "prompts.per_domain": per_domain, "prompts.smoke": smoke or None,
            "prompts.sources": overrides or None,
            "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens,
            "chat_template": chat_template, "seed": seed,
        })
        if int8:
            cfg = cfg.replace(**{"pair.quantize": "int8", "pair.dtype": dtype or "float32"})
        given = {name for name, value in (("top_k", top_k), ("branch", branch), ("depth", depth),
                                          ("max_nodes", max_nodes), ("paths", paths))
                 if value is not None}
        check_policy_options(cfg.tree.policy, given)
        if batch_size is None:
            batch_size = default_batch_size(cfg)
        summary = run_study(cfg, out, overwrite=overwrite, progress=not quiet,
                            batch_size=batch_size)
    except (RunConfigError, TreeConfigError, PromptSourceError, ModelLoadError, RunDirError) as e:
        fail(str(e))
    if summary.already_complete:
        typer.echo(f"{out}: run {summary.run_id} is already complete ({summary.prompts_total} prompts); nothing to do")
        return
    rate = summary.nodes / summary.seconds if summary.seconds else 0.0
    typer.echo(f"{out}: measured {summary.prompts_measured} prompt(s), {summary.nodes} nodes "
               f"in {summary.seconds:.1f} s ({rate:.1f} nodes/s); "
               f"{summary.prompts_skipped_empty} empty prompt(s) skipped")

# --- domains ----------------------------------------------------------------------------------


@command()
def domains() -> None:
    """List the prompt domains, their sources, item counts and what works offline now."""
    from rich.console import Console
    from rich.table import Table

    from .prompts.domains import list_domains

    table = Table(title="prompt domains and sources")
    for column in ("domain", "source", "dataset", "items", "offline now", "note"):
        table.add_column(column, justify="right" if column == "items" else "left")
    for row in list_domains():
        table.add_row(row.domain, row.source + (" *" if row.is_default else ""), row.dataset,
                      "?" if row.items is None else str(row.items),
                      "[green]yes[/]" if row.ready_offline else "[red]no[/]", row.note)
    Console().print(table)
    Console().print("* the domain's default source; a run can name another source, or jsonl:PATH")


# --- analyze / report / compare ----------------------------------------------------------------

_BOOT = typer.Option(1000, "--boot", min=0, help="Bootstrap resamples of prompts (0: no intervals).")
_BOOT_SEED = typer.Option(0, "--seed", help="Seed of the bootstrap resampling.")
_CONFIDENCE = typer.Option(0.95, "--confidence", min=0.5, max=0.999, help="Confidence level of the intervals.")
_PLOTS = typer.Option(True, "--plots/--no-plots", help="Draw plots (needs the [plot] extra).")


def _analyses(run_dirs: list[Path], boot: int, seed: int, confidence: float):
    from .analysis import Settings, analyze as analyze_run
    from .records import RunDirError

    settings = Settings(n_boot=boot, seed=seed, confidence=confidence)
    out = []
    for run_dir in run_dirs:
        try:
            out.append(analyze_run(run_dir, settings))
        except RunDirError as e:
            fail(str(e))
    return out


def _expand_sweeps(paths: list[Path]) -> tuple[list[Path], bool]:
    """Sweep directories replaced by their grid points' run directories; whether there was one."""
    if not any((path / "sweep.json").is_file() for path in paths):
        return paths, False
    from .sweep import SweepError, expand_run_dirs  # imports torch: only for sweeps

    try:
        return expand_run_dirs(paths), True
    except SweepError as e:
        fail(str(e))


def _print_grids(grids) -> None:
    from rich.console import Console

    from .analysis.render import to_rich

    console = Console()
    for grid in grids:
        console.print(to_rich(grid))
        console.print()


@command()
def analyze(
    run_dir: Path = typer.Argument(..., help="A run directory written by `specscope run`."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder (default: RUN_DIR/analysis)."),
    boot: int = _BOOT,
    seed: int = _BOOT_SEED,
    confidence: float = _CONFIDENCE,
    plots: bool = _PLOTS,
    show: str = typer.Option("main", "--show", help="Tables to print: main, all or none."),
) -> None:
    """The paper's Tables I-VI, the corrected metrics and the paper's findings, with intervals.

    Writes tables.md, tables.tex, csv/, analysis.json, plots/ and report.html to --out.
    """
    from .analysis.render import analysis_grids, findings_grid
    from .analysis.report import write_outputs

    from .records import check_writable_dir

    if show not in ("main", "all", "none"):
        fail(f"--show must be main, all or none, not {show!r}")
    check_writable_dir(out or run_dir / "analysis")
    from .ingest import is_ingested

    if is_ingested(run_dir):  # engine logs: step-level figures only
        from .analysis.stepwise import analyze_ingested, write_ingested_analysis
        from .ingest import load_ingested

        manifest, requests, _ = load_ingested(run_dir)
        stepwise = analyze_ingested(manifest, requests, boot, seed, confidence)
        if show != "none":
            typer.echo(stepwise.to_markdown())
        md, js = write_ingested_analysis(stepwise, out or run_dir / "analysis")
        typer.echo(f"wrote {md}, {js}")
        return
    (a,) = _analyses([run_dir], boot, seed, confidence)
    grids = analysis_grids(a)
    if show == "main":
        keep = {"findings", "table1", "table2", "table3", "table4", "table5", "table6", "tau",
                "acceptance_vector", "effects", "paradox"}
        grids = [findings_grid(a.findings, compact=True)] + [g for g in grids if g.key in keep - {"findings"}]
    if show != "none":
        _print_grids(grids)
    for warning in a.warnings:
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    outputs = write_outputs(a, out or run_dir / "analysis", plots=plots)
    if plots and outputs.plot_message:
        typer.secho(outputs.plot_message, fg=typer.colors.YELLOW, err=True)
    typer.echo(f"wrote {outputs.markdown}, {outputs.latex}, {outputs.csv_dir}/, {outputs.json}, "
               f"{len(outputs.plots)} plots, {outputs.html}")


@command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="One run directory, or several to compare (the first is the reference); a sweep directory stands for its runs."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="HTML file (default: RUN_DIR/analysis/report.html, SWEEP_DIR/report.html, or ./specscope-comparison.html for several runs)."),
    boot: int = _BOOT,
    seed: int = _BOOT_SEED,
    confidence: float = _CONFIDENCE,
    plots: bool = _PLOTS,
    paper: bool = typer.Option(True, "--paper/--no-paper", help="Include the comparison with the paper's published figures."),
) -> None:
    """One self-contained HTML report (tables, plots, findings) of a run or a comparison of runs."""
    from .analysis.plots import plots_unavailable
    from .analysis.report import write_report

    from .records import check_writable_file

    expanded, has_sweep = _expand_sweeps(run_dirs)
    if out is None:
        out = (run_dirs[0] / "report.html" if has_sweep and len(run_dirs) == 1
               else run_dirs[0] / "analysis" / "report.html" if len(expanded) == 1
               else Path("specscope-comparison.html"))
    check_writable_file(out, (".html", ".htm"))
    analyses = _analyses(expanded, boot, seed, confidence)
    if plots and plots_unavailable():
        typer.secho(plots_unavailable(), fg=typer.colors.YELLOW, err=True)
    typer.echo(f"wrote {write_report(analyses, out, paper=paper, plots=plots)}")


@command()
def compare(
    run_dir: Path = typer.Argument(..., help="A run directory, or a sweep directory (one row per grid point)."),
    other: Optional[Path] = typer.Argument(None, help="Another run (or sweep) directory; omitted: the paper's published figures."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Also write the comparison as tables.md, tables.tex and csv/ here."),
    boot: int = _BOOT,
    seed: int = _BOOT_SEED,
    confidence: float = _CONFIDENCE,
) -> None:
    """Side by side: this run's tables and another run's, the paper's figures, or a sweep's runs."""
    from .analysis.render import findings_grid
    from .analysis.report import compare as compare_runs
    from .analysis.report import compare_with_paper, summary_grid, write_tables

    from .records import check_writable_dir

    if out is not None:
        check_writable_dir(out)
    expanded, has_sweep = _expand_sweeps([run_dir] + ([other] if other else []))
    analyses = _analyses(expanded, boot, seed, confidence)
    if has_sweep:
        grids = [summary_grid(analyses)]
        title = f"{len(analyses)} runs of {', '.join(str(p) for p in (run_dir, other) if p)}"
    elif other is None:
        grids = [findings_grid(analyses[0].findings, compact=True)] + compare_with_paper(analyses[0])
        title = f"{analyses[0].info.run_id} vs the paper"
    else:
        grids = compare_runs(*analyses)
        title = f"{analyses[0].info.run_id} vs {analyses[1].info.run_id}"
    _print_grids(grids)
    if out is not None:
        md, tex, csv_dir = write_tables(grids, out, f"specscope comparison: {title}")
        typer.echo(f"wrote {md}, {tex}, {csv_dir}/")


# --- certify ----------------------------------------------------------------------------------


@command()
def certify(
    run_dir: Path = typer.Argument(..., help="A run directory written by `specscope run`."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write CSV tables and plots (PNG+SVG) here."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="With --out: plot certificate vs target margin (needs matplotlib, the plot extra)."),
) -> None:
    """Certificates of acceptance: distributions, certified steps, soundness, tree coverage (docs/theory.md)."""
    from rich.console import Console
    from rich.table import Table

    from .records import RunDirError, check_writable_dir, load_run

    if out is not None:
        check_writable_dir(out)
    from .theory import certify_run, plot_certificates

    try:
        report = certify_run(load_run(run_dir))
    except RunDirError as e:
        fail(str(e))
    console = Console()

    def show(df, title: str, key: str) -> None:
        if not len(df):
            return
        table = Table(title=title)
        for col in ("domain", key, "n", "median", "p5", "frac_ok", "frac_certified", "run_mean", "run_max", "violations"):
            table.add_column({"frac_ok": "accepted" if key == "criterion" else "covered"}.get(col, col),
                             justify="left" if col in ("domain", key) else "right")
        for row in df.itertuples(index=False):
            r = row._asdict()
            v = r["violations"]
            table.add_row(*(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in (
                "domain", key, "n", "median", "p5", "frac_ok", "frac_certified", "run_mean", "run_max")),
                "n/a" if v != v else (f"[red]{int(v)}[/]" if v else "0"))
        console.print(table)

    show(report.criteria, f"acceptance certificates per step (nats; source: {report.source})", "criterion")
    show(report.trees, "tree coverage certificates per step (nats)", "tree")
    pub = Table(title="published (Qwen3-1.7B, UltraChat, greedy) vs this run")
    for col in report.published.columns:
        pub.add_column(col, justify="left" if col in ("certificate", "statistic") else "right")
    for row in report.published.itertuples(index=False):
        pub.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row))
    console.print(pub)
    for note in report.notes:
        console.print(f"note: {note}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for name, df in (("certificates", report.criteria), ("tree_certificates", report.trees),
                         ("published_comparison", report.published)):
            df.to_csv(out / f"{name}.csv", index=False)
        if plot:
            try:
                for path in plot_certificates(report, out):
                    console.print(f"wrote {path}")
            except ImportError as e:
                fail(f"{e} (or pass --no-plot)")
    if report.violations:
        console.print(f"[red]soundness violated on {report.violations} step(s): KL < C but rejected[/]")
        raise typer.Exit(1)
    console.print("soundness: 0 steps certified but rejected")


# --- sweep ------------------------------------------------------------------------------------


@command()
def sweep(
    sweep_file: Path = typer.Argument(..., help="Sweep file (TOML): base config, axes, execution."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Sweep directory or URI, e.g. s3://bucket/sweeps/x (default: sweeps/NAME)."),
    executor: str = typer.Option("local", "--executor", "-e", help="local (one process) or ray (shards as Ray tasks; needs the ray extra)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster: auto or HOST:PORT (default: start Ray on this machine)."),
    prompts_per_shard: Optional[int] = typer.Option(None, help="Prompts per shard (a worker loads its pair once per shard)."),
    max_retries: Optional[int] = typer.Option(None, help="Ray retries of a shard whose worker died."),
    cpus_per_shard: Optional[float] = typer.Option(None, help="CPUs a shard reserves on Ray."),
    gpus_per_shard: Optional[float] = typer.Option(None, help="GPUs a cuda shard reserves on Ray (default: one per cuda device of the pair; 0.5 packs two per GPU)."),
    threads: Optional[int] = typer.Option(None, help="Torch threads per shard (default: cpus-per-shard on Ray, torch's default locally)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the grid points and exit."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete what the sweep directory holds and start over."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Run a grid of runs (pairs x trees x domains x decode settings), locally or on a Ray cluster.

    Each grid point is a run directory under OUT/runs/; re-running the same command resumes.
    `specscope compare OUT` and `specscope report OUT` cover the whole sweep.
    """
    from .prompts.items import PromptSourceError
    from .models import ModelLoadError
    from .records import RunDirError
    from .run.config import RunConfigError
    from .sweep import SweepError, load_sweep, run_sweep

    try:
        spec = load_sweep(sweep_file)
        execution = spec.execution.replace(
            prompts_per_shard=prompts_per_shard, max_retries=max_retries,
            cpus_per_shard=cpus_per_shard, gpus_per_shard=gpus_per_shard, threads=threads)
        out = out or str(Path("sweeps") / spec.name)
        if dry_run:
            for point in spec.points():
                typer.echo(f"{point.label}  run {point.config.run_id}  "
                           + "  ".join(f"{axis}={name}" for axis, name in point.axes))
            typer.echo(f"{len(spec.points())} grid point(s); sweep {spec.sweep_id} -> {out}")
            return
        summary = run_sweep(spec, out, executor=executor, address=address, execution=execution,
                            overwrite=overwrite, progress=not quiet)
    except (SweepError, RunConfigError, PromptSourceError, ModelLoadError, RunDirError) as e:
        fail(str(e))
    if not summary.shards_run:
        typer.echo(f"{out}: sweep {summary.sweep_id} is already complete ({summary.points} runs); "
                   "nothing to do")
        return
    rate = summary.nodes / summary.seconds if summary.seconds else 0.0
    typer.echo(f"{out}: {summary.points_complete}/{summary.points} runs complete; ran "
               f"{summary.shards_run} of {summary.shards_total} shard(s) "
               f"({summary.shards_skipped} done before), {summary.prompts_measured} prompt(s), "
               f"{summary.nodes} nodes in {summary.seconds:.1f} s ({rate:.1f} nodes/s) "
               f"with the {summary.executor} executor")
    typer.echo(f"compare the grid points: specscope compare {out}")


# --- decode / tune / bench -------------------------------------------------------------------


def _decode_pair(draft: Optional[str], target: Optional[str], dtype: str, device: str,
                 trust_remote_code: bool, int8: bool = False, base: Optional[dict] = None):
    """Load a pair (``base``: a run's [pair] section) with command-line overrides."""
    from .models import ModelLoadError, PairConfig, load_pair

    fields = dict(base or {})
    fields.update({k: v for k, v in dict(draft=draft, target=target, dtype=dtype, device=device,
                                          trust_remote_code=trust_remote_code or None).items()
                   if v is not None})
    if int8:
        fields["quantize"] = "int8"
        fields["dtype"] = dtype or "float32"
    try:
        return load_pair(PairConfig(**fields))
    except (ModelLoadError, TypeError) as e:
        fail(str(e))


def _write_records(frame, path: Path) -> None:
    if path.suffix == ".parquet":
        frame.to_parquet(path, index=False)
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        fail(f"--records must end in .parquet, .csv or .jsonl, not {path.name!r}")


_D_DRAFT = typer.Option(None, "--draft", help="Draft model: hub id, local dir, .gguf file, or demo:draft (default).")
_D_TARGET = typer.Option(None, "--target", help="Target model: hub id, local dir, .gguf file, or demo:target (default).")
_D_DTYPE = typer.Option(None, "--dtype", help="bfloat16, float16, float32 or auto (default: bfloat16, or the run's).")
_D_DEVICE = typer.Option(None, "--device", help="Device of both models, e.g. cpu or cuda:0.")
_D_TRUST = typer.Option(False, "--trust-remote-code", help="Allow model code from the hub.")
_D_INT8 = typer.Option(False, "--int8", help="Run both models' linear layers in int8 on the CPU (implies --dtype float32): passes of a few tokens cost about one; greedy outputs stay exactly plain decoding's of the same model.")
_D_THREADS = typer.Option(None, "--threads", min=1, help="CPU threads for torch (default: torch's choice). Measure costs (tune) and bench with the same number.")


def _set_threads(threads: Optional[int]) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


@command()
def decode(
    prompt: Optional[str] = typer.Argument(None, help="The prompt (one user message); or --prompt-file."),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", help="Read the prompt from this file."),
    policy: str = typer.Option("chain", help="Tree policy: chain, static, paper, paper-text, dynamic, optimal or none."),
    depth: Optional[int] = typer.Option(None, help="Tree depth (chain 4, dynamic 5, optimal 6)."),
    top_k: Optional[int] = typer.Option(None, help="paper: root candidates; dynamic: nodes expanded per depth and children each (4)."),
    branch: Optional[int] = typer.Option(None, help="paper: children per node."),
    max_nodes: Optional[int] = typer.Option(None, help="Node budget (paper 8, dynamic 16, optimal 16)."),
    paths: Optional[str] = typer.Option(None, help='Static tree as path tuples, e.g. "[(0,), (1,), (0, 0)]".'),
    acceptance: Optional[Path] = typer.Option(None, "--acceptance", help="optimal: run directory whose node records give the acceptance vector."),
    policy_file: Optional[Path] = typer.Option(None, "--policy-file", help="Per-domain trees from `specscope tune`: the router picks the prompt's domain and its tree."),
    domain: Optional[str] = typer.Option(None, "--domain", help="With --policy-file: use this domain's tree (no routing). With --acceptance: this domain's vector (default: all)."),
    temperature: float = typer.Option(0.0, help="0: greedy (lossless); > 0: speculative sampling."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass, in (0, 1]."),
    seed: int = typer.Option(0, help="Seed of the sampling."),
    min_path_prob: float = typer.Option(0.0, help="Stop growing the tree when no frontier path has this draft probability (0: grow the whole tree)."),
    max_new_tokens: int = typer.Option(64, help="Tokens to generate."),
    chat_template: bool = typer.Option(True, "--chat-template/--no-chat-template", help="Apply the model's chat template."),
    max_prompt_tokens: int = typer.Option(512, help="Keep the last N prompt tokens."),
    records: Optional[Path] = typer.Option(None, "--records", help="Write per-step records (.parquet, .csv or .jsonl)."),
    draft: Optional[str] = _D_DRAFT,
    target: Optional[str] = _D_TARGET,
    dtype: Optional[str] = _D_DTYPE,
    device: Optional[str] = _D_DEVICE,
    trust_remote_code: bool = _D_TRUST,
    threads: Optional[int] = _D_THREADS,
    int8: bool = _D_INT8,
) -> None:
    """Generate with real speculative decoding over a draft tree; print the text and its speed."""
    from .decode import DecodeConfig, DecodeError, make_decoder, steps_frame
    from .tune.acceptance import PolicyError, acceptance_vectors
    from .tune.policy import PolicyFile, describe, make_speculation
    from .records import RunDirError, load_run
    from .tune.router import RuleRouter
    from .prompts.render import render_prompt

    if (prompt is None) == (prompt_file is None):
        fail("give a prompt, or --prompt-file (one of them)")
    text = prompt if prompt is not None else prompt_file.read_text()
    try:
        config = DecodeConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                              seed=seed, min_path_prob=min_path_prob)
        routed = None
        if policy_file is not None:
            policies = PolicyFile.load(policy_file)
            if domain is not None and domain not in policies.trees:
                raise PolicyError(f"{policy_file} has no domain {domain!r}; it has "
                                  f"{', '.join(policies.trees) or 'none'} (omit --domain to "
                                  "route by the prompt)")
            routed = domain or RuleRouter().classify(text)
            spec = policies.tree_for(routed)
        else:
            vector = None
            if acceptance is not None:
                vectors = acceptance_vectors(load_run(acceptance).nodes)
                if (domain or "all") not in vectors:
                    fail(f"{acceptance} has no domain {domain!r}; it has {', '.join(vectors)}")
                vector = vectors[domain or "all"]
            spec = make_speculation(policy, depth=depth, top_k=top_k, branch=branch,
                                    max_nodes=max_nodes, paths=paths, acceptance=vector)
    except (DecodeError, PolicyError, RunDirError) as e:
        fail(str(e))
    _set_threads(threads)
    pair = _decode_pair(draft, target, dtype, device, trust_remote_code, int8)
    ids = render_prompt(pair.tokenizer, [{"role": "user", "content": text}], chat_template,
                        max_prompt_tokens).ids
    try:
        result = make_decoder(pair).generate(ids, spec, config)
    except DecodeError as e:
        fail(str(e))
    typer.echo(pair.tokenizer.decode(result.tokens, skip_special_tokens=True))
    where = f"domain {routed}: " if routed else ""
    typer.secho(f"{where}{describe(spec)}\n{len(result.tokens)} tokens in {result.time_s:.2f} s "
                f"({result.tokens_per_s:.2f} tok/s), {len(result.steps)} steps, mean tau "
                f"{result.mean_tau:.2f}, stop: {result.stop_reason}", err=True, fg=typer.colors.CYAN)
    if records is not None:
        _write_records(steps_frame(result), records)


@command()
def tune(
    run_dir: Path = typer.Argument(..., help="A measurement run (specscope run): its nodes give acceptance by depth and sibling rank per domain."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Policy file to write (default: RUN_DIR/policy.json)."),
    costs: Optional[Path] = typer.Option(None, "--costs", help="Use this cost model (JSON) instead of measuring one now."),
    save_costs: Optional[Path] = typer.Option(None, "--save-costs", help="Also write the measured cost model here."),
    max_nodes: int = typer.Option(32, help="Largest tree considered."),
    max_depth: int = typer.Option(8, help="Deepest tree considered (capped by the run's tree)."),
    max_rank: Optional[int] = typer.Option(None, help="Highest sibling rank + 1 considered."),
    min_count: int = typer.Option(20, help="Acceptance cells seen fewer times count as 0."),
    min_speedup: float = typer.Option(1.0, help="Speculate only where the predicted speed-up exceeds this."),
    extrapolate: bool = typer.Option(False, "--extrapolate", help="Depths past the run's tree reuse the deepest measured acceptance (assumes flat acceptance in depth)."),
    context_len: int = typer.Option(256, help="Context length of the cost measurement."),
    repeats: int = typer.Option(3, help="Timings per point of the cost measurement (median)."),
    draft: Optional[str] = _D_DRAFT,
    target: Optional[str] = _D_TARGET,
    dtype: Optional[str] = _D_DTYPE,
    device: Optional[str] = _D_DEVICE,
    trust_remote_code: bool = _D_TRUST,
    threads: Optional[int] = _D_THREADS,
    int8: bool = _D_INT8,
) -> None:
    """Pick the best tree per domain (or no speculation) from measured acceptance and measured cost."""
    from rich.console import Console
    from rich.table import Table

    from .decode import DecodeError, make_decoder
    from .tune.costs import measure_costs
    from .tune.acceptance import ALL_DOMAINS, PolicyError
    from .tune.costs import CostModel
    from .tune.policy import TuneConfig, short_name, tune as tune_policy
    from .records import RunDirError, load_run

    try:
        run = load_run(run_dir)
        config = TuneConfig(max_nodes=max_nodes, max_depth=max_depth, max_rank=max_rank,
                            min_count=min_count, min_speedup=min_speedup, extrapolate=extrapolate)
        model = CostModel.load(costs) if costs else None
    except (RunDirError, PolicyError) as e:
        fail(str(e))
    if model is None:
        base = run.manifest.get("config", {}).get("pair", {})
        _set_threads(threads)
        pair = _decode_pair(draft, target, dtype, device, trust_remote_code, int8, base)
        typer.echo("measuring draft and verify times on this hardware ...", err=True)
        try:
            model = measure_costs(make_decoder(pair), context_len=context_len,
                                  repeats=repeats)
        except DecodeError as e:
            fail(str(e))
        if save_costs:
            model.save(save_costs)
    ids = run.manifest.get("prompts", {}).get("ids") or sorted(run.prompts["prompt_id"].unique())
    source = {"run_dir": str(run_dir), "run_id": run.manifest.get("run_id"), "prompt_ids": list(ids)}
    try:
        policy = tune_policy(run.nodes, model, config, source)
    except PolicyError as e:
        fail(str(e))
    path = policy.save(out or run_dir / "policy.json")
    table = Table(title=f"best tree per domain (plain decoding: {1 / model.plain_token_s:.2f} tok/s)")
    for col in ("domain", "tree", "nodes", "expected tau", "step ms", "predicted speed-up"):
        table.add_column(col, justify="left" if col in ("domain", "tree") else "right")
    for name, choice in policy.choices.items():
        table.add_row("uniform (all)" if name == ALL_DOMAINS else name,
                      short_name(choice.shape) if choice.shape else "none (plain decoding)",
                      str(len(choice.shape) if choice.shape else 0),
                      f"{choice.expected_tau:.2f}", f"{1000 * choice.step_time_s:.0f}",
                      f"{choice.predicted_speedup:.2f}x")
    Console().print(table)
    typer.echo(f"wrote {path}")


@command()
def bench(
    policy_file: Optional[Path] = typer.Option(None, "--policy-file", help="Per-domain trees from `specscope tune` (for uniform and routed)."),
    domains: str = typer.Option("code,math,reasoning,chat", help="Comma-separated domains."),
    per_domain: int = typer.Option(2, min=1, help="Prompts per domain (held out from the tuning run)."),
    max_new_tokens: int = typer.Option(48, help="Tokens to generate per prompt."),
    warmup: int = typer.Option(1, help="Untimed rounds of every method on the first prompt."),
    repeats: int = typer.Option(3, help="Timed runs per method and prompt (the median is kept)."),
    chain_depth: int = typer.Option(4, help="Depth of the 'chain' method."),
    min_path_prob: float = typer.Option(0.0, help="specscope methods: stop growing a tree when no frontier path has this draft probability."),
    methods: str = typer.Option("plain,assisted,chain,uniform,routed", help="Comma-separated: plain, assisted, chain, uniform, routed, dynamic."),
    router_name: str = typer.Option("rules", "--router", help="rules or learned (TF-IDF + logistic regression, trained on a held-out split)."),
    seed: int = typer.Option(42, help="Seed of the prompt sample and the router's split."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write every run and the summary as JSON."),
    draft: Optional[str] = _D_DRAFT,
    target: Optional[str] = _D_TARGET,
    dtype: Optional[str] = _D_DTYPE,
    device: Optional[str] = _D_DEVICE,
    trust_remote_code: bool = _D_TRUST,
    threads: Optional[int] = _D_THREADS,
    int8: bool = _D_INT8,
) -> None:
    """Tokens per second of plain, assisted, chain, uniform-tree and routed decoding, per domain."""
    import dataclasses
    import json

    import torch
    from rich.console import Console
    from rich.table import Table

    from .tune.bench import BenchConfig, run_bench, summarize_bench
    from .decode import DecodeError, make_decoder
    from .prompts.items import PromptSourceError, sample_items
    from .prompts.domains import select_prompts
    from .tune.acceptance import PolicyError
    from .tune.policy import PolicyFile
    from .tune.router import LearnedRouter, RuleRouter, holdout_split, prompt_text, router_accuracy

    console = Console(width=None if Console().is_terminal else 140)  # full tables in logs too
    try:
        config = BenchConfig(max_new_tokens=max_new_tokens, warmup=warmup, repeats=repeats,
                             chain_depth=chain_depth, min_path_prob=min_path_prob,
                             methods=tuple(m.strip() for m in methods.split(",") if m.strip()))
        policy = PolicyFile.load(policy_file) if policy_file else None
        names = [d.strip() for d in domains.split(",") if d.strip()]
        pool = select_prompts(names, None, seed=seed)
    except (DecodeError, PolicyError, PromptSourceError) as e:
        fail(str(e))
    if router_name not in ("rules", "learned"):
        fail(f"--router must be rules or learned, not {router_name!r}")
    tuned = set((policy.info.get("source", {}) if policy else {}).get("prompt_ids", []))
    pool = [it for it in pool if it.id not in tuned]  # never bench on the tuning prompts
    train, test = holdout_split(pool, 0.5, seed)
    learned = LearnedRouter().fit([prompt_text(i) for i in train], [i.domain for i in train])
    reports = [router_accuracy(RuleRouter(), test), router_accuracy(learned, test)]
    table = Table(title=f"router accuracy on {len(test)} held-out prompts")
    for col in ["router"] + names + ["all"]:
        table.add_column(col, justify="left" if col == "router" else "right")
    for rep in reports:
        table.add_row(rep.router, *(f"{rep.domain_accuracy(d):.1%} ({rep.per_domain.get(d, (0, 0))[1]})"
                                    if d in rep.per_domain else "-" for d in names), f"{rep.accuracy:.1%}")
    console.print(table)
    router = RuleRouter() if router_name == "rules" else learned
    items = [it for d in names for it in sample_items([i for i in test if i.domain == d], per_domain, seed)]
    _set_threads(threads)
    pair = _decode_pair(draft, target, dtype, device, trust_remote_code, int8)
    try:
        runs = run_bench(make_decoder(pair), pair.tokenizer, items, policy, router, config,
                         log=lambda line: typer.echo(line, err=True))
    except DecodeError as e:
        fail(str(e))
    rows = summarize_bench(runs)
    table = Table(title=f"greedy decoding, {max_new_tokens} new tokens, median of {repeats} after "
                        f"{warmup} warm-up; {pair.target.model.dtype}, {torch.get_num_threads()} "
                        f"threads{', int8' if int8 else ''}")
    for col in ("domain", "method", "prompts", "tokens", "decode tok/s", "speed-up", "tok/s e2e",
                "speed-up e2e", "tau", "= plain"):
        table.add_column(col, justify="left" if col in ("domain", "method") else "right")
    for r in rows:
        table.add_row(r.domain, r.method, str(r.prompts), str(r.tokens),
                      f"{r.decode_tokens_per_s:.2f}", f"{r.speedup:.2f}x", f"{r.tokens_per_s:.2f}",
                      f"{r.e2e_speedup:.2f}x", "-" if r.tau != r.tau else f"{r.tau:.2f}",
                      "yes" if r.exact else "[red]no[/]")
    console.print(table)
    if out is not None:
        out.write_text(json.dumps({
            "config": dataclasses.asdict(config), "policy_file": str(policy_file or ""),
            "router": router_name, "dtype": str(pair.target.model.dtype), "int8": int8,
            "threads": torch.get_num_threads(),
            "router_accuracy": [{"router": r.router, "per_domain": r.per_domain,
                                 "accuracy": r.accuracy} for r in reports],
            "rows": [dataclasses.asdict(r) for r in rows],
            "runs": [dataclasses.asdict(r) for r in runs]}, indent=1) + "\n")
        typer.echo(f"wrote {out}")


if __name__ == "__main__":
    app()


# --- export (serving engines) -------------------------------------------------------------------


@command()
def export(
    policy: Path = typer.Argument(..., help="A policy file written by specscope tune (JSON or TOML)."),
    to: str = typer.Option(..., "--to", help="Engine: vllm, sglang, llama.cpp, trtllm or transformers."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the settings here (JSON; default: print them)."),
    draft: Optional[str] = typer.Option(None, "--draft", help="The draft model as the engine loads it (path or hub id); vllm, sglang, trtllm and transformers need it."),
    method: str = typer.Option("draft_model", "--method", help="vLLM speculative method: draft_model (chains), eagle or eagle3 (trees too)."),
) -> None:
    """Each domain's speculation setting in an engine's own format, and the routing rule."""
    import json

    from .export import ExportOptions, export_policy, write_export
    from .tune.policy import PolicyFile

    document = export_policy(PolicyFile.load(policy), to, ExportOptions(draft=draft, method=method),
                             source=str(policy))
    if out is None:
        typer.echo(json.dumps(document, indent=2))
        return
    write_export(document, out)
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
    from .ingest import ingest as ingest_log

    manifest = ingest_log(log, fmt, prompts, out)
    counts = manifest["counts"]
    typer.echo(f"wrote {out}: {counts['requests']} requests ({', '.join(counts['domains'])}), "
               f"{counts['steps_logged'] or 'no'} per-step rows; next: specscope analyze {out}")


# --- llama.cpp --------------------------------------------------------------------------------------


@command()
def llamacpp(
    run_dir: Path = typer.Argument(..., help="A measurement run with node records (specscope run): its top-1 chain acceptance per domain predicts each K."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Directory for the policy, costs, requests and tables (default: RUN_DIR/llamacpp)."),
    target_gguf: Optional[Path] = typer.Option(None, "--target-gguf", help="Target GGUF file (default: the demo pair's target)."),
    draft_gguf: Optional[Path] = typer.Option(None, "--draft-gguf", help="Draft GGUF file (default: the demo pair's draft)."),
    per_domain: int = typer.Option(5, "--per-domain", "-n", help="Held-out prompts per domain (from the run's sources, none of the run's prompts)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="Tokens generated per request."),
    ks: list[int] = typer.Option(list((1, 2, 3, 4)), "--k", help="Chain lengths to time and tune over (repeat the option)."),
    threads: int = typer.Option(2, "--threads", help="llama.cpp threads."),
    n_boot: int = typer.Option(1000, "--n-boot", help="Prompt resamples for the intervals."),
) -> None:
    """llama.cpp end to end: tune K per domain from RUN_DIR and llama.cpp's measured pass costs,
    then time plain, every fixed K and routed decoding side by side on held-out prompts."""
    from .serving import run_llamacpp_study

    study = run_llamacpp_study(run_dir, out or run_dir / "llamacpp", target_gguf, draft_gguf,
                               per_domain, max_new_tokens, tuple(ks), threads, n_boot,
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

    from .doctor import diagnose

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
