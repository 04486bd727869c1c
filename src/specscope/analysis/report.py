"""Output files, comparisons, and the self-contained HTML report.

``write_outputs`` turns one analysis into a folder::

    tables.md  tables.tex  csv/<table>.csv  analysis.json  plots/<plot>.png|svg  report.html

The HTML report shows before it tells. Each run opens with its first screen: the paper's claims as a
forest plot (each figure a verdict uses, with its interval, in the verdict's colour) beside tokens
per step by domain, then one line per claim in words. One part per kind of result follows
(:data:`RUN_SECTIONS`: its plots shown, its tables folded in a ``<details>``), then the comparison
with the paper, the prompts and the run's information, folded. The report draws no conclusions of
its own: figures and verdicts come from the analysis.

The HTML report needs no network: styles are inline, plots are embedded as base64 PNG, and every
piece of text that comes from records (prompt text, outputs, domain names, the manifest) is
escaped with ``html.escape``.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..files import json_text, to_jsonable, write_output
from .delivered import delivered_grids, delivered_plots
from .drafters import DrafterComparison
from .findings import Finding, Verdict
from .headline import pair_title, portable, run_subtitle
from .paper import PAPER, load_paper_tables, paper_data
from .plots import FIRST_SCREEN, Plot, plots_unavailable, write_drafter_plots, write_plots
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
    verdict_css_class,
)
from .results import Analysis, PaperTables
from .stats import EMPTY, Estimate

# --- JSON ------------------------------------------------------------------------------------------


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


def run_grids(a: Analysis) -> list[Grid]:
    """Every table of one run's analysis: its node-level tables, then what it delivers when
    decoded (:func:`~specscope.analysis.delivered.delivered_grids`)."""
    return analysis_grids(a) + delivered_grids(a)


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
    a = portable(a)  # no absolute path of this machine in the files
    grids = run_grids(a) + compare_with_paper(a)
    md, tex, csv_dir = write_tables(
        grids, out_dir, f"specscope analysis of {a.info.run_id}", inside
    )
    js = write_output(out_dir / "analysis.json", json_text(a, indent=1), inside)
    message = None
    drawn: list[Plot] = []
    if plots:
        message = plots_unavailable()
        drawn = write_plots(a, out_dir / "plots", inside)
        drawn += delivered_plots(a, out_dir / "plots", inside)
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
    analyses = [portable(a) for a in analyses]  # no absolute path of this machine in the page
    with tempfile.TemporaryDirectory() as tmp:
        drawn = {
            i: write_plots(a, Path(tmp) / str(i)) + delivered_plots(a, Path(tmp) / str(i))
            if plots
            else []
            for i, a in enumerate(analyses)
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
    js = write_output(out_dir / "drafters.json", json_text(c, indent=1), inside)
    message = plots_unavailable() if plots else "plots not requested"
    drawn = write_drafter_plots(c, out_dir / "plots", inside) if plots else []
    return DrafterOutputs(out_dir, md, tex, csv_dir, js, tuple(drawn), message)


# --- HTML ------------------------------------------------------------------------------------------
# A run's page shows before it tells: first the claims as a forest plot and tokens per step by domain
# (the first screen), one line per claim in words; then one part per kind of result, its plots shown
# and its tables folded in a <details>; the run's information last, folded.

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0.6em auto;
       max-width: 1400px; padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.3em; margin: 0.2em 0 0.1em; }
p.subtitle { color: #444; margin: 0 0 0.6em; font-size: 0.95em; }
h2 { font-size: 1.2em; border-bottom: 2px solid #444; margin: 1.6em 0 0.4em; }
section.run > h2 { margin-top: 0.3em; }
h3 { margin: 1.6em 0 0.4em; }
.overview { display: grid; grid-template-columns: minmax(0, 2fr) minmax(0, 1fr); gap: 1em;
            align-items: start; }
.overview figure { margin: 0; }
.overview img { max-width: 100%; max-height: 640px; width: auto; height: auto; }
@media (max-width: 900px) { .overview { grid-template-columns: minmax(0, 1fr); } }
ul.claims { font-size: 0.9em; padding-left: 1.2em; margin: 0.6em 0; }
details { margin: 0.6em 0; } summary { cursor: pointer; color: #333; font-size: 0.9em; }
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
.v-inconclusive { color: #444; } .v-untestable { color: #777; }
.v-holds::before { content: "✓ "; } .v-fails::before { content: "✗ "; }
.v-inconclusive::before { content: "? "; } .v-untestable::before { content: "– "; }
.warn { background: #fff4e0; border-left: 4px solid #e69500; padding: 0.4em 0.8em; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.8em; }
nav ul { columns: 3; font-size: 0.9em; margin: 0.3em 0; }
.prompt { white-space: pre-wrap; max-width: 70ch; font-family: ui-monospace, monospace;
          font-size: 0.85em; }
"""


@dataclass(frozen=True)
class Section:
    """One kind of result in a run's report: the plots shown under its heading and the tables
    (grid keys of :func:`~specscope.analysis.render.analysis_grids`) folded beneath them."""

    key: str
    title: str
    plots: tuple[str, ...] = ()
    grids: tuple[str, ...] = ()


CLAIM_GRIDS = ("findings", "findings_figures", "stratified_findings")  # folded under the claims

# The parts that follow the first screen, in order: plotted results first, then the tables alone.
# A grid that no section names is still shown, in "Other tables".
RUN_SECTIONS: tuple[Section, ...] = (
    Section(
        "tokens",
        "Tokens per target pass",
        ("tau_distribution",),
        ("decoded_tokens_per_step", "tau", "tau_distribution"),
    ),
    Section(
        "levels",
        "What domain explains, at node, step and prompt level",
        (),
        ("level_shares", "domain_effect", "level_findings"),
    ),
    Section(
        "predictors",
        "What predicts acceptance: the scorecard",
        ("reliability", "budgets"),
        tuple(
            f"scorecard_{t}{s}"
            for t in ("node", "rank0", "edge", "prefix")
            for s in ("", "_auroc_by_domain")
        )
        + ("scorecard_certificates", "scorecard_stop_rules", "budget_verdicts", "budgets"),
    ),
    Section(
        "depth",
        "Acceptance by depth",
        ("acceptance_by_depth",),
        ("table1", "table2", "table3", "table4", "depth_profile"),
    ),
    Section("vector", "Acceptance vector", ("acceptance_vector",), ("acceptance_vector",)),
    Section(
        "entropy",
        "Acceptance and target entropy",
        ("acceptance_vs_entropy",),
        ("table6", "entropy_profile", "paradox"),
    ),
    Section(
        "position",
        "Acceptance by position in the generation",
        ("acceptance_by_position",),
        ("table5", "position_profile"),
    ),
    Section(
        "drivers",
        "What drives acceptance",
        ("variance_decomposition",),
        ("effects", "variance", "stratified_rho", "stratified_alpha", "stratified_depth"),
    ),
    Section("echo", "Prompt echo", (), ("echo",)),
    Section(
        "greedy",
        "The paper's tables with greedy acceptance",
        (),
        tuple(f"greedy_table{i}" for i in range(1, 7)),
    ),
)


@dataclass(frozen=True)
class Part:
    """A rendered part of the page: a heading, what is shown under it, and what is folded."""

    key: str
    title: str
    shown: str  # HTML shown under the heading (plots, notes)
    folded: str  # HTML inside the <details>
    summary: str  # the <details>' summary, in words


def _img(plot: Plot, prefix: str = "") -> str:
    esc = html.escape
    data = base64.b64encode(plot.png.read_bytes()).decode("ascii")
    return (
        f'<figure id="{esc(prefix)}plot-{esc(plot.name)}"><img alt="{esc(plot.title)}" '
        f'src="data:image/png;base64,{data}"><figcaption>{esc(plot.title)}</figcaption></figure>'
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " …"


def _folded(summary: str, body: str) -> str:
    """``body`` in a closed <details> under ``summary`` (text, escaped here); "" without a body."""
    if not body:
        return ""
    return f"<details><summary>{html.escape(summary)}</summary>{body}</details>"


def _tables_summary(grids: Sequence[Grid]) -> str:
    titles = "; ".join(g.title for g in grids)
    return f"{len(grids)} table{'s' if len(grids) != 1 else ''}: {_clip(titles, 220)}"


def _part(
    key: str,
    title: str,
    pre: str,
    figs: Sequence[Plot] = (),
    tables: Sequence[Grid] = (),
    note: str = "",
) -> Part:
    """A part of plots (shown, after ``note``) and tables (folded); ``pre`` prefixes their ids."""
    shown = note + "".join(_img(p, pre) for p in figs)
    folded = "".join(to_html(g, pre) for g in tables)
    return Part(key, title, shown, folded, _tables_summary(tables))


def _part_html(part: Part, prefix: str) -> str:
    return (
        f'<section class="part" id="{html.escape(prefix)}part-{html.escape(part.key)}">'
        f"<h3>{html.escape(part.title)}</h3>{part.shown}"
        f"{_folded(part.summary, part.folded)}</section>"
    )


def _claim_line(f: Finding) -> str:
    """One claim in words: its verdict, its short name, and the figure (or why there is none)."""
    esc = html.escape
    if f.verdict == Verdict.UNTESTABLE:
        why = f.detail.split(";")[0].removeprefix("not testable: ")
        said = f"{f.label}: {why}"
    else:
        said = f"{f.label}: {f.measure} {f.estimate.format(3)}"
    return (
        f'<li><span class="{verdict_css_class(f.verdict.value)}">{esc(f.verdict.value)}</span>'
        f" — {esc(_clip(said, 200))}</li>"
    )


def _overview(
    a: Analysis, plots: dict[str, Plot], plot_message: str | None, grids: dict[str, Grid], pre: str
) -> str:
    """The first screen (the claims' forest plot beside tokens per step by domain), one line per
    claim, the run's warnings, and the claims' tables folded."""
    first = [plots[name] for name in FIRST_SCREEN if name in plots]
    if first:
        shown = (
            f'<div class="overview" id="{pre}overview">{"".join(_img(p, pre) for p in first)}</div>'
        )
    else:
        shown = f'<p class="warn">{html.escape(plot_message or "no plots")}</p>'
    lines = "".join(_claim_line(f) for f in a.findings)
    warnings = "".join(f'<p class="warn">{html.escape(w)}</p>' for w in a.warnings)
    claims = [grids[k] for k in CLAIM_GRIDS if k in grids]
    folded = "".join(to_html(g, pre) for g in claims)
    return (
        f'{shown}<ul class="claims" id="{pre}claims">{lines}</ul>{warnings}'
        f"{_folded('The claims in full (rules, figures, details): ' + _tables_summary(claims), folded)}"
    )


def _section_parts(plots: dict[str, Plot], grids: dict[str, Grid], pre: str) -> list[Part]:
    """One part per :data:`RUN_SECTIONS` entry the run has something for, then the plots and
    grids that no section names (so a new result is shown before it is given a section)."""
    parts = []
    for s in RUN_SECTIONS:
        figs = [plots[n] for n in s.plots if n in plots]
        tables = [grids[k] for k in s.grids if k in grids]
        if figs or tables:
            parts.append(_part(s.key, s.title, pre, figs, tables))
    named = set(CLAIM_GRIDS).union(*(s.grids for s in RUN_SECTIONS))
    drawn = set(FIRST_SCREEN).union(*(s.plots for s in RUN_SECTIONS))
    figs = [p for name, p in plots.items() if name not in drawn]
    tables = [g for k, g in grids.items() if k not in named]
    if figs or tables:
        parts.append(_part("other", "Other results", pre, figs, tables))
    return parts


def _paper_part(a: Analysis, pre: str) -> Part:
    note = (
        f'<p class="note">{html.escape(paper_data()["source"])}; draft '
        f"{html.escape(paper_data()['draft'])}, target {html.escape(paper_data()['target'])}.</p>"
    )
    title = "Compared with the paper's published figures"
    return _part("paper", title, pre, tables=compare_with_paper(a), note=note)


def _prompts_part(a: Analysis, limit: int = 400) -> Part:
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(p.prompt_id)}</td><td>{esc(p.domain)}</td><td>{esc(p.source)}</td>"
        f'<td class="num">{p.steps}</td><td class="num">'
        f"{EMPTY if not math.isfinite(p.mean_tau) else f'{p.mean_tau:.2f}'}</td>"
        f'<td><div class="prompt">{esc(_clip(p.prompt_text, limit))}</div></td>'
        f'<td><div class="prompt">{esc(_clip(p.output_text, limit))}</div></td></tr>'
        for p in a.prompts
    )
    table = (
        '<div class="grid"><table><thead><tr><th>Prompt</th><th>Domain</th>'
        "<th>Source</th><th>Steps</th><th>mean tau</th><th>Prompt text</th><th>Output</th>"
        f"</tr></thead><tbody>{rows}</tbody></table></div>"
    )
    summary = f"{len(a.prompts)} prompts (text clipped to {limit} characters)"
    return Part("prompts", "Prompts", "", table, summary)


def _info_part(a: Analysis, pre: str) -> Part:
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
                    f"{s.seed}, {s.confidence:.0%} t intervals on the bootstrap standard error"
                ),
            ),
        ),
    )
    manifest = html.escape(json.dumps(to_jsonable(a.info.manifest), indent=2))
    folded = f"{to_html(info, pre)}<h4>Provenance (manifest)</h4><pre>{manifest}</pre>"
    return Part("info", "Run information", "", folded, "the run, its bootstrap and its manifest")


def _run_section(
    i: int, a: Analysis, plots: list[Plot], paper: bool, plot_message: str | None, alone: bool
) -> str:
    """One run's part of the page; a run ``alone`` on its page has its title in the page's <h1>,
    a run among several its own heading (the pair by name) and subtitle."""
    pre = f"r{i}-"
    by_name = {p.name: p for p in plots}
    grids = {g.key: g for g in run_grids(a)}
    parts = _section_parts(by_name, grids, pre)
    if paper:
        parts.append(_paper_part(a, pre))
    parts += [_prompts_part(a), _info_part(a, pre)]
    heading = (
        ""
        if alone
        else f"<h2>Run {html.escape(a.info.run_id)}: {html.escape(_pair(a))}</h2>"
        f'<p class="subtitle">{html.escape(run_subtitle(a))}</p>'
    )
    return (
        f'<section id="run-{i}" class="run">{heading}'
        + _overview(a, by_name, plot_message, grids, pre)
        + "\n".join(_part_html(p, pre) for p in parts)
        + "</section>"
    )


def _comparison_section(
    analyses: list[Analysis], drafters: DrafterComparison | None, drafter_plots: Sequence[Plot]
) -> str:
    """Several runs side by side: the drafters' plot shown, every table folded."""
    parts = [_part("summary", "Runs side by side", "c0-", tables=[summary_grid(analyses)])]
    ref = analyses[0]
    for j, other in enumerate(analyses[1:], start=1):
        title = f"{ref.info.run_id} vs {other.info.run_id}"
        parts.append(_part(f"vs-{j}", title, f"c{j}-", tables=compare(ref, other)))
    if drafters is not None:
        title = "Drafters side by side"
        parts.append(_part("drafters", title, "d-", drafter_plots, drafter_grids(drafters)))
    return (
        '<section id="comparison"><h2>Comparison</h2>'
        + "\n".join(_part_html(p, "c-") for p in parts)
        + "</section>"
    )


def _pair(a: Analysis) -> str:
    return pair_title(a.info.manifest, a.info.run_id)


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
    alone = len(analyses) == 1
    if alone:  # the pair by name, then the run in one line: tree, dtype, prompts, date
        title, subtitle = _pair(analyses[0]), run_subtitle(analyses[0])
    else:
        title = f"specscope comparison: {', '.join(a.info.run_id for a in analyses)}"
        pairs = list(dict.fromkeys(_pair(a) for a in analyses))
        subtitle = f"{len(analyses)} runs of " + "; ".join(pairs)
    body = [
        _run_section(i, a, plots.get(i, []), paper, plot_message, alone)
        for i, a in enumerate(analyses)
    ]
    nav = ""
    if len(analyses) > 1:
        body.append(_comparison_section(analyses, drafters, drafter_plots))
        links = [
            f'<li><a href="#run-{i}">Run {esc(a.info.run_id)}</a></li>'
            for i, a in enumerate(analyses)
        ]
        nav = f'<nav><ul>{"".join(links)}<li><a href="#comparison">Comparison</a></li></ul></nav>'
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · specscope</title><style>{CSS}</style></head><body>"
        f'<h1>{esc(title)}</h1><p class="subtitle">{esc(subtitle)}</p>{nav}\n'
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
