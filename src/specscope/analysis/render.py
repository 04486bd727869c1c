"""Tables as grids, and grids as terminal tables, Markdown, CSV, LaTeX and HTML.

Every result table becomes a :class:`Grid` (a title, typed columns, rows of cells and a note with
its definitions) once, and every output format renders grids. An undefined figure (NaN) is always
shown as "—" (an empty field in CSV), never as a number.
"""

from __future__ import annotations

import csv
import html
import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .findings import (
    DRAFTER_RULE,
    LABELS,
    STRATIFIED_RULE,
    Finding,
    StratifiedFinding,
    figures_text,
)
from .prepare import ALL
from .results import CONDITIONAL, Analysis, BinnedProfile, PaperTables
from .stats import EMPTY, Estimate

if TYPE_CHECKING:
    from .drafters import DrafterComparison

Cell = Estimate | int | float | str | None


@dataclass(frozen=True)
class Column:
    name: str
    digits: int = 3
    signed: bool = False


@dataclass(frozen=True)
class Grid:
    key: str  # file name and HTML id
    title: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[Cell, ...], ...]
    note: str = ""


def cell_text(cell: Cell, col: Column, interval: bool = True) -> str:
    if cell is None:
        return EMPTY
    if isinstance(cell, Estimate):
        return cell.format(col.digits, interval=interval, signed=col.signed)
    if isinstance(cell, bool):
        return "yes" if cell else "no"
    if isinstance(cell, int):
        return f"{cell:,}"
    if isinstance(cell, float):
        return EMPTY if not math.isfinite(cell) else f"{cell:.{col.digits}f}"
    return str(cell)


# --- output formats --------------------------------------------------------------------------------

_MARKDOWN_SPECIAL = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    "\\": "\\\\",
    "|": "\\|",
    "`": "\\`",
    "*": "\\*",
    "_": "\\_",
    "[": "\\[",
    "]": "\\]",
    "\r": " ",
    "\n": " ",
}


def markdown_escape(text: str) -> str:
    """``text`` shown as itself in Markdown: HTML tags and entities, emphasis, links, code spans
    and table pipes escaped, newlines folded (ids and domain names come from user files)."""
    return "".join(_MARKDOWN_SPECIAL.get(ch, ch) for ch in text)


def to_markdown(grid: Grid) -> str:
    def esc(v: Cell, c: Column) -> str:  # figures as they are; text escaped
        text = cell_text(v, c)
        if isinstance(v, (Estimate, int, float)):
            return text.replace("|", "\\|")
        return markdown_escape(text)

    lines = [f"### {markdown_escape(grid.title)}", ""]
    lines.append("| " + " | ".join(markdown_escape(c.name) for c in grid.columns) + " |")
    numeric = [
        any(isinstance(r[i], (Estimate, int, float)) for r in grid.rows)
        for i in range(len(grid.columns))
    ]
    lines.append(
        "|"
        + "|".join("---:" if numeric[i] and i else "---" for i in range(len(grid.columns)))
        + "|"
    )
    for row in grid.rows:
        lines.append("| " + " | ".join(esc(v, c) for v, c in zip(row, grid.columns)) + " |")
    if grid.note:
        lines += ["", markdown_escape(grid.note)]
    return "\n".join(lines) + "\n"


def to_csv(grid: Grid) -> str:
    """One row per table row; an Estimate column becomes value, lo, hi columns (empty if NaN)."""
    is_est = [any(isinstance(r[i], Estimate) for r in grid.rows) for i in range(len(grid.columns))]
    header = []
    for c, est in zip(grid.columns, is_est):
        header += [c.name, f"{c.name} lo", f"{c.name} hi"] if est else [c.name]

    def num(x: float) -> str:
        return repr(float(x)) if math.isfinite(x) else ""

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in grid.rows:
        fields = []
        for v, est in zip(row, is_est):
            if isinstance(v, Estimate):
                fields += [num(v.value), num(v.lo), num(v.hi)]
            elif est:
                fields += ["" if v is None else str(v), "", ""]
            elif isinstance(v, float):
                fields.append(num(v))
            else:
                fields.append("" if v is None else str(v))
        writer.writerow(fields)
    return out.getvalue()


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}
_LATEX_UNICODE = {
    "—": "---",
    "–": "--",
    "−": "$-$",
    "→": r"$\to$",
    "≤": r"$\le$",
    "≥": r"$\ge$",
    "η²": r"$\eta^2$",
    "ρ": r"$\rho$",
    "τ": r"$\tau$",
    "α": r"$\alpha$",
    "Δ": r"$\Delta$",
    "×": r"$\times$",
    "·": r"$\cdot$",
}


def latex_escape(text: str) -> str:
    out = "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)
    for k, v in _LATEX_UNICODE.items():
        out = out.replace(k, v)
    return out


def to_latex(grid: Grid) -> str:
    """A booktabs table (needs \\usepackage{booktabs}); intervals in small type."""

    def cell(v: Cell, c: Column) -> str:
        if isinstance(v, Estimate) and v.has_interval:
            head = latex_escape(v.format(c.digits, interval=False, signed=c.signed))
            lo, hi = (f"{{:{'+' if c.signed else ''}.{c.digits}f}}".format(x) for x in (v.lo, v.hi))
            return f"{head} {{\\scriptsize [{latex_escape(lo)}, {latex_escape(hi)}]}}"
        return latex_escape(cell_text(v, c))

    spec = "l" + "r" * (len(grid.columns) - 1)
    lines = [
        r"\begin{table}[ht]",
        r"\centering",
        r"\small",
        f"\\caption{{{latex_escape(grid.title)}}}",
        f"\\label{{tab:{grid.key}}}",
        f"\\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(latex_escape(c.name) for c in grid.columns) + r" \\",
        r"\midrule",
    ]
    lines += [
        " & ".join(cell(v, c) for v, c in zip(row, grid.columns)) + r" \\" for row in grid.rows
    ]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if grid.note:
        lines.append(f"\\par\\smallskip{{\\footnotesize {latex_escape(grid.note)}}}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


_VERDICT_CLASS = {
    "holds": "v-holds",
    "does not hold": "v-fails",
    "inconclusive": "v-inconclusive",
    "not testable": "v-untestable",
}


def verdict_css_class(text: str) -> str:
    """The HTML class that colours a verdict's text ("holds" -> "v-holds"); "" for other text."""
    return _VERDICT_CLASS.get(text, "")


def to_html(grid: Grid, id_prefix: str = "") -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(c.name)}</th>" for c in grid.columns)
    body = []
    for row in grid.rows:
        cells = []
        for i, (v, c) in enumerate(zip(row, grid.columns)):
            text = esc(cell_text(v, c, interval=False))
            if isinstance(v, Estimate) and v.has_interval:
                lo, hi = (
                    f"{{:{'+' if c.signed else ''}.{c.digits}f}}".format(x) for x in (v.lo, v.hi)
                )
                text += f' <span class="ci">[{esc(lo)}, {esc(hi)}]</span>'
            numeric = isinstance(v, (Estimate, int, float)) and not isinstance(v, bool)
            cls = "num" if numeric and i else "text"
            if verdict := verdict_css_class(text):
                cls += f" {verdict}"
            cells.append(f'<td class="{cls}">{text}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = f'<p class="note">{esc(grid.note)}</p>' if grid.note else ""
    return (
        f'<div class="grid"><table id="{esc(id_prefix + grid.key)}"><caption>{esc(grid.title)}</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{note}</div>"
    )


def to_rich(grid: Grid):
    """A grid as a rich table; text cells are shown as written (no markup) and terminal-safe."""
    from rich.table import Table
    from rich.text import Text

    from ..console import terminal_safe

    def rich_cell(v: Cell, c: Column) -> Text:
        return Text(terminal_safe(cell_text(v, c)))

    table = Table(
        title=Text(terminal_safe(grid.title)),
        caption=Text(terminal_safe(grid.note)) if grid.note else None,
        caption_justify="left",
        title_justify="left",
        show_lines=False,
    )
    numeric = [
        any(isinstance(r[i], (Estimate, int, float)) for r in grid.rows)
        for i in range(len(grid.columns))
    ]
    for i, c in enumerate(grid.columns):
        table.add_column(c.name, justify="right" if numeric[i] and i else "left", overflow="fold")
    for row in grid.rows:
        table.add_row(*(rich_cell(v, c) for v, c in zip(row, grid.columns)))
    return table


# --- grids of the paper's tables -------------------------------------------------------------------


def _metric_label(metric: str) -> str:
    return "α" if metric == "alpha" else "greedy"


def _bin_label(b: int, size: int = 32) -> str:
    return f"bin {b} (tokens {b * size + 1}–{(b + 1) * size})"


def paper_grids(pt: PaperTables) -> list[Grid]:
    m = _metric_label(pt.metric)
    greedy = pt.metric != "alpha"
    prefix = "greedy_" if greedy else ""
    suffix = " — greedy_accept in place of alpha" if greedy else ""
    what = (
        "greedy_accept: the drafted token is the target's argmax (unconditional: every node "
        "counts, also nodes whose parent path was rejected)"
        if greedy
        else "alpha = min(1, p_target / p_draft), the paper's Eq. 1"
    )
    grids = [
        Grid(
            f"{prefix}table1",
            f"Table I: per-domain node statistics{suffix}",
            (
                Column("Domain"),
                Column("Nodes"),
                Column(f"mean {m}", 4),
                Column(f"std {m}", 4),
                Column("mean H (nats)", 4),
            ),
            tuple((r.domain, r.nodes, r.mean, r.std, r.target_entropy) for r in pt.table1),
            f"{what}; std with ddof = 1; H = target entropy.",
        ),
        Grid(
            f"{prefix}table2",
            f"Table II: the paper's expected accepted length E[L]{suffix}",
            (Column("Domain"), Column("E[L]"), Column("E[L] > 1?")),
            tuple((r.domain, r.expected_length, _vs_one(r.expected_length)) for r in pt.table2),
            f"E[L] = Σ_d Π_(k≤d) mean {m} at depth k (paper Eq. 3): a proxy that averages over "
            f"all siblings, ignores that a tree accepts if any child does, and omits the bonus "
            f"token; compare the realized tau. 'E[L] > 1?': yes/no when the interval excludes 1.",
        ),
        Grid(
            f"{prefix}table3",
            f"Table III: cumulative product of mean {m} by depth{suffix}",
            (Column("Domain"),) + tuple(Column(f"d={d}") for d in pt.depths),
            tuple((r.domain,) + r.by_depth for r in pt.table3),
            "The paper's 'probability of a fully accepted chain of length d'.",
        ),
        Grid(
            f"{prefix}table4",
            f"Table IV: mean {m} by tree depth{suffix}",
            (Column("Domain"),)
            + tuple(Column(f"depth {d}") for d in pt.depths)
            + (Column(f"Δ 1→{pt.depths[-1] if pt.depths else '?'}", signed=True),),
            tuple((r.domain,) + r.by_depth + (r.delta,) for r in pt.table4),
            "Δ = mean at the deepest depth minus mean at depth 1 (interval from the same "
            "resamples).",
        ),
        Grid(
            f"{prefix}table5",
            f"Table V: mean {m} by depth and position bin{suffix}",
            (Column("Domain"), Column("Depth"))
            + tuple(Column(_bin_label(b)) for b in pt.bins)
            + (Column("Δ last−first", signed=True),),
            tuple((r.domain, r.depth) + r.by_bin + (r.delta,) for r in pt.table5),
            "Position bin = step // 32 (output tokens 1–32, 33–64, ...). The paper's Table V is "
            "the All block.",
        ),
        Grid(
            f"{prefix}table6",
            f"Table VI: correlation of target entropy and {m}{suffix}",
            (Column("Domain"), Column("Nodes"), Column("Spearman ρ"), Column("Pearson r")),
            tuple((r.domain, r.nodes, r.spearman, r.pearson) for r in pt.table6),
            "Node-level correlations (the paper reports Spearman; its released code computed "
            "Pearson). Intervals: prompt-clustered bootstrap.",
        ),
    ]
    return grids


def _vs_one(e: Estimate) -> str:
    if not e.defined:
        return EMPTY
    if e.has_interval:
        return "yes" if e.lo > 1 else "no" if e.hi < 1 else "unclear"
    return "unclear (no interval)"


# --- grids of the corrected metrics ----------------------------------------------------------------


def findings_grid(
    findings: tuple[Finding, ...],
    key: str = "findings",
    compact: bool = False,
    stratified: tuple[StratifiedFinding, ...] = (),
) -> Grid:
    """The claims with the figures their verdicts use (per domain, with intervals) and, when the
    run was stratified, each claim's verdict within the levels of the factor."""
    note = (
        "Verdicts come from t tests on prompt-clustered bootstrap standard errors, whose "
        "error rates were measured on synthetic runs of known truth: holds (significant on "
        "the claimed side, in every domain the claim covers), does not hold (significant on "
        "the other side somewhere, Bonferroni-corrected over domains), inconclusive, not "
        "testable (fewer than the minimum prompts per domain, or the run lacks what the "
        "claim needs). 'Figures the verdict uses': the per-domain figures (or comparisons) "
        "the test is decided on, with 95% intervals."
    )
    by_key = {s.key: s for s in stratified}
    strat_cols: tuple[Column, ...] = ()
    if stratified:
        factor = stratified[0].factor
        strat_cols = (Column(f"After stratifying by {factor}"),)
        note += f" After stratifying by {factor}: {STRATIFIED_RULE}"

    def strat(f: Finding) -> tuple:
        if not stratified:
            return ()
        s = by_key.get(f.key)
        return (s.summary() if s else None,)

    if compact:
        return Grid(
            key,
            "Findings: the paper's claims checked against this run",
            (Column("Claim"), Column("Figures the verdict uses [95% CI]"), Column("Verdict"))
            + strat_cols,
            tuple((f.label, f.figures_text(), f.verdict.value) + strat(f) for f in findings),
            note + " Each claim's rule and details: tables.md / report.html.",
        )
    return Grid(
        key,
        "Findings: the paper's claims checked against this run",
        (
            Column("Claim"),
            Column("Paper"),
            Column("This run: measure"),
            Column("Figure [95% CI]"),
            Column("Figures the verdict uses [95% CI]"),
            Column("Verdict"),
        )
        + strat_cols
        + (Column("Rule"), Column("Detail")),
        tuple(
            (f.claim, f.paper, f.measure, f.estimate, f.figures_text(), f.verdict.value)
            + strat(f)
            + (f.rule, f.detail)
            for f in findings
        ),
        note,
    )


def findings_figures_grid(a: Analysis) -> Grid:
    """One row per figure a verdict uses (CSV-friendly: value, lo, hi), whole run and levels."""
    rows = [
        (f.key, "whole run", name, e, f.verdict.value) for f in a.findings for name, e in f.figures
    ]
    if a.stratification is not None:
        rows += [
            (s.key, lv.stratum, name, e, lv.verdict.value)
            for s in a.stratification.findings
            for lv in s.levels
            for name, e in lv.figures
        ]
    return Grid(
        "findings_figures",
        "Findings: the figures each verdict uses",
        (
            Column("Claim"),
            Column("Scope"),
            Column("Figure"),
            Column("Value [95% CI]"),
            Column("Verdict"),
        ),
        tuple(rows),
        "Scope 'whole run': the verdict of the findings table; a stratum: the claim "
        "checked within that level only (its verdict as the stratified rule counts it).",
    )


def variance_grid(a: Analysis) -> Grid | None:
    v = a.variance
    if v is None:
        return None
    return Grid(
        "variance",
        "Variance decomposition: what drives acceptance (share of node-level variance)",
        (
            Column("Metric"),
            Column("Factor"),
            Column("Levels"),
            Column("alone (η²)", 4),
            Column("alone, noise-corrected", 4),
            Column("sequential", 4),
            Column("unique", 4),
        ),
        tuple(
            (r.metric, r.factor, r.levels or None, r.one_way, r.corrected, r.sequential, r.unique)
            for r in v.rows
        ),
        "alone: η² of a one-way grouping by the factor (raw; noise-corrected removes the "
        "share sampling noise of the group means adds, about 0 for a factor without "
        "effect). sequential: the share each factor adds in the order "
        + " → ".join(v.order)
        + " (least squares, prompts as fixed effects; domain + "
        "prompt is the prompt-level variance), with the residual the rows sum to 1. "
        "unique: the share lost when a within-prompt factor is dropped from the full "
        "model. Intervals: prompt-clustered bootstrap.",
    )


def stratified_grids(a: Analysis) -> list[Grid]:
    """The per-domain tables within each level of the stratification factor."""
    st = a.stratification
    if st is None:
        return []
    labels = a.labels
    lv_cols = tuple(Column(s.label) for s in st.strata)

    def by_domain(rows, attr):
        return [{r.domain: getattr(r, attr) for r in getattr(s, rows)} for s in st.strata]

    rho = by_domain("table6", "spearman")
    mean = by_domain("table1", "mean")
    delta = [dict(s.depth_delta) for s in st.strata]
    prompts = "; ".join(
        f"{s.label}: " + ", ".join(f"{d} {n}" for d, n in zip(a.info.domains, s.domain_prompts))
        for s in st.strata
    )
    return [
        Grid(
            "stratified_rho",
            f"ρ(target entropy, alpha) within each {st.factor}",
            (Column("Domain"),) + lv_cols,
            tuple((d,) + tuple(m.get(d) for m in rho) for d in labels),
            "Spearman ρ over the nodes of one level only. A pooled ρ mixes levels whose "
            "acceptance differs: its sign can differ from every level's (Simpson's paradox).",
        ),
        Grid(
            "stratified_alpha",
            f"Mean alpha by domain within each {st.factor}",
            (Column("Domain"),) + tuple(Column(c.name, 4) for c in lv_cols),
            tuple((d,) + tuple(m.get(d) for m in mean) for d in labels),
            f"Prompts with nodes per level and domain: {prompts}.",
        ),
        Grid(
            "stratified_depth",
            f"Depth trend of alpha within each {st.factor}",
            (Column("Domain"),) + tuple(Column(c.name, signed=True) for c in lv_cols),
            tuple((d,) + tuple(m.get(d) for m in delta) for d in labels),
            "Within-prompt change of mean alpha from depth 1 to the deepest depth, nodes of "
            "the level only (— where no prompt has such nodes at both depths).",
        ),
        Grid(
            "stratified_findings",
            f"Findings within each {st.factor}",
            (
                Column("Claim"),
                Column("Level"),
                Column("Verdict"),
                Column("Figures the verdict uses [95% CI]"),
            ),
            tuple(
                (
                    LABELS.get(s.key, s.key),
                    lv.stratum,
                    lv.verdict.value,
                    figures_text(lv.figures) if lv.figures else lv.detail,
                )
                for s in st.findings
                for lv in s.levels
            ),
            STRATIFIED_RULE[0].upper() + STRATIFIED_RULE[1:],
        ),
    ]


def tau_grid(a: Analysis) -> Grid:
    return Grid(
        "tau",
        "Realized tokens per target pass (tau) vs the paper's E[L]",
        (
            Column("Domain"),
            Column("Steps"),
            Column("mean tau"),
            Column("top-1 chain tau"),
            Column("tree gain", signed=True),
            Column("paper E[L]"),
            Column("min tau"),
        ),
        tuple(
            (r.domain, r.steps, r.tau, r.chain_tau, r.tree_gain, r.paper_expected_length, r.min_tau)
            for r in a.tau
        ),
        "tau = accepted_len + 1: tokens a greedy tree verifier emits per target pass, "
        "the bonus token counted (the vLLM / Spec-Bench convention); it is at least 1 at "
        "every step. top-1 chain tau: what the sibling-rank-0 path alone would emit; tree "
        "gain = tau − chain tau on the same steps.",
    )


def tau_distribution_grid(a: Analysis) -> Grid:
    d = a.tau_distribution
    return Grid(
        "tau_distribution",
        "Distribution of tau: share of steps",
        (Column("Domain"), Column("Steps")) + tuple(Column(f"tau={t}") for t in d.taus),
        tuple((r.domain, r.steps) + r.shares for r in d.rows),
    )


def acceptance_vector_grid(a: Analysis) -> Grid:
    v = a.acceptance_vector
    return Grid(
        "acceptance_vector",
        "Acceptance vector: greedy acceptance by depth and sibling rank",
        (
            Column("Domain"),
            Column("Depth"),
            Column("Rank"),
            Column("Nodes"),
            Column("rate (all nodes)"),
            Column("Eligible"),
            Column("rate | parent accepted"),
        ),
        tuple(
            (c.domain, c.depth, c.rank, c.nodes, c.unconditional, c.eligible, c.conditional)
            for c in v.cells
        ),
        "rate (all nodes): mean greedy_accept over every node of the cell (unconditional). "
        "rate | parent accepted: mean over the eligible nodes, those whose whole parent path "
        "is greedy-accepted (roots are always eligible) — the per-edge acceptance "
        "probability that Sequoia-style tree optimisation multiplies along a path.",
    )


def depth_profile_grid(a: Analysis) -> Grid:
    p = a.depth_profile
    return Grid(
        "depth_profile",
        "Does acceptance rise with depth? Split by sibling rank and along the top-1 chain",
        (Column("Domain"), Column("Subset"), Column("Metric"))
        + tuple(Column(f"depth {d}") for d in p.depths)
        + (Column(f"Δ 1→{p.depths[-1]}", signed=True),),
        tuple((r.domain, r.subset, r.metric) + r.by_depth + (r.delta,) for r in p.rows),
        f"A tree's deeper levels hold a different mix of nodes (e.g. the paper tree's depth "
        f"3 only extends the top path). Comparing the same kind of node at every depth "
        f"(one sibling rank, or the top-1 chain) separates a real depth effect from a "
        f"selection effect. '{CONDITIONAL}': greedy acceptance among nodes whose parent "
        f"path is accepted.",
    )


def effects_grid(a: Analysis) -> Grid:
    return Grid(
        "effects",
        "Effect sizes: share of node-level variance explained (η²)",
        (Column("Factor"), Column("η² of alpha", 4), Column("η² of greedy_accept", 4)),
        tuple((r.factor, r.alpha, r.greedy) for r in a.effects.rows),
        "η² = SS_between / SS_total of a one-way grouping of nodes by the factor. "
        "'domain − depth' > 0 means task type explains more than depth; its interval comes "
        "from the same prompt-clustered resamples.",
    )


def paradox_grid(a: Analysis) -> Grid:
    p = a.paradox
    rows: tuple = ()
    if p is not None:
        rows = (
            ("domain checked", p.domain),
            ("highest mean target entropy", p.entropy_top),
            ("highest mean alpha", p.alpha_top),
            ("highest greedy acceptance", p.greedy_top),
            (f"{p.domain}'s lead in entropy (nats)", p.entropy_lead),
            (f"{p.domain}'s lead in mean alpha", p.alpha_lead),
            (f"{p.domain}'s lead in greedy acceptance", p.greedy_lead),
            (
                "share of resamples where it tops entropy and alpha",
                p.p_both if math.isfinite(p.p_both) else None,
            ),
        )
    return Grid(
        "paradox",
        "The chat paradox: highest entropy and highest acceptance?",
        (Column("Check"), Column("Value", signed=False)),
        rows,
        "Lead = the domain's mean minus the highest mean among the other domains.",
    )


def profile_grid(p: BinnedProfile) -> Grid:
    return Grid(
        f"{p.name}_profile",
        f"Acceptance by {p.axis}",
        (Column("Domain"), Column("Metric")) + tuple(Column(lab) for lab in p.labels),
        tuple((r.domain, r.metric) + r.values for r in p.rows),
    )


def echo_grid(a: Analysis) -> Grid | None:
    """Prompt echo per domain (:mod:`specscope.analysis.echo`); None for an analysis without it."""
    e = a.echo
    if e is None:
        return None
    return Grid(
        "echo",
        "Prompt echo: output words copied from the prompt",
        (
            Column("Domain"),
            Column("Prompts"),
            Column("Echo share"),
            Column(f"Prompts >= {e.high_share:.0%} copied"),
            Column("Whole output in prompt"),
        ),
        tuple((r.domain, r.prompts, r.share, r.mostly_copied, r.verbatim) for r in e.rows),
        f"Echo share: mean over prompts of the share of output words lying inside a run of "
        f">= {e.run_words} consecutive output words that occurs word for word in the "
        f"prompt (whitespace-separated words). A domain at >= {e.warn_share:.0%} gets a "
        f"warning: its acceptance largely measures copying.",
    )


def drafter_grids(c: DrafterComparison) -> list[Grid]:
    """The drafters side by side per domain, and the verdicts on each pair of them."""
    labels = c.domains + (ALL,)
    order = {d: i for i, d in enumerate(labels)}
    rows = sorted(c.rows, key=lambda r: order[r.domain])  # stable: drafters in the runs' order
    table = Grid(
        "drafters",
        "Drafters side by side on the same prompts",
        (
            Column("Domain"),
            Column("Drafter"),
            Column("Prompts"),
            Column("Steps"),
            Column("decoded tokens/step"),
            Column("mean tau"),
            Column("steps with a proposal"),
        )
        + tuple(Column(f"greedy | parent, depth {d}") for d in c.depths),
        tuple(
            (r.domain, r.drafter, r.prompts, r.steps, r.decoded, r.tau, r.proposal_share)
            + r.chain_acceptance
            for r in rows
        ),
        "decoded tokens/step: the run's trees replayed as greedy decoding (output tokens over "
        "decoding steps: what a decoder gets). mean tau: tokens per target pass averaged over "
        "recorded positions (accepted_len + 1, the bonus token counted; a step without a proposal"
        " counts 1), the position mean, which overstates decoding. steps with a proposal: share "
        "of steps where the drafter proposed at least one token (a lookup finds no match in the "
        "others). greedy | parent: greedy acceptance of top-1-chain nodes whose parent path is "
        "accepted (a chain drafter's whole proposal, a tree's sibling-rank-0 path). Only prompts "
        "that every drafter measured; 95% intervals resample prompts within domains, the same "
        "resamples for every drafter.",
    )
    verdicts = tuple(sorted(c.verdicts, key=lambda v: order[v.domain]))
    comparison = Grid(
        "drafter_verdicts",
        "Does one drafter accept more than another? (paired by prompt)",
        (
            Column("Domain"),
            Column("Claim"),
            Column("Δ mean tau [95% CI]", signed=True),
            Column("Verdict"),
        ),
        tuple((v.domain, v.claim, v.difference, v.verdict.value) for v in verdicts),
        f"Δ mean tau: the first drafter's mean tau minus the second's on the same prompts. "
        f"{DRAFTER_RULE} Error rates: docs/calibration.md.",
    )
    return [table, comparison] if verdicts else [table]


def analysis_grids(a: Analysis) -> list[Grid]:
    """Every table of an analysis, in report order."""
    stratified = a.stratification.findings if a.stratification is not None else ()
    variance = variance_grid(a)
    return (
        [findings_grid(a.findings, stratified=stratified), findings_figures_grid(a)]
        + paper_grids(a.paper)
        + [
            tau_grid(a),
            tau_distribution_grid(a),
            acceptance_vector_grid(a),
            depth_profile_grid(a),
            effects_grid(a),
        ]
        + ([variance] if variance is not None else [])
        + stratified_grids(a)
        + [paradox_grid(a)]
        + [g for g in (echo_grid(a),) if g is not None]
        + paper_grids(a.greedy)
        + [profile_grid(a.entropy_profile), profile_grid(a.position_profile)]
    )


__all__ = [
    "ALL",
    "Column",
    "Grid",
    "analysis_grids",
    "drafter_grids",
    "paper_grids",
    "to_csv",
    "to_html",
    "to_latex",
    "to_markdown",
    "to_rich",
    "verdict_css_class",
]
