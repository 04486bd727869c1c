"""``specscope certify``: certificates of acceptance over a recorded run: their distributions per
domain, the steps they certify (with prompt-clustered intervals), soundness (no certified step
rejected), tree coverage, the certified fraction of each criterion and tree width by bin of the
target's margin (the theory's headline: relaxed criteria and trees certify most where the margin
is small), the published figures beside this run's, and plots.

Reads the columns :mod:`specscope.theory` wrote during measurement (or recomputes the margin-only
bounds from the node records); computes no certificate of its own.
"""

from __future__ import annotations

import io
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import MissingExtraError, SpecscopeError
from ..files import write_output
from ..progress import counting
from ..records import ALL_DOMAINS, Run
from ..theory import (
    CRITERIA,
    CriteriaConfig,
    criteria_config_from_manifest,
    margin_bound,
    perspective,
)
from .plots import certified_by_margin_plot, plots_unavailable, write_figure
from .render import Column, Grid
from .stats import ClusterBootstrap, Estimate, bounded, ratio

# --- certify: reports over recorded runs --------------------------------------------------------

# The published figures of the certificates paper: Qwen3-1.7B on UltraChat, greedy.
PUBLISHED: dict[tuple[str, str], float] = {
    ("greedy", "median"): 0.559,
    ("greedy", "p5"): 0.006,
    ("tree_m2", "median"): 0.962,
    ("tree_m4", "median"): 1.456,
    ("tree_m8", "median"): 2.038,
}
CEILINGS: dict[str, float] = {
    "greedy": math.log(2),
    **{f"tree_m{m}": math.log(m + 1) for m in (1, 2, 4, 8)},
}


@dataclass(frozen=True)
class CertifyReport:
    """What ``specscope certify`` prints: one row per (domain, criterion) or (domain, tree m)."""

    criteria: pd.DataFrame  # per (domain, criterion): n, median, p5, frac_ok (accepted), ...
    trees: pd.DataFrame  # per (domain, tree): the same, frac_ok = covered
    published: pd.DataFrame  # the published figures beside ours, with the ceilings
    steps: pd.DataFrame  # one row per step: margin, KL, certificates, acceptance
    source: str  # where the certificates came from
    config: CriteriaConfig  # the criteria behind the columns (for bounds and plots)
    notes: tuple[str, ...] = field(default_factory=tuple)
    margins: MarginTable | None = None  # certified fractions by target-margin bin

    @property
    def violations(self) -> int:
        """Steps certified but rejected (or uncovered): must be zero."""
        total = 0
        for df in (self.criteria, self.trees):
            if len(df):
                total += int(df.loc[df["domain"] == ALL_DOMAINS, "violations"].fillna(0).sum())
        return total


# --- certified fractions with prompt-clustered intervals ----------------------------------------

DEFAULT_MARGIN_BINS: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
MARGIN_BINS_ALLOWED = (
    "at least 2 comma-separated edges in [0, 1], strictly increasing (sorted, "
    "no duplicates), e.g. 0,0.1,0.25,0.5,0.75,0.9,1"
)


class MarginBinsError(SpecscopeError, ValueError):
    """A margin bin specification that does not define consecutive, non-empty bins in [0, 1]."""


class MarginDataError(SpecscopeError, ValueError):
    """A run that records no target margin for its steps (needed for the margin bins)."""


def check_margin_bins(edges: tuple[float, ...] | list[float]) -> tuple[float, ...]:
    """The bin edges, checked: at least 2, each in [0, 1], strictly increasing."""
    edges = tuple(float(e) for e in edges)
    shown = ",".join(f"{e:g}" for e in edges)
    if len(edges) < 2:
        raise MarginBinsError(
            f"--margin-bins {shown or repr('')}: {len(edges)} edge(s) make no "
            f"bin; give {MARGIN_BINS_ALLOWED}"
        )
    bad = next((e for e in edges if not 0.0 <= e <= 1.0), None)  # NaN fails too
    if bad is not None:
        raise MarginBinsError(
            f"--margin-bins {shown}: {bad:g} lies outside [0, 1] (a margin is a "
            f"difference of probabilities); give {MARGIN_BINS_ALLOWED}"
        )
    for a, b in itertools.pairwise(edges):
        if b <= a:
            raise MarginBinsError(
                f"--margin-bins {shown}: {a:g} then {b:g} make an empty or "
                f"overlapping bin; give {MARGIN_BINS_ALLOWED}"
            )
    return edges


def parse_margin_bins(text: str) -> tuple[float, ...]:
    """``"0,0.1,0.5,1"`` as checked bin edges (:func:`check_margin_bins`)."""
    if not text.strip():
        raise MarginBinsError(f"--margin-bins is empty; give {MARGIN_BINS_ALLOWED}")
    edges = []
    for item in text.split(","):
        try:
            edges.append(float(item))
        except ValueError:
            raise MarginBinsError(
                f"--margin-bins {text}: {item.strip()!r} is not a number; give "
                f"{MARGIN_BINS_ALLOWED}"
            ) from None
    return check_margin_bins(edges)


def margin_bin_labels(edges: tuple[float, ...]) -> tuple[str, ...]:
    """``[0, 0.1)``, ..., ``[0.9, 1]``: every bin half-open but the last, which is closed."""
    last = len(edges) - 2
    return tuple(
        f"[{a:g}, {b:g}{']' if i == last else ')'}"
        for i, (a, b) in enumerate(itertools.pairwise(edges))
    )


def margin_bin_codes(margin: np.ndarray, edges: tuple[float, ...]) -> np.ndarray:
    """Each margin's bin (0..len(edges)-2), -1 when it is NaN or outside the edges."""
    margin = np.asarray(margin, dtype=np.float64)
    codes = np.searchsorted(np.asarray(edges), margin, side="right") - 1
    codes[margin == edges[-1]] = len(edges) - 2
    codes[~((margin >= edges[0]) & (margin <= edges[-1]))] = -1
    return codes


@dataclass(frozen=True)
class StepClusters:
    """The steps' prompts as bootstrap clusters, stratified by domain (as ``analyze`` draws them)."""

    boot: ClusterBootstrap
    prompt: np.ndarray  # (S,) each step's prompt column
    stratum: np.ndarray  # (P,) each prompt's domain code

    @classmethod
    def of(cls, steps: pd.DataFrame, n_boot: int, seed: int, confidence: float) -> StepClusters:
        prompt, prompt_ids = pd.factorize(steps["prompt_id"].astype(str), sort=True)
        domain_codes, _ = pd.factorize(steps["domain"].astype(str), sort=True)
        stratum = np.zeros(len(prompt_ids), np.int64)
        stratum[prompt] = domain_codes
        return cls(ClusterBootstrap.draw(stratum, n_boot, seed, confidence), prompt, stratum)

    def fractions(
        self, flags: np.ndarray, cell: np.ndarray, n_cells: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The mean of each column of ``flags`` (S, N; NaN: not counted) over the steps of each
        cell (``cell``: (S,) codes, -1 for none), as an (n_cells, N) array of :class:`Estimate`
        (a ratio of prompt-clustered totals, its interval kept within [0, 1]), and the
        (n_cells,) steps per cell."""
        flags = np.asarray(flags, dtype=np.float64).reshape(len(cell), -1)
        P, N = self.boot.n_prompts, flags.shape[1]
        keep = cell >= 0
        index = self.prompt[keep] * n_cells + cell[keep]
        num, den = np.zeros((P * n_cells, N)), np.zeros((P * n_cells, N))
        np.add.at(num, index, np.nan_to_num(flags[keep]))
        np.add.at(den, index, ~np.isnan(flags[keep]))
        num, den = num.reshape(P, n_cells * N), den.reshape(P, n_cells * N)
        present = den > 0
        prompts = present.sum(axis=0)
        strata = np.array(
            [len(np.unique(self.stratum[present[:, j]])) for j in range(present.shape[1])]
        )
        t_num, t_den = self.boot.total(num), self.boot.total(den)
        ests = self.boot.estimates(ratio(t_num, t_den), t_den[0].astype(np.int64), prompts, strata)
        for i, e in enumerate(ests):  # a fraction's interval ends within [0, 1]
            ests[i] = bounded(e)
        steps = np.bincount(cell[keep], minlength=n_cells)
        return ests.reshape(n_cells, N), steps


def flag_column(name: str) -> str:
    return f"tree_certified_m{name[6:]}" if name.startswith("tree_m") else f"certified_{name}"


@dataclass(frozen=True)
class MarginRow:
    """One margin bin of one domain (or of all): its steps and each certified fraction."""

    domain: str
    bin: str
    lo: float
    hi: float
    steps: int
    prompts: int
    fractions: tuple[Estimate, ...]  # one per :attr:`MarginTable.names`


@dataclass(frozen=True)
class MarginTable:
    """Certified fraction of steps per criterion and tree width, by bin of the target margin
    (top-1 minus top-2 probability at the step's root context), with prompt-clustered intervals."""

    edges: tuple[float, ...]
    names: tuple[str, ...]  # criteria, then tree widths (tree_m1 left out: it is greedy)
    rows: tuple[MarginRow, ...]  # all domains' bins first, then each domain's
    outside: int  # steps whose margin is missing or outside the edges (in no bin)
    source: str  # where the margins came from: "steps" or "root nodes"

    def grid(self, domain: str = ALL_DOMAINS) -> Grid:
        """The rows of one domain (or of all) as a table (terminal, Markdown, CSV)."""
        rows = tuple(
            (r.bin, r.steps, r.prompts, *r.fractions) for r in self.rows if r.domain == domain
        )
        key = "certified_by_margin" + ("" if domain == ALL_DOMAINS else f"_{domain}")
        return Grid(
            key,
            f"certified fraction of steps by target margin ({domain})",
            (
                Column("margin"),
                Column("steps"),
                Column("prompts"),
                *(Column(n) for n in self.names),
            ),
            rows,
            self.note,
        )

    def all_grid(self) -> Grid:
        """Every domain's rows in one table (the CSV)."""
        return Grid(
            "certified_by_margin",
            "certified fraction of steps by target margin",
            (
                Column("domain"),
                Column("margin"),
                Column("lo"),
                Column("hi"),
                Column("steps"),
                Column("prompts"),
                *(Column(n) for n in self.names),
            ),
            tuple(
                (r.domain, r.bin, r.lo, r.hi, r.steps, r.prompts, *r.fractions) for r in self.rows
            ),
            self.note,
        )

    @property
    def note(self) -> str:
        return (
            f"margin: target top-1 minus top-2 probability at the step's root context (from "
            f"{self.source}); a step is certified when KL(target || draft) < the criterion's "
            f"certificate; tree_m<m>: the m-wide tree covers the target's token. "
            f"Intervals: prompt-clustered bootstrap, stratified by domain."
            + (
                f" {self.outside} step(s) without a margin in the edges are in no bin."
                if self.outside
                else ""
            )
        )


def margin_table(
    steps: pd.DataFrame,
    clusters: StepClusters,
    edges: tuple[float, ...],
    names: list[str],
    source: str,
) -> MarginTable:
    """Certified fractions by margin bin, over all domains and per domain."""
    names = [n for n in names if n != "tree_m1" or "greedy" not in names]
    names = [n for n in names if flag_column(n) in steps.columns]
    flags = (
        np.column_stack(
            [steps[flag_column(n)].astype("float64").to_numpy(np.float64) for n in names]
        )
        if names
        else np.zeros((len(steps), 0))
    )
    codes = margin_bin_codes(steps["target_margin"].to_numpy(np.float64), edges)
    labels = margin_bin_labels(edges)
    domain = steps["domain"].astype(str).to_numpy()
    rows = []
    for label in [ALL_DOMAINS, *sorted(set(domain))]:
        cell = codes if label == ALL_DOMAINS else np.where(domain == label, codes, -1)
        ests, counts = clusters.fractions(flags, cell, len(labels))
        keep = cell >= 0
        for b, text in enumerate(labels):
            prompts = len(np.unique(clusters.prompt[keep & (codes == b)]))
            rows.append(
                MarginRow(
                    label, text, edges[b], edges[b + 1], int(counts[b]), prompts, tuple(ests[b])
                )
            )
    return MarginTable(edges, tuple(names), tuple(rows), int((codes < 0).sum()), source)


def criterion_order(name: str) -> tuple[int, str]:
    names = list(CRITERIA)
    return (names.index(name), name) if name in names else (len(names), name)


def certify_steps(run: Run) -> tuple[pd.DataFrame, str, list[str]]:
    """One row per step with the root-context margin, KL, certificates and acceptance columns.

    Columns come from the steps table when the run recorded them (``step_criteria_columns``),
    else from the depth-1 nodes (their context is the step's root context). For runs without
    theory columns the greedy certificate is rebuilt exactly from p0 and the margin, and greedy
    acceptance from the depth-1 node of sibling rank 0.
    """
    steps = run.steps.copy()
    nodes = run.nodes
    notes: list[str] = []
    key = ["prompt_id", "step"]
    roots = nodes[nodes["depth"] == 1].sort_values([*key, "sibling_rank"])
    first = roots.drop_duplicates(key)
    wanted = [
        c
        for c in first.columns
        if (c.startswith("cert_") or c in ("target_margin", "target_top1_prob", "kl_target_draft"))
        and c not in steps.columns
    ]
    if wanted:
        steps = steps.merge(first[key + wanted], on=key, how="left")
    if "accept_greedy" not in steps.columns and len(first):
        top = first[first["sibling_rank"] == 0][key + ["greedy_accept"]]
        steps = steps.merge(
            top.rename(columns={"greedy_accept": "accept_greedy"}), on=key, how="left"
        )
    source = "steps" if any(c.startswith("certified_") for c in run.steps.columns) else "nodes"
    if "cert_greedy" not in steps.columns and {"target_top1_prob", "target_margin"} <= set(steps):
        p0 = steps["target_top1_prob"].to_numpy(np.float64)
        p1 = p0 - steps["target_margin"].to_numpy(np.float64)
        steps["cert_greedy"] = _two_point(p0, p1)
        source = "rebuilt from p0 and margin (greedy only)"
        notes.append(
            "this run recorded no certificate columns: only strict greedy is rebuilt "
            "(from target_top1_prob and target_margin); record with the theory columns "
            "for the relaxed criteria and trees"
        )
    for name in [c[5:] for c in steps.columns if c.startswith("cert_")]:
        cert_col, flag = (
            f"cert_{name}",
            (
                f"certified_{name}"
                if not name.startswith("tree_m")
                else f"tree_certified_m{name[6:]}"
            ),
        )
        if flag not in steps.columns and "kl_target_draft" in steps.columns:
            steps[flag] = steps["kl_target_draft"] < steps[cert_col]
    steps = steps.sort_values(["domain", *key]).reset_index(drop=True)
    return steps, source, notes


def _two_point(p0: np.ndarray, p1: np.ndarray) -> np.ndarray:
    """Strict greedy certificate p0 log(2 p0 / (p0 + p1)) + p1 log(2 p1 / (p0 + p1))."""
    s = p0 + p1
    return perspective(p0 - p1, s)


def quantile(x: np.ndarray, q: float) -> float:
    """Linear-interpolation quantile (numpy's default) that tolerates +inf values."""
    if not len(x):
        return math.nan
    x = np.sort(x)
    pos = q * (len(x) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi or x[lo] == x[hi]:
        return float(x[lo])
    return float(x[lo] + (x[hi] - x[lo]) * (pos - lo))


def run_lengths(flags: Any) -> list[int]:
    """Lengths of maximal blocks of consecutive True values."""
    out, n = [], 0
    for f in flags:
        if f:
            n += 1
        elif n:
            out.append(n)
            n = 0
    if n:
        out.append(n)
    return out


def _summaries(
    steps: pd.DataFrame, names: list[str], kind: str, clusters: StepClusters
) -> pd.DataFrame:
    rows = []
    groups = [(ALL_DOMAINS, steps)] + list(steps.groupby("domain", sort=True))
    for domain, df in groups:
        cell = np.full(len(steps), -1)
        cell[df.index.to_numpy()] = 0
        for name in names:
            cert = df[f"cert_{name}"].to_numpy(np.float64)
            cert = cert[~np.isnan(cert)]  # +inf (nothing can be rejected) stays in
            row: dict[str, Any] = {
                "domain": domain,
                kind: name,
                "n": int(len(cert)),
                "median": quantile(cert, 0.5),
                "p5": quantile(cert, 0.05),
            }
            if kind == "criterion":
                ok_col, cert_flag = f"accept_{name}", f"certified_{name}"
            else:
                m = name[6:]
                ok_col, cert_flag = f"tree_covered_m{m}", f"tree_certified_m{m}"
            ok = df[ok_col].astype("boolean") if ok_col in df else None
            certified = df[cert_flag].astype("boolean") if cert_flag in df else None
            for col, flag in (("frac_ok", ok_col), ("frac_certified", cert_flag)):
                est = (
                    clusters.fractions(steps[flag].astype("float64").to_numpy(np.float64), cell, 1)[
                        0
                    ][0, 0]
                    if flag in df
                    else None
                )
                row[col] = est.value if est is not None else math.nan
                row[f"{col}_lo"] = est.lo if est is not None else math.nan
                row[f"{col}_hi"] = est.hi if est is not None else math.nan
            row["violations"] = (
                int((certified & ~ok).sum())
                if ok is not None and certified is not None
                else math.nan
            )
            if certified is not None:
                runs = [
                    n
                    for _, g in df.groupby("prompt_id", sort=False)
                    for n in run_lengths(g.sort_values("step")[cert_flag].fillna(False))
                ]
                row["run_mean"] = float(np.mean(runs)) if runs else 0.0
                row["run_max"] = int(max(runs)) if runs else 0
            else:
                row["run_mean"] = row["run_max"] = math.nan
            rows.append(row)
    return pd.DataFrame(rows)


def certify_run(
    run: Run,
    margin_bins: tuple[float, ...] | None = DEFAULT_MARGIN_BINS,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    require_margins: bool = False,
) -> CertifyReport:
    """Certificate distributions, certified fractions (with prompt-clustered intervals) and run
    lengths, soundness, tree coverage, and certified fractions by target-margin bin.

    ``run`` comes from :func:`specscope.records.load_run`. Statistics are over steps (the root
    context of each step's tree), per domain and over all domains (``domain == "all"``). The
    margin of a step comes from the steps table, or for older runs from its root nodes; a run with
    neither gets no margin table (a note says why), or a :class:`MarginDataError` naming the
    missing columns when ``require_margins``. ``margin_bins`` None: no margin table.
    """
    if margin_bins is not None:
        margin_bins = check_margin_bins(margin_bins)
    with counting("certifying", "stages", 3) as advance:
        steps, source, notes = certify_steps(run)
        names = [c[5:] for c in steps.columns if c.startswith("cert_")]
        crit_names = sorted((n for n in names if not n.startswith("tree_m")), key=criterion_order)
        tree_names = sorted((n for n in names if n.startswith("tree_m")), key=lambda n: int(n[6:]))
        clusters = StepClusters.of(steps, n_boot, seed, confidence)
        advance()
        criteria = (
            _summaries(steps, crit_names, "criterion", clusters) if crit_names else pd.DataFrame()
        )
        advance()
        trees = _summaries(steps, tree_names, "tree", clusters) if tree_names else pd.DataFrame()
        advance()
    margins = None
    if margin_bins is not None:
        flags = [c for c in map(flag_column, crit_names + tree_names) if c in steps.columns]
        missing = [c for c in ("target_margin",) if c not in steps.columns or steps[c].isna().all()]
        if not flags:
            missing.append("kl_target_draft (or certified_<criterion> flags)")
        if missing:
            why = (
                f"{run.path}: no margin table: the steps record no {' and no '.join(missing)}"
                f" and there are no node records to take them from (root nodes share the "
                f"step's context); measure the run again with this version"
            )
            if require_margins:
                raise MarginDataError(why)
            notes.append(why)
        else:
            margin_source = "steps" if "target_margin" in run.steps.columns else "root nodes"
            margins = margin_table(
                steps, clusters, margin_bins, crit_names + tree_names, margin_source
            )
    rows = []
    for (name, stat), value in PUBLISHED.items():
        table, col = (trees, "tree") if name.startswith("tree_m") else (criteria, "criterion")
        ours = {}
        if len(table) and name in set(table[col]):
            sel = table[table[col] == name].set_index("domain")[stat]
            ours = sel.to_dict()
        rows.append(
            {
                "certificate": name,
                "statistic": stat,
                "published": value,
                "ceiling": CEILINGS.get(name, math.nan),
                **{f"ours_{d}": v for d, v in ours.items()},
            }
        )
    if not crit_names and not tree_names:
        notes.append("no certificates found in this run")
    config = criteria_config_from_manifest(run.manifest)
    return CertifyReport(
        criteria, trees, pd.DataFrame(rows), steps, source, config, tuple(notes), margins
    )


def plot_certificates(
    report: CertifyReport, out_dir: str | Path, inside: Path | None = None
) -> list[Path]:
    """Certificate vs target margin per criterion and tree m, with the margin-only bound and the
    ceiling; writes certificates_vs_margin.png and .svg into out_dir (needs matplotlib) through
    :func:`specscope.files.write_output` (``inside``: the run directory out_dir lies in)."""
    try:
        import matplotlib  # the plot extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MissingExtraError("plots need matplotlib: pip install 'specscope[plot]'") from e

    steps = report.steps
    names = [c[5:] for c in steps.columns if c.startswith("cert_")]
    names = sorted((n for n in names if not n.startswith("tree_m")), key=criterion_order) + sorted(
        (n for n in names if n.startswith("tree_m")), key=lambda n: int(n[6:])
    )
    if not names or "target_margin" not in steps:
        return []
    specs = {s.name: s for s in (*report.config.criteria, *report.config.trees)}
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    grid = np.linspace(0.0, 1.0, 201)
    domains = sorted(steps["domain"].unique())
    for ax, name in zip(axes.flat, names, strict=False):
        for domain in domains:
            df = steps[(steps["domain"] == domain) & np.isfinite(steps[f"cert_{name}"])]
            ax.scatter(df["target_margin"], df[f"cert_{name}"], s=4, alpha=0.4, label=domain)
        spec = specs.get(name)
        if spec is not None:
            ax.plot(grid, margin_bound(grid, spec), color="black", lw=1, label="margin bound")
        if name in CEILINGS:
            ax.axhline(CEILINGS[name], color="grey", ls="--", lw=1, label="ceiling")
        if (name, "median") in PUBLISHED:
            ax.axhline(
                PUBLISHED[name, "median"], color="red", ls=":", lw=1, label="published median"
            )
        ax.set_title(name)
        ax.set_xlabel("target margin p0 - p1")
        ax.set_ylabel("certificate (nats)")
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7, markerscale=2)
    fig.tight_layout()
    out_dir = Path(out_dir)
    paths = [out_dir / "certificates_vs_margin.png", out_dir / "certificates_vs_margin.svg"]
    for path in paths:
        image = io.BytesIO()
        fig.savefig(image, format=path.suffix[1:], dpi=150)
        write_output(path, image.getvalue(), inside)
    plt.close(fig)
    return paths


def plot_margin_table(
    report: CertifyReport, out_dir: str | Path, inside: Path | None = None
) -> list[Path]:
    """The certified fraction by margin bin (:func:`specscope.analysis.plots.certified_by_margin_plot`)
    as certified_by_margin.png and .svg in out_dir; [] without a margin table."""
    if report.margins is None:
        return []
    if plots_unavailable():
        raise MissingExtraError("plots need matplotlib: pip install 'specscope[plot]'")
    return write_figure(
        certified_by_margin_plot(report.margins), out_dir, "certified_by_margin", inside
    )


# --- the report's tables and files -----------------------------------------------------------------

SUMMARY_COLUMNS = ("n", "median", "p5", "frac_ok", "frac_certified", "run_mean", "run_max")


def _fraction(row: dict, col: str) -> str:
    """A certified fraction with its interval where it has one; a dash where there is none."""
    value, lo, hi = row[col], row[f"{col}_lo"], row[f"{col}_hi"]
    if not math.isfinite(value):
        return "—"
    interval = f" [{lo:.3f}, {hi:.3f}]" if math.isfinite(lo) and math.isfinite(hi) else ""
    return f"{value:.3f}{interval}"


def _summary_row(row: dict, key: str) -> tuple:
    violations = row["violations"]
    return (
        row["domain"],
        row[key],
        *(_fraction(row, c) if c.startswith("frac_") else row[c] for c in SUMMARY_COLUMNS),
        "n/a" if violations != violations else int(violations),
    )


def summary_grid(df: pd.DataFrame, title: str, key: str) -> Grid | None:
    """Per (domain, ``key``) rows of :attr:`CertifyReport.criteria` (``key`` "criterion") or
    :attr:`CertifyReport.trees` (``key`` "tree") as a table; None when there are none."""
    if not len(df):
        return None
    names = {"frac_ok": "accepted" if key == "criterion" else "covered"}
    names["frac_certified"] = "certified"
    columns = (
        Column("domain"),
        Column(key),
        *(Column(names.get(c, c)) for c in SUMMARY_COLUMNS),
        Column("violations"),
    )
    rows = tuple(_summary_row(r._asdict(), key) for r in df.itertuples(index=False))
    return Grid(f"{key}_certificates", title, columns, rows)


def published_grid(report: CertifyReport) -> Grid:
    """The published figures beside this run's."""
    df = report.published
    return Grid(
        "published_comparison",
        "published (Qwen3-1.7B, UltraChat, greedy) vs this run",
        tuple(Column(c) for c in df.columns),
        tuple(tuple(row) for row in df.itertuples(index=False)),
    )


def certify_grids(report: CertifyReport, confidence: float) -> list[Grid]:
    """What ``specscope certify`` shows, in order: acceptance certificates, tree coverage, the
    certified fraction by margin bin (all domains), the published figures."""
    grids = [
        summary_grid(
            report.criteria,
            f"acceptance certificates per step (nats; source: {report.source}; fractions with "
            f"{confidence:.0%} prompt-clustered intervals)",
            "criterion",
        ),
        summary_grid(report.trees, "tree coverage certificates per step (nats)", "tree"),
        report.margins.grid() if report.margins is not None else None,
        published_grid(report),
    ]
    return [g for g in grids if g is not None]


@dataclass(frozen=True)
class CertifyFiles:
    """What :func:`write_certify_outputs` wrote."""

    tables: tuple[Path, ...]  # certificates, tree certificates, published comparison (CSV)
    margins: tuple[Path, ...]  # certified_by_margin.csv and .md; none without margins
    plots: tuple[Path, ...]  # PNG and SVG; none without plots


def write_margin_tables(report: CertifyReport, out: Path, inside: Path | None) -> tuple[Path, ...]:
    """certified_by_margin.csv (every domain) and .md (one table per domain); none without a
    margin table."""
    if report.margins is None:
        return ()
    from .render import to_csv, to_markdown

    m = report.margins
    csv_path, md_path = out / "certified_by_margin.csv", out / "certified_by_margin.md"
    write_output(csv_path, to_csv(m.all_grid()), inside)
    domains = dict.fromkeys(r.domain for r in m.rows)
    write_output(md_path, "\n".join(to_markdown(m.grid(d)) for d in domains), inside)
    return csv_path, md_path


def write_certify_outputs(
    report: CertifyReport, out: str | Path, plots: bool, inside: Path | None = None
) -> CertifyFiles:
    """The report's tables as CSV (and Markdown by margin bin) in ``out``, and with ``plots`` its
    plots (needs matplotlib: :class:`~specscope.errors.MissingExtraError`), written through
    :func:`specscope.files.write_output` (``inside``: the run directory ``out`` lies in)."""
    out = Path(out)
    tables = []
    for name, df in (
        ("certificates", report.criteria),
        ("tree_certificates", report.trees),
        ("published_comparison", report.published),
    ):
        tables.append(out / f"{name}.csv")
        write_output(tables[-1], df.to_csv(index=False), inside)
    margins = write_margin_tables(report, out, inside)
    drawn = ()
    if plots:
        drawn = (*plot_certificates(report, out, inside), *plot_margin_table(report, out, inside))
    return CertifyFiles(tuple(tables), margins, tuple(drawn))
