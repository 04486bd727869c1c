"""Output files, comparisons, and the self-contained HTML report.

``write_outputs`` turns one analysis into a folder::

    tables.md  tables.tex  csv/<table>.csv  analysis.json  plots/<plot>.png|svg  report.html

The HTML report needs no network: styles are inline, plots are embedded as base64 PNG, and every
piece of text that comes from records (prompt text, outputs, domain names, the manifest) is
escaped with ``html.escape``.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import html
import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..files import json_text, write_output
from .drafters import DrafterComparison
from .paper import PAPER, load_paper_tables, paper_data
from .plots import Plot, plots_unavailable, write_drafter_plots, write_plots
from .prepare import ALL
from .render import (
    Column,
    Grid,
    analysis_grids,
    drafter_grids,
    findings_grid,
    markdown_escape,
    to_csv,
    to_html,
    to_latex,
    to_markdown,
)
from .results import Analysis, PaperTables
from .stats import EMPTY, Estimate

# --- JSON ------------------------------------------------------------------------------------------


def to_jsonable(obj):
    """Dataclasses, tuples, enums and paths as JSON values; NaN and inf become null."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # numpy scalars
        return to_jsonable(obj.item())
    return obj


# --- comparisons -----------------------------------------------------------------------------------

Key = tuple[str, str, str]  # (table, domain, quantity)
TABLE_NAMES = {
    "table1": "I",
    "table2": "II",
    "table3": "III",
    "table4": "IV",
    "table5": "V",
    "table6": "VI",
}


def flatten_tables(pt: PaperTables, prefix: str = "") -> dict[Key, Estimate | int]:
    """Every figure of Tables I-VI keyed by (table, domain, quantity)."""
    out: dict[Key, Estimate | int] = {}
    t = {k: prefix + "Table " + v for k, v in TABLE_NAMES.items()}
    for r in pt.table1:
        out[(t["table1"], r.domain, "nodes")] = r.nodes
        out[(t["table1"], r.domain, "mean")] = r.mean
        out[(t["table1"], r.domain, "std")] = r.std
        out[(t["table1"], r.domain, "mean H")] = r.target_entropy
    for r in pt.table2:
        out[(t["table2"], r.domain, "E[L]")] = r.expected_length
    for r in pt.table3:
        for d, e in zip(pt.depths, r.by_depth):
            out[(t["table3"], r.domain, f"d={d}")] = e
    for r in pt.table4:
        for d, e in zip(pt.depths, r.by_depth):
            out[(t["table4"], r.domain, f"depth {d}")] = e
        out[(t["table4"], r.domain, "Δ")] = r.delta
    for r in pt.table5:
        for b, e in zip(pt.bins, r.by_bin):
            out[(t["table5"], r.domain, f"depth {r.depth}, bin {b}")] = e
        out[(t["table5"], r.domain, f"depth {r.depth}, Δ")] = r.delta
    for r in pt.table6:
        out[(t["table6"], r.domain, "Spearman ρ")] = r.spearman
        if r.pearson.defined or pt.source != PAPER:
            out[(t["table6"], r.domain, "Pearson r")] = r.pearson
    return out


def flatten_analysis(a: Analysis) -> dict[Key, Estimate | int]:
    out = flatten_tables(a.paper)
    for r in a.tau:
        out[("tau", r.domain, "mean tau")] = r.tau
        out[("tau", r.domain, "top-1 chain tau")] = r.chain_tau
    for c in a.acceptance_vector.cells:
        out[("acceptance vector", c.domain, f"depth {c.depth} rank {c.rank} | parent")] = (
            c.conditional
        )
    out.update(flatten_tables(a.greedy, prefix="greedy "))
    for r in a.effects.rows:
        out[("effects", "All", f"η² {r.factor} (alpha)")] = r.alpha
    return out


def _ci_check(a: Estimate | int, b: Estimate | int) -> str:
    if not (isinstance(a, Estimate) and isinstance(b, Estimate)) or not (a.defined and b.defined):
        return EMPTY
    if a.has_interval and b.has_interval:
        return "overlap" if a.lo <= b.hi and b.lo <= a.hi else "disjoint"
    if a.has_interval:
        return "inside" if a.contains(b.value) else "outside"
    if b.has_interval:
        return "inside" if b.contains(a.value) else "outside"
    return EMPTY


def _delta(a: Estimate | int | None, b: Estimate | int | None):
    if isinstance(a, int) and isinstance(b, int):
        return b - a
    if isinstance(a, Estimate) and isinstance(b, Estimate) and a.defined and b.defined:
        return b.value - a.value
    return None


def compare_flat(
    a: dict, b: dict, label_a: str, label_b: str, key_prefix: str, only_common: bool
) -> list[Grid]:
    """Side-by-side grids, one per table, of two flattened result sets."""
    keys = [k for k in a if k in b] if only_common else list(dict.fromkeys([*a, *b]))
    tables = list(dict.fromkeys(k[0] for k in keys))
    grids = []
    for table in tables:
        rows = tuple(
            (
                k[1],
                k[2],
                a.get(k),
                b.get(k),
                _delta(a.get(k), b.get(k)),
                _ci_check(a.get(k), b.get(k)),
            )
            for k in keys
            if k[0] == table
        )
        slug = table.lower().replace(" ", "_").replace("[", "").replace("]", "")
        grids.append(
            Grid(
                f"{key_prefix}{slug}",
                f"{table}: {label_a} vs {label_b}",
                (
                    Column("Domain"),
                    Column("Quantity"),
                    Column(label_a),
                    Column(label_b),
                    Column(f"{label_b} − {label_a}", signed=True),
                    Column("CI check"),
                ),
                rows,
                "CI check: whether the intervals overlap (two runs), or whether the "
                "figure without an interval lies inside the other's interval.",
            )
        )
    return grids


def compare_with_paper(a: Analysis) -> list[Grid]:
    """This run's Tables I-VI beside the paper's published figures."""
    return compare_flat(
        flatten_tables(load_paper_tables()),
        flatten_tables(a.paper),
        "paper",
        a.info.run_id,
        "paper_vs_",
        only_common=True,
    )


def _run_label(a: Analysis, taken: set[str]) -> str:
    label = a.info.run_id
    while label in taken:
        label += "'"
    return label


def compare(a: Analysis, b: Analysis) -> list[Grid]:
    """Two runs side by side: findings, then every table and metric."""
    la = _run_label(a, set())
    lb = _run_label(b, {la})
    by_key = {f.key: f for f in b.findings}
    findings = Grid(
        "compare_findings",
        f"Findings: {la} vs {lb}",
        (
            Column("Claim"),
            Column(f"{la}: figure"),
            Column(f"{la}: verdict"),
            Column(f"{lb}: figure"),
            Column(f"{lb}: verdict"),
        ),
        tuple(
            (
                f.label,
                f.estimate,
                f.verdict.value,
                by_key[f.key].estimate if f.key in by_key else None,
                by_key[f.key].verdict.value if f.key in by_key else None,
            )
            for f in a.findings
        ),
    )
    return [findings] + compare_flat(
        flatten_analysis(a), flatten_analysis(b), la, lb, "compare_", only_common=False
    )


def summary_grid(analyses: list[Analysis]) -> Grid:
    """One row per run (per grid point of a sweep): its sweep axes and headline figures, pooled."""
    axes = list(
        dict.fromkeys(k for a in analyses for k in a.info.manifest.get("sweep", {}).get("axes", {}))
    )

    def pooled(rows):
        return next((r for r in rows if r.domain == ALL), None)

    rows = []
    for a in analyses:
        tau, t1, g1 = pooled(a.tau), pooled(a.paper.table1), pooled(a.greedy.table1)
        point = a.info.manifest.get("sweep", {}).get("axes", {})
        label = () if axes else (Path(a.info.path).name,)
        rows.append(
            (
                *label,
                *(point.get(k) for k in axes),
                a.info.run_id,
                ", ".join(a.info.domains),
                a.info.prompts,
                a.info.nodes,
                tau.tau if tau else None,
                tau.chain_tau if tau else None,
                tau.paper_expected_length if tau else None,
                t1.mean if t1 else None,
                g1.mean if g1 else None,
            )
        )
    return Grid(
        "summary",
        "Runs side by side (pooled over domains)",
        (
            *(() if axes else (Column("Run"),)),
            *(Column(k) for k in axes),
            Column("Run id"),
            Column("Domains"),
            Column("Prompts"),
            Column("Nodes"),
            Column("mean tau"),
            Column("top-1 chain tau"),
            Column("paper E[L]"),
            Column("mean alpha"),
            Column("greedy accept"),
        ),
        tuple(rows),
        "One row per run (per grid point of a sweep). mean tau: tokens per target pass, "
        "bonus token counted; paper E[L]: the paper's proxy (Table II); mean alpha and "
        "greedy accept: over all nodes (Table I).",
    )


# --- files -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outputs:
    out_dir: Path
    markdown: Path
    latex: Path
    csv_dir: Path
    json: Path
    html: Path
    plots: tuple[Plot, ...]
    plot_message: str | None


# Every file below goes through files.write_output: written whole, never through a link planted at
# it; ``inside`` (the run directory an output folder lies in) also refuses links in the folders.


def write_tables(
    grids: list[Grid], out_dir: Path, title: str, inside: Path | None = None
) -> tuple[Path, Path, Path]:
    """tables.md, tables.tex and csv/<key>.csv for a list of grids."""
    out_dir = Path(out_dir)
    md = write_output(
        out_dir / "tables.md",
        f"# {markdown_escape(title)}\n\n" + "\n".join(to_markdown(g) for g in grids),
        inside,
    )
    tex = write_output(
        out_dir / "tables.tex",
        f"% {title}\n% generated by specscope; needs \\usepackage{{booktabs}}\n\n"
        + "\n".join(to_latex(g) for g in grids),
        inside,
    )
    csv_dir = out_dir / "csv"
    for g in grids:
        write_output(csv_dir / f"{g.key}.csv", to_csv(g), inside)
    return md, tex, csv_dir


def write_outputs(
    a: Analysis, out_dir: str | Path, plots: bool = True, inside: Path | None = None
) -> Outputs:
    """Every output of one analysis into ``out_dir`` (created); returns the paths written."""
    out_dir = Path(out_dir)
    grids = analysis_grids(a) + compare_with_paper(a)
    md, tex, csv_dir = write_tables(
        grids, out_dir, f"specscope analysis of {a.info.run_id}", inside
    )
    js = write_output(out_dir / "analysis.json", json_text(to_jsonable(a), indent=1), inside)
    message = None
    drawn: list[Plot] = []
    if plots:
        message = plots_unavailable()
        drawn = write_plots(a, out_dir / "plots", inside)
    else:
        message = "plots not requested"
    page = write_output(
        out_dir / "report.html", html_report([a], {0: drawn}, plot_message=message), inside
    )
    return Outputs(out_dir, md, tex, csv_dir, js, page, tuple(drawn), message)


def write_report(
    analyses: list[Analysis],
    out_path: str | Path,
    paper: bool = True,
    plots: bool = True,
    inside: Path | None = None,
    drafters: DrafterComparison | None = None,
) -> Path:
    """One self-contained HTML report of one run, or a comparison of several (with ``drafters``,
    the runs' drafters side by side)."""
    message = plots_unavailable() if plots else "plots not requested"
    with tempfile.TemporaryDirectory() as tmp:
        drawn = {
            i: write_plots(a, Path(tmp) / str(i)) if plots else [] for i, a in enumerate(analyses)
        }
        drafter_plots = []
        if drafters is not None and plots:
            drafter_plots = write_drafter_plots(drafters, Path(tmp) / "drafters")
        page = html_report(
            analyses,
            drawn,
            paper=paper,
            plot_message=message,
            drafters=drafters,
            drafter_plots=drafter_plots,
        )
    return write_output(out_path, page, inside)


@dataclass(frozen=True)
class DrafterOutputs:
    out_dir: Path
    markdown: Path
    latex: Path
    csv_dir: Path
    json: Path
    plots: tuple[Plot, ...]
    plot_message: str | None


def write_drafter_outputs(
    c: DrafterComparison, out_dir: str | Path, plots: bool = True, inside: Path | None = None
) -> DrafterOutputs:
    """A drafter comparison into ``out_dir``: tables.md, tables.tex, csv/, drafters.json and
    plots/drafter_tau.png|svg."""
    out_dir = Path(out_dir)
    md, tex, csv_dir = write_tables(
        drafter_grids(c), out_dir, f"specscope drafters: {', '.join(c.drafters)}", inside
    )
    js = write_output(out_dir / "drafters.json", json_text(to_jsonable(c), indent=1), inside)
    message = plots_unavailable() if plots else "plots not requested"
    drawn = write_drafter_plots(c, out_dir / "plots", inside) if plots else []
    return DrafterOutputs(out_dir, md, tex, csv_dir, js, tuple(drawn), message)


# --- HTML ------------------------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1400px; padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 2px solid #444; margin-top: 2em; }
h3 { margin-top: 1.6em; }
.grid { overflow-x: auto; margin: 1em 0; }
table { border-collapse: collapse; font-size: 0.85em; }
caption { text-align: left; font-weight: 600; padding: 0.3em 0; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.6em; vertical-align: top; }
th { background: #f2f2f2; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.text { min-width: 8ch; max-width: 48ch; }
.ci { color: #777; font-size: 0.85em; }
.note { color: #555; font-size: 0.8em; max-width: 100ch; }
.v-holds { color: #1a7f37; font-weight: 600; } .v-fails { color: #c62828; font-weight: 600; }
.v-inconclusive { color: #8a6d00; } .v-untestable { color: #777; }
.warn { background: #fff4e0; border-left: 4px solid #e69500; padding: 0.4em 0.8em; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.8em; }
nav ul { columns: 3; font-size: 0.9em; }
.prompt { white-space: pre-wrap; max-width: 70ch; font-family: ui-monospace, monospace;
          font-size: 0.85em; }
"""


def _img(plot: Plot) -> str:
    data = base64.b64encode(plot.png.read_bytes()).decode("ascii")
    return (
        f'<figure id="plot-{html.escape(plot.name)}"><img alt="{html.escape(plot.title)}" '
        f'src="data:image/png;base64,{data}"><figcaption>{html.escape(plot.title)} '
        f"(SVG written beside the PNG)</figcaption></figure>"
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " …"


def _prompts_html(a: Analysis, limit: int = 400) -> str:
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(p.prompt_id)}</td><td>{esc(p.domain)}</td><td>{esc(p.source)}</td>"
        f'<td class="num">{p.steps}</td><td class="num">'
        f"{EMPTY if not math.isfinite(p.mean_tau) else f'{p.mean_tau:.2f}'}</td>"
        f'<td><div class="prompt">{esc(_clip(p.prompt_text, limit))}</div></td>'
        f'<td><div class="prompt">{esc(_clip(p.output_text, limit))}</div></td></tr>'
        for p in a.prompts
    )
    return (
        f"<details><summary>{len(a.prompts)} prompts (text clipped to {limit} characters)"
        f'</summary><div class="grid"><table><thead><tr><th>Prompt</th><th>Domain</th>'
        f"<th>Source</th><th>Steps</th><th>mean tau</th><th>Prompt text</th><th>Output</th>"
        f"</tr></thead><tbody>{rows}</tbody></table></div></details>"
    )


def _run_section(
    i: int, a: Analysis, plots: list[Plot], paper: bool, plot_message: str | None
) -> str:
    esc = html.escape
    pre = f"r{i}-"
    s = a.settings
    info = Grid(
        "info",
        "Run",
        (Column("Field"), Column("Value")),
        (
            ("run id", a.info.run_id),
            ("path", a.info.path),
            ("status", a.info.status),
            ("prompts", a.info.prompts),
            ("steps", a.info.steps),
            ("nodes", a.info.nodes),
            ("domains", ", ".join(a.info.domains)),
            ("max depth", a.info.max_depth),
            (
                "bootstrap",
                (
                    f"{s.n_boot} prompt-clustered resamples (stratified by domain), seed "
                    f"{s.seed}, {s.confidence:.0%} percentile intervals"
                ),
            ),
        ),
    )
    parts = [f'<section id="run-{i}"><h2>Run {esc(a.info.run_id)}</h2>', to_html(info, pre)]
    parts += [f'<p class="warn">{esc(w)}</p>' for w in a.warnings]
    grids = analysis_grids(a)
    heads = {
        "findings": "Findings",
        "table1": "The paper's tables (alpha)",
        "tau": "Corrected metrics",
        "greedy_table1": "The paper's tables with greedy_accept",
        "variance": "What drives acceptance",
        "stratified_rho": "Stratified tables",
        "entropy_profile": "Profiles",
        "echo": "Prompt echo",
    }
    folded = {"findings_figures", "stratified_findings"}  # long listings: one click away
    for g in grids:
        if g.key in heads:
            parts.append(f"<h3>{esc(heads[g.key])}</h3>")
        if g.key in folded:
            parts.append(f"<details><summary>{esc(g.title)}</summary>{to_html(g, pre)}</details>")
        else:
            parts.append(to_html(g, pre))
    parts.append(f'<h3 id="{pre}plots">Plots</h3>')
    if plots:
        parts += [_img(p) for p in plots]
    else:
        parts.append(f'<p class="warn">{esc(plot_message or "no plots")}</p>')
    if paper:
        parts.append("<h3>Compared with the paper's published figures</h3>")
        parts.append(
            f'<p class="note">{esc(paper_data()["source"])}; draft '
            f"{esc(paper_data()['draft'])}, target {esc(paper_data()['target'])}.</p>"
        )
        parts += [to_html(g, pre) for g in compare_with_paper(a)]
    parts.append("<h3>Prompts</h3>")
    parts.append(_prompts_html(a))
    parts.append("<h3>Provenance (manifest)</h3>")
    parts.append(f"<pre>{esc(json.dumps(to_jsonable(a.info.manifest), indent=2))}</pre>")
    parts.append("</section>")
    return "\n".join(parts)


def html_report(
    analyses: list[Analysis],
    plots: dict[int, list[Plot]],
    paper: bool = True,
    plot_message: str | None = None,
    drafters: DrafterComparison | None = None,
    drafter_plots: Sequence[Plot] = (),
) -> str:
    """The HTML text of a report of one or more runs (the first is the reference); ``drafters``
    adds their drafters side by side to the comparison."""
    esc = html.escape
    names = ", ".join(a.info.run_id for a in analyses)
    title = f"specscope report: {names}" if len(analyses) == 1 else f"specscope comparison: {names}"
    toc = ["<nav><ul>"]
    for i, a in enumerate(analyses):
        toc.append(f'<li><a href="#run-{i}">Run {esc(a.info.run_id)}</a></li>')
    body = []
    if len(analyses) > 1:
        toc.append('<li><a href="#comparison">Comparison</a></li>')
        comp = [
            '<section id="comparison"><h2>Comparison</h2>',
            to_html(summary_grid(analyses), "c0-"),
        ]
        ref = analyses[0]
        for j, other in enumerate(analyses[1:], start=1):
            comp.append(f"<h3>{esc(ref.info.run_id)} vs {esc(other.info.run_id)}</h3>")
            comp += [to_html(g, f"c{j}-") for g in compare(ref, other)]
        if drafters is not None:
            comp.append("<h3>Drafters side by side</h3>")
            comp += [to_html(g, "d-") for g in drafter_grids(drafters)]
            comp += [_img(p) for p in drafter_plots]
        comp.append("</section>")
        body.append("\n".join(comp))
    toc.append("</ul></nav>")
    body = [
        _run_section(i, a, plots.get(i, []), paper, plot_message) for i, a in enumerate(analyses)
    ] + body
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{esc(title)}</h1>{''.join(toc)}\n"
        + "\n".join(body)
        + f'<footer><p class="note">Generated by specscope {esc(__version__)} on {stamp}. '
        f"Self-contained: no network needed.</p></footer></body></html>\n"
    )


__all__ = [
    "DrafterOutputs",
    "Outputs",
    "compare",
    "compare_flat",
    "compare_with_paper",
    "findings_grid",
    "flatten_analysis",
    "flatten_tables",
    "html_report",
    "summary_grid",
    "to_jsonable",
    "write_outputs",
    "write_report",
    "write_drafter_outputs",
    "write_tables",
]
