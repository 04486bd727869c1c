"""Analysis: the paper's six tables, the corrected metrics, statistics, plots and reports.

Library use::

    from specscope.analysis import analyze, load_paper_tables, write_outputs

    a = analyze("runs/demo")                      # Analysis: typed tables with 95% intervals
    a.paper.table2                                # the paper's E[L] per domain, with intervals
    a.tau                                         # realized tokens per target pass
    [f.verdict for f in a.findings]               # the paper's claims, checked
    write_outputs(a, "runs/demo/analysis")        # Markdown, CSV, LaTeX, JSON, plots, HTML

Modules:

- ``stats`` (the prompt-clustered bootstrap), ``prepare`` (reading and checking records),
  ``results`` (the typed tables), ``resampling`` (the resamples one analysis shares);
- ``echo`` (prompt echo), ``effects`` (depth deltas, effect sizes, profiles), ``findings`` (the
  paper's claims and their verdicts), ``tables`` (every table and metric of a run);
- ``drafters`` (runs of several drafters on the same prompts: tau, proposals, chain acceptance,
  and the paired verdict "drafter A accepts more than B");
- ``paper`` (the published figures), ``render`` (terminal, Markdown, CSV, LaTeX, HTML tables),
  ``plots`` (matplotlib, optional), ``report`` (output files, HTML reports, comparisons);
- ``bench_stats`` (timed bench runs: speed-ups over plain with intervals over prompts and
  repeats, their precision, the regret of a choice), which ``specscope bench`` and the
  calibration (``lab/calibration.py``, outside the package) share;
- ``certify`` (``specscope certify``: certificates over a run) and ``stepwise`` (ingested
  engine logs), which no other module here imports.
"""

from __future__ import annotations

from pathlib import Path

from ..progress import counting
from .delivered import Delivered, deliver, delivered_grids
from .drafters import DrafterComparison, compare_drafters
from .findings import Finding, Verdict, evaluate_findings
from .paper import expected_length, load_paper_tables
from .prepare import ALL, Records, prepare, read_run
from .report import compare, compare_with_paper, write_outputs, write_report
from .results import Analysis, PaperTables, Settings
from .stats import EMPTY, ClusterBootstrap, Estimate
from .tables import analyze_records


def analyze(
    run_dir: str | Path,
    settings: Settings | None = None,
    stratify: str | None = "auto",
    predictors: bool = False,
) -> Analysis:
    """Read a run directory and compute its analysis (raises RunDirError on unusable records).

    ``stratify``: the node-level factor to repeat the per-domain tables and findings within
    (sibling_rank, depth, position_bin), "auto" (sibling_rank when the trees have several) or
    None; a factor the run lacks raises StratifyError, naming what is allowed. The analysis also
    holds what the run delivers when decoded (``Analysis.delivered``: decoded tokens per step,
    domain's effect at node, step and prompt level and, with ``predictors``, the scorecard of
    acceptance predictors: minutes on a large run, so off unless asked for).
    """
    with counting("analyzing", "stages", 3) as advance:
        rec = prepare(read_run(run_dir))
        advance()
        tables = analyze_records(rec, settings, stratify)
        advance()
        analysis = deliver(tables, rec, predictors)
        advance()
    return analysis


__all__ = [
    "ALL",
    "EMPTY",
    "Analysis",
    "ClusterBootstrap",
    "Delivered",
    "DrafterComparison",
    "Estimate",
    "Finding",
    "PaperTables",
    "Records",
    "Settings",
    "Verdict",
    "analyze",
    "analyze_records",
    "compare",
    "compare_drafters",
    "compare_with_paper",
    "deliver",
    "delivered_grids",
    "evaluate_findings",
    "expected_length",
    "load_paper_tables",
    "prepare",
    "read_run",
    "write_outputs",
    "write_report",
]
