"""`specscope analyze`, `report`, `compare`, `drafters` and `certify`: reading run directories.

Every path argument and option is a local path or a ``file://`` URI (``files.local_location``);
another URI (``s3://``) is refused in one line, never taken for a local directory named ``s3:``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..console import terminal_safe
from ..files import local_location
from . import options
from .app import ANALYZE, command, fail, print_grids

# --- analyze / report / compare ----------------------------------------------------------------


def _settings(n_boot: int, seed: int | None, confidence: float):
    """The analyses' settings the options give (no seed: :data:`options.DEFAULT_SEED`)."""
    from ..analysis import Settings

    seed = options.DEFAULT_SEED if seed is None else seed
    return Settings(n_boot=n_boot, seed=seed, confidence=confidence)


def _analyses(run_dirs: list[Path], settings, stratify: str = "auto", predictors: bool = False):
    from ..analysis import analyze as analyze_run

    return [analyze_run(run_dir, settings, stratify, predictors) for run_dir in run_dirs]


def _expand_sweeps(paths: list[Path]) -> tuple[list[Path], bool]:
    """Sweep directories replaced by their grid points' run directories; whether there was one."""
    if not any((path / "sweep.json").is_file() for path in paths):
        return paths, False
    from ..sweep import expand_run_dirs  # imports torch: only for sweeps

    return expand_run_dirs(paths), True


@command(panel=ANALYZE)
def analyze(
    run_dir: str = typer.Argument(
        ..., help="A run directory written by `specscope run` (a path or a file:// URI)."
    ),
    out: str | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Output folder (default: RUN_DIR/analysis).",
        rich_help_panel=options.OUTPUT,
    ),
    n_boot: int = options.BOOT,
    seed: int | None = options.SEED,
    confidence: float = options.CONFIDENCE,
    plots: bool = options.PLOTS,
    show: str = typer.Option(
        "main",
        "--show",
        metavar=options.one_of(options.SHOWS),
        help="Tables to print: the main ones, all or none.",
        rich_help_panel=options.OUTPUT,
    ),
    stratify: str = typer.Option(
        "auto",
        "--stratify",
        metavar=options.one_of(options.STRATIFY),
        help="Repeat the per-domain tables and findings within each level of a node-level factor: sibling_rank, depth or position_bin; auto (sibling_rank when the trees have more than one) or none.",
        rich_help_panel=options.ANALYSIS,
    ),
    predictors: bool = typer.Option(
        False,
        "--predictors/--no-predictors",
        help="Also score every recorded signal as a predictor of acceptance (AUROC, Brier, calibration error, reliability plot, certificates, stop rules): minutes on a large run.",
        rich_help_panel=options.ANALYSIS,
    ),
) -> None:
    """Decoded tokens per step by domain and where speculation pays first, then the paper's
    findings, its Tables I-VI and the corrected metrics, with intervals; domain's effect at node,
    step and prompt level.

    Writes tables.md, tables.tex, csv/, analysis.json, plots/ and report.html to --out.
    """
    from ..analysis.headline import console_grids
    from ..analysis.report import run_grids, write_outputs
    from ..files import check_output, inside_of
    from ..records import check_writable_dir

    run_dir, out = local_location(run_dir, "RUN_DIR"), local_location(out, "--out")
    if show not in options.SHOWS:
        fail(f"unknown --show {show!r}; allowed: {', '.join(options.SHOWS)}")
    out_dir = check_output(out or run_dir / "analysis")
    inside = inside_of(out_dir, run_dir)  # a downloaded run's links are refused, not followed
    check_writable_dir(out_dir)
    settings = _settings(n_boot, seed, confidence)
    from ..serving.ingest import is_ingested

    if is_ingested(run_dir):  # engine logs: step-level figures only
        from ..analysis.stepwise import analyze_ingested, write_ingested_analysis
        from ..serving.ingest import load_histogram, load_ingested

        manifest, requests, _ = load_ingested(run_dir)
        stepwise = analyze_ingested(
            manifest, requests, n_boot, settings.seed, confidence, histogram=load_histogram(run_dir)
        )
        if show != "none":
            typer.echo(stepwise.to_markdown())
        md, js = write_ingested_analysis(stepwise, out_dir)
        typer.echo(f"wrote {md}, {js}")
        return
    (a,) = _analyses([run_dir], settings, stratify, predictors)
    grids = console_grids(a, run_grids(a), show)  # the first screen, the claims, the tables
    print_grids(grids)
    for warning in a.warnings:
        typer.secho(f"warning: {terminal_safe(warning)}", fg=typer.colors.YELLOW, err=True)
    outputs = write_outputs(a, out_dir, plots=plots, inside=inside)
    if plots and outputs.plot_message:
        typer.secho(outputs.plot_message, fg=typer.colors.YELLOW, err=True)
    typer.echo(
        f"wrote {outputs.markdown}, {outputs.latex}, {outputs.csv_dir}/, {outputs.json}, "
        f"{len(outputs.plots)} plots, {outputs.html}"
    )


@command(panel=ANALYZE)
def report(
    run_dirs: list[str] = typer.Argument(
        ...,
        help="One run directory, or several to compare (the first is the reference); a sweep directory stands for its runs. Paths or file:// URIs.",
    ),
    out: str | None = typer.Option(
        None,
        "--out",
        "-o",
        help="HTML file (default: RUN_DIR/analysis/report.html, SWEEP_DIR/report.html, or ./specscope-comparison.html for several runs).",
        rich_help_panel=options.OUTPUT,
    ),
    n_boot: int = options.BOOT,
    seed: int | None = options.SEED,
    confidence: float = options.CONFIDENCE,
    plots: bool = options.PLOTS,
    paper: bool = typer.Option(
        True,
        "--paper/--no-paper",
        help="Include the comparison with the paper's published figures.",
        rich_help_panel=options.ANALYSIS,
    ),
) -> None:
    """One self-contained HTML report (tables, plots, findings) of a run or a comparison of runs; runs of different drafters also side by side."""
    from ..analysis.plots import plots_unavailable
    from ..analysis.report import write_report
    from ..files import check_output, inside_of
    from ..records import check_writable_file

    run_dirs = [local_location(path, "RUN_DIRS") for path in run_dirs]
    out = local_location(out, "--out")
    expanded, has_sweep = _expand_sweeps(run_dirs)
    if out is None:
        out = (
            run_dirs[0] / "report.html"
            if has_sweep and len(run_dirs) == 1
            else run_dirs[0] / "analysis" / "report.html"
            if len(expanded) == 1
            else Path("specscope-comparison.html")
        )
    check_writable_file(out, (".html", ".htm"))
    check_output(out, tuple(run_dirs))
    inside = inside_of(out, run_dirs[0])
    settings = _settings(n_boot, seed, confidence)
    analyses = _analyses(expanded, settings)
    drafters = _drafters_if_they_differ(expanded, settings)
    if plots and plots_unavailable():
        typer.secho(plots_unavailable(), fg=typer.colors.YELLOW, err=True)
    path = write_report(analyses, out, paper=paper, plots=plots, inside=inside, drafters=drafters)
    typer.echo(f"wrote {path}")


RUN_DIRS_TO_COMPARE = typer.Argument(
    ...,
    help="A run directory (against the paper's published figures), two runs, or a sweep "
    "directory (one row per grid point); with --by-drafter, runs of one drafter each on the same "
    "prompts and target, or a sweep over drafters (every claim names the earlier run's drafter "
    "first). Paths or file:// URIs.",
)
COMPARE_OUT = typer.Option(
    None,
    "--out",
    "-o",
    help="Also write the comparison as tables.md, tables.tex and csv/ here (--by-drafter: also "
    "drafters.json and plots/).",
    rich_help_panel=options.OUTPUT,
)


@command(panel=ANALYZE)
def compare(
    run_dirs: list[str] = RUN_DIRS_TO_COMPARE,
    out: str | None = COMPARE_OUT,
    n_boot: int = options.BOOT,
    seed: int | None = options.SEED,
    confidence: float = options.CONFIDENCE,
    plots: bool = options.PLOTS,
    by_drafter: bool = typer.Option(
        False,
        "--by-drafter",
        help="Drafters side by side on the same prompts: tau, proposals and greedy acceptance by "
        "depth per domain, and whether one accepts more than another (paired by prompt).",
        rich_help_panel=options.ANALYSIS,
    ),
    shapes: bool = typer.Option(
        False,
        "--shapes",
        help="Each domain finding in every tree shape the runs hold (each run's measured tree and "
        "the top-1 chain within it), and the verdicts and domain orderings that change between "
        "shapes.",
        rich_help_panel=options.ANALYSIS,
    ),
) -> None:
    """Side by side: this run's tables and another run's, the paper's figures, a sweep's runs, or
    (--by-drafter) several drafters' runs on the same prompts."""
    if by_drafter:
        _compare_drafters(run_dirs, out, _settings(n_boot, seed, confidence), plots)
        return
    if len(run_dirs) > 2:
        fail(
            f"compare takes one run or two, got {len(run_dirs)}; several drafters' runs: "
            "--by-drafter; a grid of runs: their sweep directory"
        )
    _compare_runs(run_dirs, out, _settings(n_boot, seed, confidence), shapes)


def _shape_grids(run_dirs: list[Path], settings) -> list:
    """The findings across the tree shapes of these runs (:mod:`specscope.analysis.shapes`)."""
    from ..analysis.level_grids import shape_changes_grid, shape_figures_grid, shape_verdicts_grid
    from ..analysis.prepare import prepare, read_run
    from ..analysis.shapes import compare_shapes

    runs = [(path.name, prepare(read_run(path))) for path in run_dirs]
    c = compare_shapes(runs, settings)
    return [shape_figures_grid(c), shape_verdicts_grid(c), shape_changes_grid(c)]


def _compare_runs(run_dirs: list[str], out: str | None, settings, shapes: bool = False) -> None:
    """One run against the paper, two runs, or a sweep's runs: the tables printed (and written)."""
    from ..analysis.render import drafter_grids, findings_grid
    from ..analysis.report import compare as compare_runs
    from ..analysis.report import compare_with_paper, summary_grid, write_tables
    from ..files import check_output, inside_of
    from ..records import check_writable_dir

    run_dir, *others = (local_location(path, "RUN_DIRS") for path in run_dirs)
    other = others[0] if others else None
    out = local_location(out, "--out")
    if out is not None:
        check_output(out)
        check_writable_dir(out)
    expanded, has_sweep = _expand_sweeps([run_dir, *others])
    analyses = _analyses(expanded, settings)
    if has_sweep:
        grids = [summary_grid(analyses)]
        title = f"{len(analyses)} runs of {', '.join(str(p) for p in (run_dir, other) if p)}"
    elif other is None:
        grids = [findings_grid(analyses[0].findings, compact=True)] + compare_with_paper(
            analyses[0]
        )
        title = f"{analyses[0].info.run_id} vs the paper"
    else:
        grids = compare_runs(*analyses)
        if drafters := _drafters_if_they_differ(expanded, settings):
            grids += drafter_grids(drafters)
        title = f"{analyses[0].info.run_id} vs {analyses[1].info.run_id}"
    if shapes:
        grids += _shape_grids(expanded, settings)
    print_grids(grids)
    if out is not None:
        md, tex, csv_dir = write_tables(
            grids, out, f"specscope comparison: {title}", inside_of(out, run_dir)
        )
        typer.echo(f"wrote {md}, {tex}, {csv_dir}/")


def _drafters_if_they_differ(run_dirs: list[Path], settings):
    """The drafter comparison of runs whose drafters differ; None when they are one drafter's,
    or (with a warning) when they are not the same prompts."""
    from ..analysis.drafters import DrafterComparisonError, compare_drafters, run_drafter
    from ..analysis.prepare import read_run

    runs = [read_run(path) for path in run_dirs]
    if len({run_drafter(run) for run in runs}) < 2:
        return None
    try:
        return compare_drafters(runs, settings)
    except DrafterComparisonError as e:
        typer.secho(f"warning: drafters not compared: {e}", fg=typer.colors.YELLOW, err=True)
        return None


@command(panel=ANALYZE, hidden=True)
def drafters(
    run_dirs: list[str] = RUN_DIRS_TO_COMPARE,
    out: str | None = COMPARE_OUT,
    n_boot: int = options.BOOT,
    seed: int | None = options.SEED,
    confidence: float = options.CONFIDENCE,
    plots: bool = options.PLOTS,
) -> None:
    """Now `specscope compare --by-drafter`: drafters side by side on the same prompts."""
    typer.echo("note: specscope drafters is now specscope compare --by-drafter", err=True)
    _compare_drafters(run_dirs, out, _settings(n_boot, seed, confidence), plots)


def _compare_drafters(run_dirs: list[str], out: str | None, settings, plots: bool) -> None:
    """Drafters side by side: the tables printed, warnings on stderr, outputs written to ``out``."""
    from ..analysis.drafters import compare_drafters
    from ..analysis.render import drafter_grids
    from ..analysis.report import write_drafter_outputs
    from ..files import check_output, inside_of
    from ..records import check_writable_dir

    run_dirs, _ = _expand_sweeps([local_location(path, "RUN_DIRS") for path in run_dirs])
    out = local_location(out, "--out")
    inside = None
    if out is not None:
        check_output(out, tuple(run_dirs))
        # a downloaded run's links are refused, not followed
        inside = next(filter(None, (inside_of(out, run_dir) for run_dir in run_dirs)), None)
        check_writable_dir(out)
    comparison = compare_drafters(run_dirs, settings)
    print_grids(drafter_grids(comparison))
    for warning in comparison.warnings:
        typer.secho(f"warning: {terminal_safe(warning)}", fg=typer.colors.YELLOW, err=True)
    if out is not None:
        written = write_drafter_outputs(comparison, out, plots, inside)
        if plots and written.plot_message:
            typer.secho(written.plot_message, fg=typer.colors.YELLOW, err=True)
        typer.echo(
            f"wrote {written.markdown}, {written.latex}, {written.csv_dir}/, {written.json}, "
            f"{len(written.plots)} plots"
        )


# --- certify ----------------------------------------------------------------------------------


@command(panel=ANALYZE)
def certify(
    run_dir: str = typer.Argument(
        ..., help="A run directory written by `specscope run` (a path or a file:// URI)."
    ),
    out: str | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Write CSV and Markdown tables and plots (PNG+SVG) here.",
        rich_help_panel=options.OUTPUT,
    ),
    plots: bool = options.PLOTS,
    margin_bins: str | None = typer.Option(
        None,
        "--margin-bins",
        help="Edges of the target-margin bins, comma-separated, increasing, in [0, 1] [default: 0,0.1,0.25,0.5,0.75,0.9,1]. Given explicitly, a run without margins is an error.",
        rich_help_panel=options.ANALYSIS,
    ),
    n_boot: int = options.BOOT,
    seed: int | None = options.SEED,
    confidence: float = options.CONFIDENCE,
) -> None:
    """Certificates of acceptance: distributions, certified steps, soundness, tree coverage, and certified fraction by target-margin bin (docs/theory.md)."""
    from ..analysis.certify import (
        DEFAULT_MARGIN_BINS,
        certify_grids,
        certify_run,
        parse_margin_bins,
        write_certify_outputs,
    )
    from ..console import make_console
    from ..files import check_output, inside_of
    from ..records import check_writable_dir, load_run

    run_dir, out = local_location(run_dir, "RUN_DIR"), local_location(out, "--out")
    edges = DEFAULT_MARGIN_BINS if margin_bins is None else parse_margin_bins(margin_bins)
    inside = None
    if out is not None:
        check_output(out)
        inside = inside_of(out, run_dir)  # a downloaded run's links are refused, not followed
        check_writable_dir(out)
    report = certify_run(
        load_run(run_dir),
        edges,
        n_boot=n_boot,
        seed=options.DEFAULT_SEED if seed is None else seed,
        confidence=confidence,
        require_margins=margin_bins is not None,
    )
    print_grids(certify_grids(report, confidence), blank=False)
    console = make_console()
    for note in report.notes:
        console.print(f"note: {terminal_safe(note)}", markup=False, highlight=False)
    if out is not None:
        try:
            written = write_certify_outputs(report, out, plots, inside)
        except ImportError as e:  # the plot extra (MissingExtraError)
            fail(f"{e} (or pass --no-plots)")
        if written.margins:
            console.print(f"wrote {', '.join(str(p) for p in written.margins)}")
        for path in written.plots:
            console.print(f"wrote {path}")
    if report.violations:
        console.print(
            f"[red]soundness violated on {report.violations} step(s): KL < C but rejected[/]"
        )
        raise typer.Exit(1)
    console.print("soundness: 0 steps certified but rejected")
