"""The ``specscope`` command line: a thin layer over the library."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

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


# --- run (measurement engine) ------------------------------------------------------------------


@app.command()
def run(
    out: Path = typer.Option(Path("runs/demo"), "--out", "-o", help="Run directory to write (or resume)."),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Preset (paper, demo) or TOML file; options below override it."),
    draft: Optional[str] = typer.Option(None, help="Draft model: hub id, local dir, .gguf file, or demo:draft."),
    target: Optional[str] = typer.Option(None, help="Target model: hub id, local dir, .gguf file, or demo:target."),
    dtype: Optional[str] = typer.Option(None, help="bfloat16, float16 or float32."),
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
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete a run with another config in --out and start over."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Measure draft-tree acceptance node by node (the paper protocol) into a run directory."""
    from .domains import PromptSourceError
    from .models import ModelLoadError
    from .records import RunDirError
    from .runner import RunConfigError, load_config, run_study
    from .trees import TreeConfigError

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
        summary = run_study(cfg, out, overwrite=overwrite, progress=not quiet)
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


@app.command()
def domains() -> None:
    """List the prompt domains, their sources, item counts and what works offline now."""
    from rich.console import Console
    from rich.table import Table

    from .domains import list_domains

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


def _print_grids(grids) -> None:
    from rich.console import Console

    from .analysis.render import to_rich

    console = Console()
    for grid in grids:
        console.print(to_rich(grid))
        console.print()


@app.command()
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

    if show not in ("main", "all", "none"):
        fail(f"--show must be main, all or none, not {show!r}")
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


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="One run directory, or several to compare (the first is the reference)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="HTML file (default: RUN_DIR/analysis/report.html, or ./specscope-comparison.html for several runs)."),
    boot: int = _BOOT,
    seed: int = _BOOT_SEED,
    confidence: float = _CONFIDENCE,
    plots: bool = _PLOTS,
    paper: bool = typer.Option(True, "--paper/--no-paper", help="Include the comparison with the paper's published figures."),
) -> None:
    """One self-contained HTML report (tables, plots, findings) of a run or a comparison of runs."""
    from .analysis.plots import plots_unavailable
    from .analysis.report import write_report

    analyses = _analyses(run_dirs, boot, seed, confidence)
    if out is None:
        out = (run_dirs[0] / "analysis" / "report.html" if len(run_dirs) == 1
               else Path("specscope-comparison.html"))
    if plots and plots_unavailable():
        typer.secho(plots_unavailable(), fg=typer.colors.YELLOW, err=True)
    typer.echo(f"wrote {write_report(analyses, out, paper=paper, plots=plots)}")


@app.command()
def compare(
    run_dir: Path = typer.Argument(..., help="A run directory."),
    other: Optional[Path] = typer.Argument(None, help="Another run directory; omitted: the paper's published figures."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Also write the comparison as tables.md, tables.tex and csv/ here."),
    boot: int = _BOOT,
    seed: int = _BOOT_SEED,
    confidence: float = _CONFIDENCE,
) -> None:
    """Side by side: this run's tables and another run's, or the paper's published figures."""
    from .analysis.render import findings_grid
    from .analysis.report import compare as compare_runs
    from .analysis.report import compare_with_paper, write_tables

    analyses = _analyses([run_dir] + ([other] if other else []), boot, seed, confidence)
    if other is None:
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


@app.command()
def certify(
    run_dir: Path = typer.Argument(..., help="A run directory written by `specscope run`."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write CSV tables and plots (PNG+SVG) here."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="With --out: plot certificate vs target margin (needs matplotlib, the plot extra)."),
) -> None:
    """Certificates of acceptance: distributions, certified steps, soundness, tree coverage (SPEC.md 5)."""
    from rich.console import Console
    from rich.table import Table

    from .records import RunDirError, load_run
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
    pub = Table(title="published (SPEC.md 5: Qwen3-1.7B, UltraChat, greedy) vs this run")
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


if __name__ == "__main__":
    app()
