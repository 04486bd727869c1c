"""What a run delivers when decoded, in the analysis and its outputs: decoded tokens per step,
domain's effect at three levels, the findings with their levels, and (asked for) the predictor
scorecard; the report shows them and the first screen plots the decoded figure."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lab.synthetic import write_synthetic_run
from specscope.analysis import Settings, analyze, delivered_grids
from specscope.analysis.levels import BUDGET_KEY
from specscope.analysis.plots import DECODED_TOKENS_PER_STEP, _tokens_rows
from specscope.analysis.replay import MeasuredTree, index_records, replay_counts
from specscope.analysis.report import run_grids, write_outputs


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return write_synthetic_run(
        tmp_path_factory.mktemp("delivered") / "run", prompts_per_domain=12, steps=(10, 30), seed=5
    )


@pytest.fixture(scope="module")
def analysis(run):
    return analyze(run, Settings(n_boot=100, seed=0))


def test_decoded_tokens_per_step_is_the_replay_of_the_runs_trees(run, analysis):
    d = analysis.delivered
    assert d is not None and d.scorecard is None  # predictors are asked for, not computed
    rec = index_records(run)
    counts = replay_counts(rec, MeasuredTree())
    pooled = next(r for r in d.decoded.rows if r.domain == "All")
    assert pooled.positions == counts.positions.sum() and pooled.steps == counts.steps.sum()
    assert pooled.decoded.value == pytest.approx(counts.positions.sum() / counts.steps.sum())
    # the position mean is the analysis' own tau, and overstates decoding
    tau = next(r for r in analysis.tau if r.domain == "All")
    assert pooled.position_mean.value == pytest.approx(tau.tau.value)
    assert pooled.decoded.value < pooled.position_mean.value


def test_levels_and_findings_carry_their_level(analysis):
    d = analysis.delivered
    assert [s.level for s in d.levels.shares][-2:] == ["step", "prompt"]
    keys = [f.finding.key for f in d.findings]
    assert keys[:-1] == [f.key for f in analysis.findings] and keys[-1] == BUDGET_KEY
    assert all(f.level != "unknown" for f in d.findings)


def test_outputs_and_report_hold_what_the_run_delivers(analysis, tmp_path):
    keys = [g.key for g in run_grids(analysis)]
    for key in ("decoded_tokens_per_step", "level_shares", "domain_effect", "level_findings"):
        assert key in keys
    assert [g.key for g in delivered_grids(analysis)] == keys[-4:]
    label, rows = _tokens_rows(analysis)
    assert label == DECODED_TOKENS_PER_STEP
    assert [v.value for _, v in rows] == [r.decoded.value for r in analysis.delivered.decoded.rows]
    out = write_outputs(analysis, tmp_path / "out", plots=False)
    saved = json.loads(out.json.read_text())
    assert saved["delivered"]["decoded"]["rows"][-1]["domain"] == "All"
    page = out.html.read_text()
    assert "Decoded tokens per step" in page and "What domain explains" in page
    assert (tmp_path / "out" / "csv" / "level_shares.csv").is_file()


@pytest.mark.slow
def test_the_scorecard_when_asked_for(run, tmp_path):
    a = analyze(run, Settings(n_boot=100, seed=0), predictors=True)
    card = a.delivered.scorecard
    assert card is not None
    best = card.best("node")
    assert best is not None and 0.5 < best.auroc.value <= 1
    keys = [g.key for g in run_grids(a)]
    assert "scorecard_node" in keys and "scorecard_prefix" in keys
    out = write_outputs(a, tmp_path / "out", plots=True)
    assert "reliability" in [p.name for p in out.plots]
    assert np.isfinite(best.brier.value)
