"""Findings across tree shapes (analysis/shapes.py) and the grids of the level-wise effects
(analysis/level_grids.py), on small synthetic runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lab.calibration import FLAT
from lab.synthetic import DomainProfile, synthetic_tables
from specscope.analysis.effects import variance_decomposition
from specscope.analysis.findings import Verdict
from specscope.analysis.level_grids import (
    domain_effect_grid,
    level_findings_grid,
    level_shares_grid,
    shape_changes_grid,
    shape_figures_grid,
    shape_verdicts_grid,
)
from specscope.analysis.levels import budget_finding, level_effects
from specscope.analysis.prepare import prepare
from specscope.analysis.render import to_csv, to_markdown
from specscope.analysis.resampling import Resampler
from specscope.analysis.results import Settings
from specscope.analysis.shapes import (
    CHAIN,
    DECODED,
    GREEDY,
    LOWEST,
    MEASURED,
    ORDERING,
    TAU,
    VERDICT,
    ShapesError,
    compare_shapes,
    shape_changes,
    top1_chain,
)
from specscope.records import Run

SETTINGS = Settings(n_boot=100)
# a spine: a chain of 4 whose every node has a rank-1 sibling
SPINE_PARENTS = (-1, -1, 0, 0, 2, 2, 4, 4)
SPINE_RANKS = (0, 1, 0, 1, 0, 1, 0, 1)


def _records(seed: int, chat: DomainProfile, **kwargs):
    profiles = {"chat": chat, "code": FLAT, "math": FLAT, "reasoning": FLAT}
    tables = synthetic_tables(
        prompts_per_domain=12, steps=16, seed=seed, profiles=profiles, **kwargs
    )
    nodes, steps, prompts = (t.to_pandas() for t in tables)
    return prepare(
        Run(Path(f"s{seed}"), {"run_id": f"s{seed}", "status": "complete"}, nodes, steps, prompts)
    )


@pytest.fixture(scope="module")
def low_chat():
    return _records(1, DomainProfile(0.30, 0.15, 1.0))


@pytest.fixture(scope="module")
def high_chat():
    return _records(2, DomainProfile(0.85, 0.40, 1.0), parents=SPINE_PARENTS, ranks=SPINE_RANKS)


def test_top1_chain_keeps_the_rank_0_path_and_its_tau(low_chat):
    chain = top1_chain(low_chat)
    nodes = chain.nodes
    assert (nodes.rank == 0).all() and chain.n_ranks == 1
    assert len(nodes) == int(low_chat.nodes.on_chain.sum())
    assert chain.max_depth == 3  # the paper tree's rank-0 path: 0 -> 2 -> 6
    expected = low_chat.steps.chain_len + 1
    assert np.array_equal(chain.steps.tau, expected.astype(np.int64))
    assert (chain.steps.tau <= low_chat.steps.tau).all()


def test_decoded_tokens_per_step_are_the_replay_of_each_shape(low_chat):
    """Each shape's decoded figure is its trees replayed as greedy decoding (the measured tree, or
    the top-1 chain as deep as the run's), the same point as :func:`replay` gives."""
    from specscope.analysis.replay import MeasuredTree, replay, top_chain

    measured, chain = compare_shapes([("a", low_chat)], SETTINGS).shapes
    for result, candidate in ((measured, MeasuredTree()), (chain, top_chain(3))):
        replayed = replay(low_chat.run, candidate)
        for domain in low_chat.domains:
            got = result.figure(domain, DECODED)
            assert got.value == pytest.approx(replayed.row(domain).tokens_per_step.value)
            assert got.lo < got.value < got.hi
    # a chain decodes fewer tokens per step than the tree it is part of, and the position mean
    # overstates decoding
    for domain in low_chat.domains:
        assert chain.figure(domain, DECODED).value <= measured.figure(domain, DECODED).value
        assert measured.figure(domain, DECODED).value <= measured.figure(domain, TAU).value


def test_a_domain_ordering_that_flips_between_trees_is_named(low_chat, high_chat):
    c = compare_shapes([("low", low_chat), ("high", high_chat)], SETTINGS)
    names = [r.shape for r in c.shapes]
    assert names == [f"low: {MEASURED}", f"low: {CHAIN}", f"high: {MEASURED}", f"high: {CHAIN}"]
    first, deep = c.shapes[0], c.shapes[2]
    assert first.ordering(GREEDY)[0] == "chat" and deep.ordering(GREEDY)[-1] == "chat"
    lowest = [r.verdict(LOWEST + GREEDY).verdict for r in c.shapes]
    assert lowest[0] == Verdict.HOLDS and lowest[2] == Verdict.FAILS
    changed = {(ch.kind, ch.subject) for ch in c.changes}
    assert {(ORDERING, GREEDY), (ORDERING, TAU), (VERDICT, LOWEST + GREEDY)} <= changed
    flips = next(ch for ch in c.changes if ch.subject == GREEDY).flips
    chat_pairs = [f for f in flips if "chat" in (f.first, f.second)]
    assert chat_pairs and all(f.resolved for f in chat_pairs)
    # every shape holds the paper's domain findings, each with its level
    for r in c.shapes:
        assert {"only_chat_above_one", "chat_paradox", "task_type_over_depth_budget"} <= {
            v.key for v in r.verdicts
        }
        assert all(v.level and v.level != "unknown" for v in r.verdicts)


def test_the_same_shape_twice_changes_nothing(low_chat):
    c = compare_shapes([("a", low_chat), ("b", low_chat)], SETTINGS, chain=False)
    assert len(c.shapes) == 2 and c.changes == ()
    assert shape_changes(c.shapes) == ()
    assert c.shapes[0].figure("chat", TAU) == c.shapes[1].figure("chat", TAU)


def test_no_runs_is_an_error():
    with pytest.raises(ShapesError, match="at least one"):
        compare_shapes([])


def test_grids_render(low_chat, high_chat):
    c = compare_shapes([("low", low_chat), ("high", high_chat)], SETTINGS)
    eng = Resampler(low_chat, SETTINGS)
    lv = level_effects(eng, variance_decomposition(eng))
    finding = budget_finding(lv.budget, lv.domain_prompts, SETTINGS)
    grids = [
        level_shares_grid(lv),
        domain_effect_grid(lv),
        level_findings_grid((finding,)),
        shape_figures_grid(c),
        shape_verdicts_grid(c),
        shape_changes_grid(c),
    ]
    for g in grids:
        assert all(len(row) == len(g.columns) for row in g.rows), g.key
        assert g.key in to_markdown(g) or g.title in to_markdown(g)
        to_csv(g)
    assert len(grids[0].rows) == 4  # node alpha, node greedy, step, prompt
    assert len(grids[3].rows) == 4 * 4  # shapes x domains


def test_compare_shapes_through_the_command_line(tmp_path):
    """`specscope compare A B --shapes` prints and writes the findings across the runs' shapes."""
    from typer.testing import CliRunner

    from lab.synthetic import write_synthetic_run
    from specscope.cli import app

    runs = [
        write_synthetic_run(tmp_path / name, prompts_per_domain=10, steps=(8, 16), seed=seed)
        for name, seed in (("a", 1), ("b", 2))
    ]
    out = tmp_path / "cmp"
    result = CliRunner().invoke(
        app, ["compare", *map(str, runs), "--shapes", "--boot", "50", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    for key in ("shape_figures", "shape_verdicts", "shape_changes"):
        assert (out / "csv" / f"{key}.csv").is_file()
    figures = (out / "csv" / "shape_figures.csv").read_text()
    assert "a: measured tree" in figures and "b: top-1 chain" in figures
