"""analysis/budgets: per-domain budgets against per-node stops at matched drafting cost. Exact
draft passes and steps on hand-walked records, the time-sharing hull, the verdict's
false-positive rate on synthetic records where the two are equal by construction, and the
comparison through ``specscope analyze --predictors``."""

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from conftest import rate_at_most
from lab.synthetic import synthetic_stop_frames
from specscope.analysis.budgets import (
    MATCHED,
    _pick,
    compare_budgets,
    draft_passes,
    setting_sums,
)
from specscope.analysis.findings import Verdict
from specscope.analysis.prepare import ALL
from specscope.analysis.replay import ReplayRecords, StopRule, accepted_lengths, top_chain
from specscope.analysis.results import Settings
from specscope.cli import app

# per prompt: each step's (greedy_accept, p_draft) of a chain of two nodes
CODE = [((1, 1), (0.9, 0.3)), ((1, 0), (0.9, 0.3)), ((0, 0), (0.2, 0.9)), ((1, 1), (0.9, 0.9))]
CHAT = [((1, 1), (0.9, 0.9))] * 3


def _records() -> ReplayRecords:
    nodes, steps = [], []
    for pid, domain, walk in (("a", "code", CODE), ("b", "chat", CHAT)):
        for step, (accepts, probs) in enumerate(walk):
            steps.append(dict(prompt_id=pid, domain=domain, step=step, accepted_len=0))
            for k in range(2):
                nodes.append(dict(prompt_id=pid, step=step, node_id=k, parent_id=k - 1,
                                  depth=k + 1, sibling_rank=0, greedy_accept=bool(accepts[k]),
                                  p_draft=probs[k], draft_entropy=1 - probs[k]))  # fmt: skip
    return ReplayRecords.from_frames(pd.DataFrame(nodes), pd.DataFrame(steps))


def test_draft_passes_and_steps_by_hand():
    rec = _records()
    stop = StopRule(top_chain(2), p_min=0.5)
    # a stop is seen by the pass that drafts the stopped node: it costs that pass
    for candidate, passes in ((top_chain(2), [2] * 7), (stop, [2, 2, 1, 2, 2, 2, 2])):
        assert draft_passes(rec, candidate, accepted_lengths(rec, candidate)[2]).tolist() == passes
    sums = setting_sums(rec, [top_chain(1), top_chain(2), stop, StopRule(top_chain(2), h_max=0.5)])
    # code, chain(1): accepted 1, 1, 0, 1 -> steps at 0 (2 tokens), 2 (1), 3 (1)
    # code, chain(2): accepted 2, 1, 0, 2 -> steps at 0 (3 tokens), 3 (1, the output's end)
    # code, stop: accepted 1, 1, 0, 2 -> steps at 0 (node 2 stopped: 2 passes, 1 node),
    #   2 (node 1 stopped: 1 pass, 0 nodes), 3 (2 passes, 2 nodes)
    # chat (3 positions, all accepted): chain(1) 2 steps; chain(2) and the stops 1 step
    assert sums.positions.tolist() == [4, 3]
    assert sums.steps.tolist() == [[3, 2, 3, 3], [2, 1, 1, 1]]
    assert sums.passes.tolist() == [[3, 4, 5, 5], [2, 2, 2, 2]]
    assert sums.nodes.tolist() == [[3, 4, 3, 3], [2, 2, 2, 2]]
    assert sums.stops.tolist() == [False, False, True, True]


def test_matched_cost_interpolates_on_the_hull():
    # (draft passes, steps) of three settings; the middle one lies above the chord: dropped
    front = (np.array([10.0, 15.0, 20.0]), np.array([10.0, 9.0, 6.0]), np.array([[0], [1], [2]]))
    picked = _pick(front, 20.0, MATCHED[0], 0.75)  # 15 passes: halfway from setting 0 to 2
    assert [(w, int(c[0])) for w, c in picked] == [(0.5, 0), (0.5, 2)]
    assert _pick(front, 20.0, MATCHED[0], 0.4) is None  # below the cheapest setting's cost
    picked = _pick(front, 20.0, MATCHED[1], 2.5)  # 8 steps: a third of the way from 0 to 2
    assert [(round(w, 6), int(c[0])) for w, c in picked] == [(0.5, 0), (0.5, 2)]


def _verdicts(world: str, reps: int, prompts: int = 10, steps: int = 12) -> dict:
    counts = {v: 0 for v in Verdict}
    for seed in range(reps):
        nodes, frame = synthetic_stop_frames(world, prompts, seed, steps=steps)
        rec = ReplayRecords.from_frames(nodes, frame)
        c = compare_budgets(rec, Settings(n_boot=60, seed=seed), scopes="pooled")
        counts[c.verdict(ALL).verdict] += 1
    return counts


@pytest.mark.calibration
def test_stop_verdict_false_positive_rate():
    # two worlds where the stop and the per-domain budget are equal by construction (domains
    # alike): "equal", one constant draft probability (every stop is a plain chain: the budget
    # has more settings to choose from), and "noise", a draft probability unrelated to
    # acceptance (the stop has more: 57 settings, each dominated by the chains). Nominal 2.5%
    # one-sided; each world's exact bound at most 5% (59 worlds, none may say holds)
    reps = 59
    for world in ("equal", "noise"):
        counts = _verdicts(world, reps)
        assert rate_at_most(counts[Verdict.HOLDS], reps) <= 0.05, (world, counts)


@pytest.mark.calibration
def test_stop_verdict_power():
    # a calibrated draft probability (a stop cuts the nodes likely to fail: it truly pays,
    # about +0.02 tokens per step at matched draft passes) at the deep tree's size, 30 prompts
    # per domain: holds in most worlds (19 of 20 when written)
    counts = _verdicts("informative", 20, prompts=30, steps=20)
    assert counts[Verdict.HOLDS] >= 15, counts


@pytest.mark.slow  # analyze --predictors on a shipped run: about 11 s
def test_shipped_run_through_the_cli(tmp_path):
    out = tmp_path / "analysis"
    result = CliRunner().invoke(
        app,
        ["analyze", "results/demo-pair/paper-protocol", "--predictors", "--n-boot", "50",
         "--no-plots", "--show", "none", "-o", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "csv" / "budget_verdicts.csv")
    assert set(table["Scope"]) == {"chat", "code", "math", "reasoning", ALL}
    assert "budgets" in (out / "tables.md").read_text()
