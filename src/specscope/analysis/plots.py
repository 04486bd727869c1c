"""Plots of an analysis (matplotlib, the ``plot`` extra), written as PNG and SVG.

Two plots open the report (:data:`FIRST_SCREEN`): the paper's claims as a forest plot (every figure
a verdict is decided on, with its interval, coloured by the claim's verdict) and tokens per step by
domain. The others show one kind of result each. This module draws; it decides nothing (verdicts
come from :mod:`.findings`) and writes no HTML (:mod:`.report` does).

matplotlib is imported lazily and used through its object-oriented API (``Figure``), so no global
backend or pyplot state is touched. Without matplotlib, :func:`write_plots` returns no plots and
:func:`plots_unavailable` says why.
"""

from __future__ import annotations

import io
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..files import write_output
from ..records import ALL_DOMAINS
from .drafters import DrafterComparison
from .findings import Finding, Verdict
from .paper import paper_data
from .prepare import ALL
from .results import CONDITIONAL, Analysis, BinnedProfile
from .stats import Estimate


@dataclass(frozen=True)
class Plot:
    name: str
    title: str
    png: Path
    svg: Path


def plots_unavailable() -> str | None:
    """None when plots can be drawn, else the reason they cannot."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'specscope[plot]'): plots skipped"
    return None


# The domains' colours, in the order of a run's domains (All is black): blue, orange, sky blue and
# purple first (Okabe-Ito and ColorBrewer hues that stay apart under the common colour-vision
# deficiencies), then brown, pink and indigo. No green, red, amber or grey: those are the verdicts'
# (VERDICT_COLOURS), so a domain is never read as a verdict on the screen they share.
DOMAIN_COLOURS = ("#0072B2", "#E69F00", "#56B4E9", "#6A3D9A", "#8C510A", "#CC79A7", "#332288")


def domain_colour(i: int) -> str:
    """The colour of the ``i``-th domain (cycling past the last)."""
    return DOMAIN_COLOURS[i % len(DOMAIN_COLOURS)]


def _figure(width: float, height: float, domain_cycle: bool = True):
    """A figure whose axes draw series in :data:`DOMAIN_COLOURS` (``domain_cycle``), else in
    matplotlib's default cycle."""
    from matplotlib.figure import Figure  # the plot extra

    class _DomainFigure(Figure):
        def add_subplot(self, *args, **kwargs):
            ax = super().add_subplot(*args, **kwargs)
            ax.set_prop_cycle(color=list(DOMAIN_COLOURS))
            return ax

    cls = _DomainFigure if domain_cycle else Figure
    return cls(figsize=(width, height), dpi=110, layout="constrained")


def _values(ests: tuple[Estimate, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Values and (2, n) error-bar lengths; NaN where undefined (matplotlib skips those)."""
    v = np.array([e.value for e in ests], dtype=float)
    lo = np.array([e.lo if e.has_interval else e.value for e in ests], dtype=float)
    hi = np.array([e.hi if e.has_interval else e.value for e in ests], dtype=float)
    return v, np.nan_to_num(np.vstack([v - lo, hi - v]), nan=0.0)


def _labels(a: Analysis) -> list[str]:
    return list(a.info.domains) + [ALL]


def _style(label: str) -> dict:
    return {"color": "black", "linestyle": "--", "linewidth": 2} if label == ALL else {}


def depth_plot(a: Analysis):
    fig = _figure(10, 4)
    axes = fig.subplots(1, 2)
    depths = np.array(a.depth_profile.depths)
    for ax, metric, title in (
        (axes[0], "alpha", "mean alpha (paper's Eq. 1)"),
        (axes[1], CONDITIONAL, "greedy acceptance | parent accepted"),
    ):
        for i, lab in enumerate(_labels(a)):
            row = a.depth_profile.row(lab, "all nodes", metric)
            if row is None:
                continue
            v, err = _values(row.by_depth)
            ax.errorbar(
                depths + (i - 2) * 0.04,
                v,
                yerr=err,
                marker="o",
                capsize=3,
                label=lab,
                **_style(lab),
            )
        ax.set_xticks(depths)
        ax.set_xlabel("tree depth")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("acceptance (95% CI)")
    axes[1].legend(fontsize=8)
    fig.suptitle("Acceptance by depth per domain")
    return fig


def tau_plot(a: Analysis):
    fig = _figure(8, 4)
    ax = fig.subplots()
    d = a.tau_distribution
    rows = [r for r in d.rows if r.domain != ALL and r.steps > 0]
    width = 0.8 / max(len(rows), 1)
    taus = np.array(d.taus)
    means = {r.domain: r.tau for r in a.tau}
    for i, r in enumerate(rows):
        mean = means[r.domain]
        label = f"{r.domain} (mean {mean.format(2, interval=False)})"
        ax.bar(taus + (i - (len(rows) - 1) / 2) * width, r.shares, width=width, label=label)
    ax.set_xticks(taus)
    ax.set_xlabel("tau = tokens emitted per target pass (accepted + bonus)")
    ax.set_ylabel("share of steps")
    ax.set_title("Distribution of tau per domain")
    if rows:
        ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


def _profile_plot(a: Analysis, profile: BinnedProfile, title: str, xlabel: str):
    fig = _figure(10, 4)
    axes = fig.subplots(1, 2, sharey=False)
    x = np.array(profile.centers, dtype=float)
    for ax, metric in zip(axes, ("alpha", "greedy_accept")):
        for lab in _labels(a):
            row = next((r for r in profile.rows if r.domain == lab and r.metric == metric), None)
            if row is None:
                continue
            v, err = _values(row.values)
            line = ax.plot(x, v, marker=".", label=lab, **_style(lab))[0]
            lo, hi = v - err[0], v + err[1]
            ax.fill_between(x, lo, hi, alpha=0.15, color=line.get_color(), linewidth=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"mean {metric}")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title)
    return fig


def entropy_plot(a: Analysis):
    return _profile_plot(
        a,
        a.entropy_profile,
        "Acceptance vs target entropy (decile bins, 95% CI)",
        "target entropy (nats, bin mean)",
    )


def position_plot(a: Analysis):
    return _profile_plot(
        a,
        a.position_profile,
        f"Acceptance by position in the generation "
        f"({a.settings.position_bucket}-token buckets, 95% CI)",
        "output token position (bucket centre)",
    )


def acceptance_heatmap(a: Analysis):
    v = a.acceptance_vector
    labels = _labels(a)
    cols = min(len(labels), 5)
    rows = math.ceil(len(labels) / cols)
    fig = _figure(2.6 * cols + 1, 2.4 * rows + 0.6)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    image = None
    for ax, lab in zip(axes, labels):
        grid = np.full((len(v.depths), len(v.ranks)), np.nan)
        for c in v.cells:
            if c.domain == lab and c.conditional.defined:
                grid[c.depth - 1, c.rank] = c.conditional.value
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        for (i, j), val in np.ndenumerate(grid):
            text = "—" if np.isnan(val) else f"{val:.2f}"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=8,
                color="white" if np.isnan(val) or val < 0.6 else "black",
            )
        ax.set_title(lab, fontsize=9)
        ax.set_xticks(range(len(v.ranks)), [str(r) for r in v.ranks])
        ax.set_yticks(range(len(v.depths)), [str(d) for d in v.depths])
        ax.set_xlabel("sibling rank", fontsize=8)
        ax.set_ylabel("depth", fontsize=8)
    for ax in axes[len(labels) :]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(
            image,
            ax=list(axes[: len(labels)]),
            shrink=0.8,
            label="greedy acceptance | parent accepted",
        )
    fig.suptitle("Acceptance vector (conditional greedy rate by depth and sibling rank)")
    return fig


def variance_plot(a: Analysis):
    """Sequential variance shares of alpha and greedy acceptance per factor, 95% whiskers."""
    fig = _figure(9, 4)
    ax = fig.subplots()
    v = a.variance
    factors = list(v.order) if v is not None else []
    x = np.arange(len(factors))
    for i, (metric, label) in enumerate((("alpha", "alpha"), ("greedy_accept", "greedy accept"))):
        rows = [v.row(metric, f) for f in factors]
        vals, err = _values(tuple(r.sequential for r in rows))
        ax.bar(x + (i - 0.5) * 0.38, vals, width=0.38, yerr=err, capsize=3, label=label)
    names = {"prompt": "prompt (within domain)"}
    ax.set_xticks(x, [names.get(f, f.replace("_", " ")) for f in factors])
    ax.set_ylabel("share of node-level variance (95% CI)")
    ax.set_title(
        "Variance explained, in sequence: domain → prompt → sibling rank → depth → position",
        fontsize=10,
    )
    ax.axhline(0, color="black", linewidth=0.8)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


# --- the first screen: the claims and tokens per step ---------------------------------------------

VERDICT_COLOURS = {  # the report's verdict text's hues: none of them a domain's (DOMAIN_COLOURS)
    Verdict.HOLDS: "#1a7f37",
    Verdict.FAILS: "#c62828",
    Verdict.INCONCLUSIVE: "#555555",
    Verdict.UNTESTABLE: "#9e9e9e",
}
# Each verdict's marker, so that a verdict is told by its shape (and the panel's title says it in
# words), not by its colour alone: filled circle, cross, hollow diamond; an untestable claim has no
# figure to mark.
VERDICT_MARKERS = {
    Verdict.HOLDS: ("o", True),
    Verdict.FAILS: ("X", True),
    Verdict.INCONCLUSIVE: ("D", False),
    Verdict.UNTESTABLE: ("o", False),
}


def _verdict_marker(verdict: Verdict) -> dict:
    marker, filled = VERDICT_MARKERS[verdict]
    colour = VERDICT_COLOURS[verdict]
    return {
        "marker": marker,
        "color": colour,
        "markerfacecolor": colour if filled else "white",
        "markeredgecolor": colour,
    }


def claim_references(key: str) -> tuple[float, ...]:
    """Where a claim's figures are judged: the value (or the two ends of the range) each figure is
    tested against; () for a claim without one."""
    if key == "rho_weak_range":
        lo, hi = paper_data()["claims"]["rho_weak_range"]
        return (float(lo), float(hi))
    if key in ("only_chat_above_one", "below_one_no_speedup"):
        return (1.0,)
    if key.startswith(("task_type_over_depth", "rises_with_depth", "rho_negative", "chat_paradox")):
        return (0.0,)
    return ()


def _forest_panel(ax, f: Finding) -> None:
    """One claim: its figures top to bottom, each a point with its interval, in the verdict's
    colour, against the claim's reference (dashed; a range is shaded)."""
    colour = VERDICT_COLOURS[f.verdict]
    ax.set_title(
        "\n".join(textwrap.wrap(f"{f.label} — {f.verdict.value}", 52)),
        fontsize=7.5,
        loc="left",
        color=colour,
    )
    ax.tick_params(labelsize=7)
    ax.locator_params(axis="x", nbins=5)
    ax.grid(axis="x", alpha=0.3)
    refs = claim_references(f.key)
    if len(refs) == 2:
        ax.axvspan(*refs, color="#dddddd", zorder=0)
    for x in refs:
        ax.axvline(x, color="#444444", linestyle="--", linewidth=0.9, zorder=1)
    if not any(e.defined for _, e in f.figures):
        ax.set_yticks([])
        ax.text(
            0.5,
            0.5,
            textwrap.shorten(f.detail or f.verdict.value, 70, placeholder="…"),
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=7,
            color=colour,
            wrap=True,
        )
        return
    names = [name for name, _ in f.figures]
    v, err = _values(tuple(e for _, e in f.figures))
    y = np.arange(len(names))[::-1]
    ax.errorbar(
        v,
        y,
        xerr=err,
        linestyle="none",
        markersize=5,
        capsize=2,
        zorder=2,
        **_verdict_marker(f.verdict),
    )
    ax.set_yticks(y, [textwrap.shorten(n, 26, placeholder="…") for n in names])
    ax.set_ylim(-0.6, len(names) - 0.4)


def forest_plot(a: Analysis):
    """The paper's claims: one panel per claim, the figures its verdict uses with their intervals."""
    from matplotlib.lines import Line2D

    findings: tuple[Finding, ...] = a.findings
    cols = 2
    rows = max(math.ceil(len(findings) / cols), 1)
    heights = [
        max((max(len(f.figures), 1) for f in findings[r * cols : (r + 1) * cols]), default=1) + 1.4
        for r in range(rows)
    ]
    fig = _figure(8.6, 0.75 + 0.19 * sum(heights))
    axes = fig.subplots(rows, cols, squeeze=False, height_ratios=heights).ravel()
    for ax, f in zip(axes, findings):
        _forest_panel(ax, f)
    for ax in axes[len(findings) :]:
        ax.set_visible(False)
    handles = [
        Line2D([], [], linestyle="-", label=v.value, **_verdict_marker(v)) for v in VERDICT_COLOURS
    ] + [Line2D([], [], color="#444444", linestyle="--", label="claim's reference")]
    fig.legend(handles=handles, loc="outside lower center", ncol=5, fontsize=7.5, frameon=False)
    fig.suptitle(
        f"The paper's claims checked against this run ({a.settings.confidence:.0%} CI)",
        fontsize=10,
    )
    return fig


TOKENS_PER_STEP = "tokens per step (position mean)"
DECODED_TOKENS_PER_STEP = "decoded tokens per step (trees replayed)"


def _tokens_rows(a: Analysis) -> tuple[str, list[tuple[str, Estimate]]]:
    """Tokens per step by domain: decoded (the recorded trees replayed) where the analysis holds
    it, else the position mean, each with its label."""
    if a.delivered is not None:
        rows = [(r.domain, r.decoded) for r in a.delivered.decoded.rows if r.steps > 0]
        return DECODED_TOKENS_PER_STEP, rows
    return TOKENS_PER_STEP, [(r.domain, r.tau) for r in a.tau if r.steps > 0]


def tokens_per_step_plot(a: Analysis):
    """Tokens emitted per target pass by domain, with intervals, against 1 (no gain)."""
    label, rows = _tokens_rows(a)
    fig = _figure(4.4, 4.2)
    ax = fig.subplots()
    x = np.arange(len(rows), dtype=float)
    for i, (domain, est) in enumerate(rows):
        v, err = _values((est,))
        style = {"color": "black" if domain == ALL else domain_colour(i)}
        ax.errorbar(x[i : i + 1], v, yerr=err, fmt="o", capsize=4, markersize=6, **style)
        ax.annotate(
            est.format(2, interval=False),
            (x[i], v[0]),
            xytext=(7, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.axhline(1, color="#444444", linestyle="--", linewidth=0.9)
    ax.set_xticks(x, [domain for domain, _ in rows])
    ax.set_xlim(-0.6, len(rows) - 0.2)
    ax.set_ylabel(f"{label}, {a.settings.confidence:.0%} CI", fontsize=8)
    ax.set_title("Tokens per step by domain\n(accepted + bonus; dashed: 1, no gain)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    return fig


FIRST_SCREEN = {
    "claims_forest": ("The paper's claims: each figure with its interval, by verdict", forest_plot),
    "tokens_per_step": ("Tokens per step by domain", tokens_per_step_plot),
}

PLOTS = {
    **FIRST_SCREEN,
    "acceptance_by_depth": ("Acceptance by depth per domain", depth_plot),
    "tau_distribution": ("Distribution of tau per domain", tau_plot),
    "acceptance_vs_entropy": ("Acceptance vs target entropy", entropy_plot),
    "acceptance_by_position": ("Acceptance by position in the generation", position_plot),
    "acceptance_vector": ("Acceptance vector heat map", acceptance_heatmap),
    "variance_decomposition": ("What drives acceptance: variance shares", variance_plot),
}


def write_plots(a: Analysis, out_dir: str | Path, inside: Path | None = None) -> list[Plot]:
    """Draw every plot into ``out_dir`` as PNG and SVG; [] when matplotlib is missing. Files go
    through :func:`specscope.files.write_output` (``inside``: the run directory out_dir lies in)."""
    if plots_unavailable():
        return []
    return [
        save_plot(draw(a), name, title, out_dir, inside) for name, (title, draw) in PLOTS.items()
    ]


def save_plot(fig, name: str, title: str, out_dir: str | Path, inside: Path | None = None) -> Plot:
    """``fig`` written as ``out_dir/name.png`` and ``.svg`` (through ``write_output``)."""
    png, svg = Path(out_dir) / f"{name}.png", Path(out_dir) / f"{name}.svg"
    for path in (png, svg):
        image = io.BytesIO()
        fig.savefig(image, format=path.suffix[1:])
        write_output(path, image.getvalue(), inside)
    return Plot(name, title, png, svg)


# --- drafters side by side ---------------------------------------------------------------------


def drafter_tau_plot(c: DrafterComparison):
    """Mean tau per domain (and All), one series per drafter, with 95% whiskers."""
    labels = list(c.domains) + [ALL]
    fig = _figure(max(6.0, 1.6 * len(labels) + 2), 4)
    ax = fig.subplots()
    x = np.arange(len(labels), dtype=float)
    spread = 0.6 / max(len(c.drafters), 1)
    for i, drafter in enumerate(c.drafters):
        rows = [c.row(drafter, lab) for lab in labels]
        v, err = _values(tuple(r.tau for r in rows))
        ax.errorbar(
            x + (i - (len(c.drafters) - 1) / 2) * spread,
            v,
            yerr=err,
            marker="o",
            capsize=3,
            linestyle="none",
            label=drafter,
        )
    ax.set_xticks(x, labels)
    ax.axhline(1, color="grey", linewidth=0.8)  # no proposal accepted: 1 token per pass
    ax.set_ylabel("mean tau: tokens per target pass (95% CI)")
    ax.set_title("Tokens per target pass by drafter and domain (same prompts)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


def write_drafter_plots(
    c: DrafterComparison, out_dir: str | Path, inside: Path | None = None
) -> list[Plot]:
    """The drafter comparison's plot as PNG and SVG; [] when matplotlib is missing."""
    if plots_unavailable():
        return []
    png, svg = write_figure(drafter_tau_plot(c), out_dir, "drafter_tau", inside)
    return [Plot("drafter_tau", "Tokens per target pass by drafter and domain", png, svg)]


# --- certify: certified fraction by target-margin bin ------------------------------------------


def certified_by_margin_plot(table):
    """Certified fraction of steps (all domains) per margin bin, one line per criterion (solid)
    and tree width (dashed), with the intervals as whiskers; below, the steps per bin.
    ``table`` is a :class:`specscope.analysis.certify.MarginTable`."""
    rows = [r for r in table.rows if r.domain == ALL_DOMAINS]
    fig = _figure(9, 5.5, domain_cycle=False)  # one series per criterion, more than the domains'
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    x = np.arange(len(rows), dtype=float)
    spread = 0.5 / max(len(table.names), 1)
    for j, name in enumerate(table.names):
        v, err = _values(tuple(r.fractions[j] for r in rows))
        tree = name.startswith("tree_m")
        top.errorbar(
            x + (j - (len(table.names) - 1) / 2) * spread,
            v,
            yerr=err,
            marker="o",
            markersize=4,
            capsize=2,
            linestyle="--" if tree else "-",
            label=name,
        )
    top.set_ylim(-0.02, 1.02)
    top.set_ylabel("certified fraction of steps (95% CI)")
    top.set_title("Certified fraction by target margin (all domains)")
    top.grid(alpha=0.3)
    top.legend(fontsize=8, ncol=2, loc="lower right")
    bottom.bar(x, [r.steps for r in rows], color="grey")
    bottom.set_ylabel("steps")
    bottom.set_xticks(x, [r.bin for r in rows])
    bottom.set_xlabel("target margin p0 − p1 at the step's root context")
    return fig


def write_figure(
    fig,
    out_dir: str | Path,
    name: str,
    inside: Path | None = None,
    formats: tuple[str, ...] = ("png", "svg"),
) -> list[Path]:
    """Save a figure as ``out_dir/name.<format>`` through :func:`specscope.files.write_output`."""
    paths = []
    for fmt in formats:
        image = io.BytesIO()
        fig.savefig(image, format=fmt)
        paths.append(write_output(Path(out_dir) / f"{name}.{fmt}", image.getvalue(), inside))
    return paths
