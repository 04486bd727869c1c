"""``specscope certify``: certificates of acceptance over a recorded run: their distributions per
domain, the steps they certify, soundness (no certified step rejected), tree coverage, the
published figures beside this run's, and a plot of certificate against target margin.

Reads the columns :mod:`specscope.theory` wrote during measurement (or recomputes the margin-only
bounds from the node records); computes no certificate of its own.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import MissingExtraError
from ..files import write_output
from ..records import ALL_DOMAINS, Run
from ..theory import (
    CRITERIA,
    CriteriaConfig,
    criteria_config_from_manifest,
    margin_bound,
    perspective,
)

# --- certify: reports over recorded runs --------------------------------------------------------

# The published figures of the certificates paper: Qwen3-1.7B on UltraChat, greedy.
PUBLISHED: dict[tuple[str, str], float] = {
    ("greedy", "median"): 0.559,
    ("greedy", "p5"): 0.006,
    ("tree_m2", "median"): 0.962,
    ("tree_m4", "median"): 1.456,
    ("tree_m8", "median"): 2.038,
}
CEILINGS: dict[str, float] = {"greedy": math.log(2), **{
    f"tree_m{m}": math.log(m + 1) for m in (1, 2, 4, 8)}}


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

    @property
    def violations(self) -> int:
        """Steps certified but rejected (or uncovered): must be zero."""
        total = 0
        for df in (self.criteria, self.trees):
            if len(df):
                total += int(df.loc[df["domain"] == ALL_DOMAINS, "violations"].fillna(0).sum())
        return total


def _criterion_order(name: str) -> tuple[int, str]:
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
    wanted = [c for c in first.columns
              if (c.startswith("cert_") or c in ("target_margin", "target_top1_prob",
                                                   "kl_target_draft")) and c not in steps.columns]
    if wanted:
        steps = steps.merge(first[key + wanted], on=key, how="left")
    if "accept_greedy" not in steps.columns and len(first):
        top = first[first["sibling_rank"] == 0][key + ["greedy_accept"]]
        steps = steps.merge(top.rename(columns={"greedy_accept": "accept_greedy"}), on=key,
                            how="left")
    source = "steps" if any(c.startswith("certified_") for c in run.steps.columns) else "nodes"
    if "cert_greedy" not in steps.columns and {"target_top1_prob", "target_margin"} <= set(steps):
        p0 = steps["target_top1_prob"].to_numpy(np.float64)
        p1 = p0 - steps["target_margin"].to_numpy(np.float64)
        steps["cert_greedy"] = _two_point(p0, p1)
        source = "rebuilt from p0 and margin (greedy only)"
        notes.append("this run recorded no certificate columns: only strict greedy is rebuilt "
                     "(from target_top1_prob and target_margin); record with the theory columns "
                     "for the relaxed criteria and trees")
    for name in [c[5:] for c in steps.columns if c.startswith("cert_")]:
        cert_col, flag = f"cert_{name}", (f"certified_{name}" if not name.startswith("tree_m")
                                          else f"tree_certified_m{name[6:]}")
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


def _summaries(steps: pd.DataFrame, names: list[str], kind: str) -> pd.DataFrame:
    rows = []
    groups = [(ALL_DOMAINS, steps)] + list(steps.groupby("domain", sort=True))
    for domain, df in groups:
        for name in names:
            cert = df[f"cert_{name}"].to_numpy(np.float64)
            cert = cert[~np.isnan(cert)]  # +inf (nothing can be rejected) stays in
            row: dict[str, Any] = {"domain": domain, kind: name, "n": int(len(cert)),
                                   "median": quantile(cert, 0.5), "p5": quantile(cert, 0.05)}
            if kind == "criterion":
                ok_col, cert_flag = f"accept_{name}", f"certified_{name}"
            else:
                m = name[6:]
                ok_col, cert_flag = f"tree_covered_m{m}", f"tree_certified_m{m}"
            ok = df[ok_col].astype("boolean") if ok_col in df else None
            certified = df[cert_flag].astype("boolean") if cert_flag in df else None
            row["frac_ok"] = float(ok.mean()) if ok is not None else math.nan
            row["frac_certified"] = float(certified.mean()) if certified is not None else math.nan
            row["violations"] = (int((certified & ~ok).sum()) if ok is not None and certified
                                 is not None else math.nan)
            if certified is not None:
                runs = [n for _, g in df.groupby("prompt_id", sort=False)
                        for n in run_lengths(g.sort_values("step")[cert_flag].fillna(False))]
                row["run_mean"] = float(np.mean(runs)) if runs else 0.0
                row["run_max"] = int(max(runs)) if runs else 0
            else:
                row["run_mean"] = row["run_max"] = math.nan
            rows.append(row)
    return pd.DataFrame(rows)


def certify_run(run: Run) -> CertifyReport:
    """Certificate distributions, certified fractions and run lengths, soundness, tree coverage.

    ``run`` comes from :func:`specscope.records.load_run`. Statistics are over steps (the root
    context of each step's tree), per domain and over all domains (``domain == "all"``).
    """
    steps, source, notes = certify_steps(run)
    names = [c[5:] for c in steps.columns if c.startswith("cert_")]
    crit_names = sorted((n for n in names if not n.startswith("tree_m")), key=_criterion_order)
    tree_names = sorted((n for n in names if n.startswith("tree_m")), key=lambda n: int(n[6:]))
    criteria = _summaries(steps, crit_names, "criterion") if crit_names else pd.DataFrame()
    trees = _summaries(steps, tree_names, "tree") if tree_names else pd.DataFrame()
    rows = []
    for (name, stat), value in PUBLISHED.items():
        table, col = (trees, "tree") if name.startswith("tree_m") else (criteria, "criterion")
        ours = {}
        if len(table) and name in set(table[col]):
            sel = table[table[col] == name].set_index("domain")[stat]
            ours = sel.to_dict()
        rows.append({"certificate": name, "statistic": stat, "published": value,
                     "ceiling": CEILINGS.get(name, math.nan), **{
                         f"ours_{d}": v for d, v in ours.items()}})
    if not crit_names and not tree_names:
        notes.append("no certificates found in this run")
    config = criteria_config_from_manifest(run.manifest)
    return CertifyReport(criteria, trees, pd.DataFrame(rows), steps, source, config, tuple(notes))


def plot_certificates(report: CertifyReport, out_dir: str | Path,
                      inside: Path | None = None) -> list[Path]:
    """Certificate vs target margin per criterion and tree m, with the margin-only bound and the
    ceiling; writes certificates_vs_margin.png and .svg into out_dir (needs matplotlib) through
    :func:`specscope.files.write_output` (``inside``: the run directory out_dir lies in)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MissingExtraError("plots need matplotlib: pip install 'specscope[plot]'") from e

    steps = report.steps
    names = [c[5:] for c in steps.columns if c.startswith("cert_")]
    names = sorted((n for n in names if not n.startswith("tree_m")), key=_criterion_order) + sorted(
        (n for n in names if n.startswith("tree_m")), key=lambda n: int(n[6:]))
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
            ax.axhline(PUBLISHED[name, "median"], color="red", ls=":", lw=1,
                       label="published median")
        ax.set_title(name)
        ax.set_xlabel("target margin p0 - p1")
        ax.set_ylabel("certificate (nats)")
    for ax in list(axes.flat)[len(names):]:
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


