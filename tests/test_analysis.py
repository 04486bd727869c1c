"""Analysis: the paper's tables, the corrected metrics, the bootstrap, findings, outputs, CLI.

The small run below is computed by hand: every expected number in the table tests is derived in
the comments from the node values listed in ``TINY_NODES``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps
from typer.testing import CliRunner

from lab.synthetic import (
    ESCAPE_PROBE,
    DomainProfile,
    write_synthetic_run,
)
from specscope.analysis import (
    ALL,
    ClusterBootstrap,
    Estimate,
    Settings,
    Verdict,
    analyze,
    expected_length,
    load_paper_tables,
)
from specscope.analysis.paper import paper_data
from specscope.analysis.render import analysis_grids, to_csv, to_latex, to_markdown
from specscope.analysis.report import (
    compare,
    compare_with_paper,
    to_jsonable,
    write_outputs,
    write_report,
)
from specscope.analysis.stats import (
    Ranked,
    eta_squared_prompt_reps,
    eta_squared_reps,
    explained_share_reps,
    pearson_reps,
    spearman_reps,
)
from specscope.cli import app
from specscope.records import (
    SCHEMA_VERSION,
    SCHEMAS,
    RunDir,
    RunDirError,
    to_table,
)

# --- a hand-computable run -------------------------------------------------------------------------
# Tree per step: node 0 (root, rank 0), node 1 (root, rank 1), node 2 (child of node 0, rank 0).
# (prompt, domain, step, node, parent, depth, rank, alpha, greedy, entropy)
TINY_NODES = [
    ("c1", "chat", 0, 0, -1, 1, 0, 1.0, True, 0.5),
    ("c1", "chat", 0, 1, -1, 1, 1, 0.2, False, 0.5),
    ("c1", "chat", 0, 2, 0, 2, 0, 0.5, False, 1.0),  # parent accepted, itself rejected
    ("c1", "chat", 40, 0, -1, 1, 0, 0.4, False, 1.5),  # step 40: position bin 1
    ("c1", "chat", 40, 1, -1, 1, 1, 0.6, True, 1.5),
    ("c1", "chat", 40, 2, 0, 2, 0, 0.8, True, 0.2),  # accepted, but its parent is not
    ("k1", "code", 0, 0, -1, 1, 0, 0.3, False, 2.0),
    ("k1", "code", 0, 1, -1, 1, 1, 0.1, False, 2.0),
    ("k1", "code", 0, 2, 0, 2, 0, 0.9, True, 0.3),
]
# accepted_len per step: c1/0 -> 1 (node 0), c1/40 -> 1 (node 1), k1/0 -> 0
TINY_STEPS = [("c1", "chat", 0, 1), ("c1", "chat", 40, 1), ("k1", "code", 0, 0)]
# "math" has a prompt but no records at all: its cells must be empty, never a number.
TINY_PROMPTS = [("c1", "chat"), ("k1", "code"), ("m1", "math")]


def node_columns(rows) -> dict[str, list]:
    cols: dict[str, list] = {f.name: [] for f in SCHEMAS["nodes"]}
    for p, d, s, n, par, depth, rank, alpha, greedy, h in rows:
        values = dict(
            run_id="tiny",
            drafter="draft-model",
            prompt_id=p,
            domain=d,
            step=s,
            position_bin=s // 32,
            node_id=n,
            parent_id=par,
            depth=depth,
            sibling_rank=rank,
            token_id=n,
            p_draft=0.5,
            p_target=0.5 * alpha,
            alpha=alpha,
            greedy_accept=greedy,
            target_entropy=h,
            draft_entropy=h,
            target_top1_prob=0.5,
            target_margin=0.1,
            kl_target_draft=0.1,
            target_rank=0 if greedy else 3,
        )
        for k in cols:
            cols[k].append(values[k])
    return cols


def step_columns(rows) -> dict[str, list]:
    cols: dict[str, list] = {f.name: [] for f in SCHEMAS["steps"]}
    for p, d, s, acc in rows:
        values = dict(
            run_id="tiny",
            drafter="draft-model",
            prompt_id=p,
            domain=d,
            step=s,
            position_bin=s // 32,
            context_len=10 + s,
            tree_size=3,
            emitted_token=1,
            accepted_len=acc,
            tau=acc + 1,
            draft_time_s=0.0,
            verify_time_s=0.0,
            step_time_s=0.0,
        )
        for k in cols:
            cols[k].append(values[k])
    return cols


def prompt_columns(rows) -> dict[str, list]:
    cols: dict[str, list] = {f.name: [] for f in SCHEMAS["prompts"]}
    for i, (p, d) in enumerate(rows):
        values = dict(
            run_id="tiny",
            prompt_id=p,
            domain=d,
            order=i,
            source="test",
            source_index=i,
            messages_json="[]",
            prompt_text=f"prompt {p} {ESCAPE_PROBE}",
            prompt_tokens=5,
            truncated=False,
            generated_tokens=2,
            output_token_ids=[1, 2],
            output_text="out",
            stop_reason="eos",
            time_s=0.0,
        )
        for k in cols:
            cols[k].append(values.get(k))
    return cols


def write_run(
    path: Path,
    nodes=TINY_NODES,
    steps=TINY_STEPS,
    prompts=TINY_PROMPTS,
    manifest: dict | None = None,
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    RunDir(path).write_table("nodes", to_table(node_columns(nodes), "nodes"))
    RunDir(path).write_table("steps", to_table(step_columns(steps), "steps"))
    RunDir(path).write_table("prompts", to_table(prompt_columns(prompts), "prompts"))
    RunDir(path).write_manifest(
        manifest
        or {"schema_version": SCHEMA_VERSION, "run_id": "tiny", "status": "complete", "config": {}}
    )
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    run = write_run(tmp_path_factory.mktemp("tiny") / "run")
    return analyze(run, Settings(n_boot=200, seed=1))


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory) -> Path:
    return write_synthetic_run(
        tmp_path_factory.mktemp("syn") / "run", prompts_per_domain=12, steps=(10, 40), seed=3
    )


@pytest.fixture(scope="module")
def synthetic(synthetic_run):
    return analyze(synthetic_run, Settings(n_boot=300, seed=0))


def approx(x, tol=1e-9):
    return pytest.approx(x, abs=tol)


CHAT_ALPHA = [1.0, 0.2, 0.5, 0.4, 0.6, 0.8]
CODE_ALPHA = [0.3, 0.1, 0.9]
CHAT_H = [0.5, 0.5, 1.0, 1.5, 1.5, 0.2]
CODE_H = [2.0, 2.0, 0.3]


# --- the paper's tables on the tiny run ------------------------------------------------------------


def test_table1_hand_computed(tiny):
    rows = {r.domain: r for r in tiny.paper.table1}
    assert [r.domain for r in tiny.paper.table1] == ["chat", "code", "math", ALL]
    assert rows["chat"].nodes == 6 and rows["code"].nodes == 3 and rows[ALL].nodes == 9
    assert rows["chat"].mean.value == approx(3.5 / 6)
    assert rows["chat"].std.value == approx(statistics.stdev(CHAT_ALPHA))  # ddof = 1
    assert rows["chat"].target_entropy.value == approx(5.2 / 6)
    assert rows["code"].mean.value == approx(1.3 / 3)
    assert rows["code"].target_entropy.value == approx(4.3 / 3)
    assert rows[ALL].mean.value == approx(4.8 / 9)
    assert rows[ALL].std.value == approx(statistics.stdev(CHAT_ALPHA + CODE_ALPHA))
    # math has no nodes: undefined, never a number
    assert rows["math"].nodes == 0
    assert not rows["math"].mean.defined and not rows["math"].std.defined


def test_tables_2_3_4_hand_computed(tiny):
    t4 = {r.domain: r for r in tiny.paper.table4}
    # chat depth 1: (1.0 + 0.2 + 0.4 + 0.6) / 4 = 0.55; depth 2: (0.5 + 0.8) / 2 = 0.65
    assert [e.value for e in t4["chat"].by_depth] == [approx(0.55), approx(0.65)]
    assert t4["chat"].delta.value == approx(0.10)
    # code depth 1: (0.3 + 0.1) / 2 = 0.2; depth 2: 0.9
    assert [e.value for e in t4["code"].by_depth] == [approx(0.2), approx(0.9)]
    assert t4["code"].delta.value == approx(0.7)
    # All: depth 1 = 2.6 / 6, depth 2 = 2.2 / 3
    assert [e.value for e in t4[ALL].by_depth] == [approx(2.6 / 6), approx(2.2 / 3)]
    t3 = {r.domain: r for r in tiny.paper.table3}
    assert [e.value for e in t3["chat"].by_depth] == [approx(0.55), approx(0.55 * 0.65)]
    assert [e.value for e in t3["code"].by_depth] == [approx(0.2), approx(0.18)]
    t2 = {r.domain: r.expected_length for r in tiny.paper.table2}
    assert t2["chat"].value == approx(0.55 + 0.55 * 0.65)
    assert t2["code"].value == approx(0.38)
    assert t2[ALL].value == approx(2.6 / 6 + 2.6 / 6 * 2.2 / 3)
    assert not t2["math"].defined and not t4["math"].delta.defined


def test_table5_hand_computed(tiny):
    t5 = {(r.domain, r.depth): r for r in tiny.paper.table5}
    assert tiny.paper.bins == (0, 1)
    # chat depth 1: bin 0 (step 0) = (1.0 + 0.2) / 2, bin 1 (step 40) = (0.4 + 0.6) / 2
    assert [e.value for e in t5[("chat", 1)].by_bin] == [approx(0.6), approx(0.5)]
    assert t5[("chat", 1)].delta.value == approx(-0.1)
    assert [e.value for e in t5[("chat", 2)].by_bin] == [approx(0.5), approx(0.8)]
    assert t5[("chat", 2)].delta.value == approx(0.3)
    # code has no step in bin 1: that cell and the delta are empty
    assert t5[("code", 1)].by_bin[0].value == approx(0.2)
    assert not t5[("code", 1)].by_bin[1].defined and not t5[("code", 1)].delta.defined


def test_table6_spearman_and_pearson(tiny):
    t6 = {r.domain: r for r in tiny.paper.table6}
    rho, _ = sps.spearmanr(CHAT_H, CHAT_ALPHA)
    r, _ = sps.pearsonr(CHAT_H, CHAT_ALPHA)
    assert t6["chat"].spearman.value == approx(rho)
    assert t6["chat"].pearson.value == approx(r)
    assert t6[ALL].spearman.value == approx(
        sps.spearmanr(CHAT_H + CODE_H, CHAT_ALPHA + CODE_ALPHA)[0]
    )
    assert t6["math"].nodes == 0 and not t6["math"].spearman.defined


def test_greedy_tables(tiny):
    rows = {r.domain: r for r in tiny.greedy.table1}
    assert rows["chat"].mean.value == approx(3 / 6)  # greedy: T F F F T T
    assert rows["code"].mean.value == approx(1 / 3)
    t4 = {r.domain: r for r in tiny.greedy.table4}
    assert [e.value for e in t4["chat"].by_depth] == [approx(0.5), approx(0.5)]


def test_tau_and_chain(tiny):
    tau = {r.domain: r for r in tiny.tau}
    assert tau["chat"].tau.value == approx(2.0) and tau["chat"].steps == 2
    assert tau["code"].tau.value == approx(1.0)
    assert tau[ALL].tau.value == approx(5 / 3)
    assert tau["chat"].min_tau == 2 and tau["code"].min_tau == 1
    # top-1 chain (nodes 0 -> 2): c1/0 accepts node 0 only (chain tau 2); c1/40 and k1/0 reject
    # node 0 (chain tau 1)
    assert tau["chat"].chain_tau.value == approx(1.5)
    assert tau["chat"].tree_gain.value == approx(0.5)
    assert tau["code"].chain_tau.value == approx(1.0)
    assert not tau["math"].tau.defined and tau["math"].min_tau is None


def test_acceptance_vector_conditional_vs_unconditional(tiny):
    v = tiny.acceptance_vector
    chat_d2 = v.cell("chat", 2, 0)
    # two depth-2 nodes: rejected under an accepted parent (c1/0), accepted under a rejected
    # parent (c1/40): unconditional 1/2, conditional 0/1
    assert (chat_d2.nodes, chat_d2.eligible) == (2, 1)
    assert chat_d2.unconditional.value == approx(0.5)
    assert chat_d2.conditional.value == approx(0.0)
    # roots are always eligible: conditional == unconditional
    root = v.cell("chat", 1, 0)
    assert root.eligible == root.nodes == 2
    assert root.conditional.value == root.unconditional.value == approx(0.5)
    # code's depth-2 node has a rejected parent: no eligible node, an empty conditional rate
    code_d2 = v.cell("code", 2, 0)
    assert code_d2.eligible == 0 and not code_d2.conditional.defined
    assert code_d2.unconditional.value == approx(1.0)


def test_depth_profile_split(tiny):
    chain = tiny.depth_profile.row("chat", "top-1 chain", "alpha")
    # top-1 chain of chat: depth 1 nodes 0 (1.0, 0.4), depth 2 nodes 2 (0.5, 0.8)
    assert [e.value for e in chain.by_depth] == [approx(0.7), approx(0.65)]
    assert chain.delta.value == approx(-0.05)
    rank1 = tiny.depth_profile.row("chat", "sibling rank 1", "alpha")
    assert rank1.by_depth[0].value == approx(0.4) and not rank1.by_depth[1].defined


def test_effect_sizes_hand_computed(tiny):
    # alpha: grand mean 4.8/9; SS_total = 3.36 - 9 * (4.8/9)**2 = 0.8
    # domain: 6 (0.05)^2 + 3 (0.1)^2 = 0.045 -> 0.05625; depth: 6 (0.1)^2 + 3 (0.2)^2 = 0.18
    e = tiny.effects
    assert e.row("domain").alpha.value == approx(0.045 / 0.8)
    assert e.row("depth").alpha.value == approx(0.18 / 0.8)
    # one prompt per domain: no noise can be estimated, so the corrected shares are the raw ones
    assert e.row("domain (noise-corrected)").alpha.value == approx(0.045 / 0.8)
    assert e.row("domain − depth (noise-corrected)").alpha.value == approx((0.045 - 0.18) / 0.8)


def _explained_share_by_loops(prompt, strata, x, levels, K):
    """Independent reference: level means, the stratified sandwich covariance, prompt by prompt."""
    x = x - x.mean()
    n = len(x)
    w = np.array([(levels == k).sum() / n for k in range(K)])
    m = np.array([x[levels == k].mean() if (levels == k).any() else 0.0 for k in range(K)])
    grand = (w * m).sum()
    raw = (w * (m - grand) ** 2).sum()
    cov = np.zeros((K, K))
    for h in np.unique(strata):
        ps = np.flatnonzero(strata == h)
        us = []
        for p in ps:
            u = np.zeros(K)
            for k in range(K):
                sel = (prompt == p) & (levels == k)
                u[k] = (x[sel].sum() - m[k] * sel.sum()) / (levels == k).sum()
            us.append(u)
        us = np.array(us)
        centred = us - us.mean(axis=0)
        cov += len(ps) / (len(ps) - 1) * centred.T @ centred
    noise = (w * np.diag(cov)).sum() - w @ cov @ w
    return (raw - noise) / (x @ x / n - grand**2)


def test_noise_corrected_share_matches_loops():
    rng = np.random.default_rng(5)
    P, K = 12, 3
    strata = np.repeat([0, 1, 2], 4)
    prompt = rng.integers(0, P, 400)
    levels = rng.integers(0, K, 400)
    x = rng.normal(size=400) + 0.3 * levels
    boot = ClusterBootstrap.draw(strata, 0, seed=0)
    got = explained_share_reps(boot, prompt, strata, x, levels, K)[0]
    assert got == approx(_explained_share_by_loops(prompt, strata, x, levels, K), 1e-12)
    # a prompt-level factor (each prompt's level is its stratum): the same formula
    got = explained_share_reps(boot, prompt, strata, x, strata[prompt], 3)[0]
    assert got == approx(_explained_share_by_loops(prompt, strata, x, strata[prompt], 3), 1e-12)


def test_paradox_hand_computed(tiny):
    p = tiny.paradox
    assert p.domain == "chat" and p.entropy_top == "code" and p.alpha_top == "chat"
    assert p.entropy_lead.value == approx(5.2 / 6 - 4.3 / 3)
    assert p.alpha_lead.value == approx(3.5 / 6 - 1.3 / 3)


def test_single_prompt_domains_get_no_interval(tiny):
    # one prompt per domain: a cluster bootstrap cannot measure spread there
    chat = next(r for r in tiny.paper.table1 if r.domain == "chat")
    assert chat.mean.defined and not chat.mean.has_interval
    assert any("math" in w for w in tiny.warnings)


# --- the paper's own figures -----------------------------------------------------------------------


def test_paper_formula_reproduces_tables_2_and_3():
    paper = paper_data()
    for domain, row in paper["table4"]["rows"].items():
        cumulative, total = expected_length(row["by_depth"])
        assert total == pytest.approx(
            paper["table2"]["rows"][domain]["expected_length"], abs=0.002
        ), domain
        assert cumulative == pytest.approx(tuple(paper["table3"]["rows"][domain]), abs=0.002)
        assert row["by_depth"][-1] - row["by_depth"][0] == pytest.approx(row["delta"], abs=0.002)


def test_paper_depth_shares_reproduce_table1():
    # the paper tree holds 2 / 4 / 2 nodes per step: Table I's mean is Table IV's 1:2:1 average
    paper = paper_data()
    for domain, row in paper["table4"]["rows"].items():
        a1, a2, a3 = row["by_depth"]
        assert (a1 + 2 * a2 + a3) / 4 == pytest.approx(
            paper["table1"]["rows"][domain]["alpha_mean"], abs=0.002
        )


def test_paper_tables_load():
    pt = load_paper_tables()
    assert pt.source == "paper" and pt.depths == (1, 2, 3)
    assert pt.row("table1", ALL).nodes == 99768
    assert sum(r.nodes for r in pt.table1 if r.domain != ALL) == 99768
    assert pt.row("table2", "chat").expected_length.value == 1.065
    assert [r.depth for r in pt.table5] == [1, 2, 3]


# --- the bootstrap ---------------------------------------------------------------------------------


def test_bootstrap_draw_is_stratified_and_seeded():
    strata = np.array([0, 0, 0, 1, 1, 2])
    a = ClusterBootstrap.draw(strata, 50, seed=7)
    b = ClusterBootstrap.draw(strata, 50, seed=7)
    c = ClusterBootstrap.draw(strata, 50, seed=8)
    assert np.array_equal(a.weights, b.weights) and not np.array_equal(a.weights, c.weights)
    assert (a.weights[0] == 1).all()
    assert (a.weights[1:, :3].sum(1) == 3).all() and (a.weights[1:, 3:5].sum(1) == 2).all()
    assert (a.weights[1:, 5] == 1).all()  # a stratum of one prompt always draws it


def test_analysis_is_deterministic_under_a_seed(synthetic_run):
    a = analyze(synthetic_run, Settings(n_boot=100, seed=5))
    b = analyze(synthetic_run, Settings(n_boot=100, seed=5))
    c = analyze(synthetic_run, Settings(n_boot=100, seed=6))
    for part in ("paper", "greedy", "tau", "effects", "acceptance_vector", "findings"):
        # (compared as JSON: NaN marks undefined cells, and NaN != NaN)
        assert to_jsonable(getattr(a, part)) == to_jsonable(getattr(b, part)), part
    assert a.paper.table1[0].mean.value == c.paper.table1[0].mean.value
    assert a.paper.table1[0].mean.lo != c.paper.table1[0].mean.lo


def _explicit_resample(prompt, weights_row):
    """Row indices of the resample that repeats prompt p weights_row[p] times."""
    return np.concatenate(
        [
            np.flatnonzero(prompt == p).repeat(1).tolist() * int(w)
            for p, w in enumerate(weights_row)
            if w > 0
        ]
    ).astype(int)


def test_bootstrap_replicates_match_explicit_resamples():
    rng = np.random.default_rng(0)
    P = 12
    prompt = rng.integers(0, P, size=600)
    x = rng.normal(size=600) + prompt * 0.1
    y = -0.4 * x + rng.normal(size=600)
    level = rng.integers(0, 3, size=600)
    boot = ClusterBootstrap.draw(np.zeros(P, int), 20, seed=1)
    r = pearson_reps(boot, prompt, x, y)
    rho = spearman_reps(boot, prompt, x, y, n_bins=32)
    eta = eta_squared_reps(boot, prompt, y, level, 3)
    eta_p = eta_squared_prompt_reps(boot, prompt, y)
    assert rho[0] == approx(sps.spearmanr(x, y)[0])
    for b in range(1, 6):
        idx = _explicit_resample(prompt, boot.weights[b])
        xs, ys = x[idx], y[idx]
        assert r[b] == approx(sps.pearsonr(xs, ys)[0], 1e-9)
        assert rho[b] == pytest.approx(sps.spearmanr(xs, ys)[0], abs=0.01)  # binned ranks
        grand = ys.mean()
        between = sum(
            (level[idx] == k).sum() * (ys[level[idx] == k].mean() - grand) ** 2
            for k in range(3)
            if (level[idx] == k).any()
        )
        assert eta[b] == approx(between / ((ys - grand) ** 2).sum(), 1e-9)
        # prompt: each drawn copy of a prompt is its own group
        copies = [k for k, w in enumerate(boot.weights[b]) for _ in range(int(w))]
        between_p = sum((prompt == k).sum() * (y[prompt == k].mean() - grand) ** 2 for k in copies)
        assert eta_p[b] == approx(between_p / ((ys - grand) ** 2).sum(), 1e-9)


def test_spearman_known_cases():
    boot = ClusterBootstrap(np.ones((1, 1)))
    prompt = np.zeros(5, int)
    x = np.array([1.0, 2, 3, 4, 5])
    # ranks of y = [1, 2, 3.5, 5, 3.5]: rho = 8 / sqrt(10 * 9.5)
    assert spearman_reps(boot, prompt, x, np.array([5.0, 6, 7, 8, 7]))[0] == approx(
        8 / math.sqrt(95)
    )
    assert spearman_reps(boot, prompt, x, x**3)[0] == approx(1.0)
    assert spearman_reps(boot, prompt, x, -x)[0] == approx(-1.0)
    assert math.isnan(spearman_reps(boot, prompt, x, np.ones(5))[0])  # constant: undefined


def test_ranked_ties_and_binary():
    r = Ranked.of(np.array([3.0, 1.0, 3.0, 2.0]))
    assert list(r.ranks) == [3.5, 1.0, 3.5, 2.0] and r.n_bins == 3
    b = Ranked.of(np.array([1.0, 0.0, 1.0, 1.0]))
    assert list(b.ranks) == [3.0, 1.0, 3.0, 3.0] and b.n_bins == 2
    many = Ranked.of(np.arange(1000.0), n_bins=32)
    assert many.n_bins == 32 and many.bins.max() == 31


def test_intervals_cover_the_estimate(synthetic):
    for row in synthetic.paper.table1 + tuple(synthetic.paper.table4):
        ests = [row.mean] if hasattr(row, "mean") else list(row.by_depth)
        for e in ests:
            assert e.has_interval and e.lo <= e.value <= e.hi


def test_no_boot_means_no_intervals(synthetic_run):
    a = analyze(synthetic_run, Settings(n_boot=0))
    assert a.paper.table1[0].mean.defined and not a.paper.table1[0].mean.has_interval
    assert all(f.verdict in (Verdict.INCONCLUSIVE, Verdict.UNTESTABLE) for f in a.findings)


# --- findings --------------------------------------------------------------------------------------


def test_findings_cover_the_paper_claims(synthetic):
    keys = {f.key for f in synthetic.findings}
    assert {
        "task_type_over_depth",
        "only_chat_above_one",
        "rises_with_depth",
        "rho_negative",
        "rho_weak_range",
        "chat_paradox",
        "below_one_no_speedup",
    } <= keys
    for f in synthetic.findings:
        assert isinstance(f.verdict, Verdict) and f.claim and f.label
    # synthetic acceptance falls with entropy in every domain
    assert next(f for f in synthetic.findings if f.key == "rho_negative").verdict == Verdict.HOLDS


def test_tau_contradicts_the_no_speedup_claim(tmp_path):
    # a run whose paper-style E[L] is below 1 although the verifier emits > 1 token per pass
    low = {d: DomainProfile(0.35, 0.2, 1.0) for d in ("chat", "code", "math", "reasoning")}
    run = write_synthetic_run(
        tmp_path / "low", prompts_per_domain=12, steps=40, seed=2, profiles=low
    )
    a = analyze(run, Settings(n_boot=200))
    assert all(r.expected_length.hi < 1 for r in a.paper.table2)
    finding = next(f for f in a.findings if f.key == "below_one_no_speedup")
    assert finding.verdict == Verdict.FAILS
    assert all(r.min_tau >= 1 for r in a.tau) and all(r.tau.lo > 1 for r in a.tau)


def test_findings_untestable_without_chat(tmp_path):
    nodes = [n for n in TINY_NODES if n[1] != "chat"]
    run = write_run(
        tmp_path / "nochat",
        nodes,
        [s for s in TINY_STEPS if s[1] != "chat"],
        [p for p in TINY_PROMPTS if p[1] != "chat"],
    )
    a = analyze(run, Settings(n_boot=50))
    by = {f.key: f for f in a.findings}
    assert by["only_chat_above_one"].verdict == Verdict.UNTESTABLE
    assert by["chat_paradox"].verdict == Verdict.UNTESTABLE


# --- bad input -------------------------------------------------------------------------------------


def test_not_a_run(tmp_path):
    with pytest.raises(RunDirError, match="does not exist"):
        analyze(tmp_path / "nope")
    with pytest.raises(RunDirError, match="manifest"):
        analyze(tmp_path)


def test_incompatible_schema_version(tmp_path):
    run = write_run(
        tmp_path / "v2", manifest={"schema_version": 99, "run_id": "x", "status": "complete"}
    )
    with pytest.raises(RunDirError, match="schema version 99"):
        analyze(run)


def test_corrupt_and_missing_parquet(tmp_path):
    run = write_run(tmp_path / "corrupt")
    (run / "nodes.parquet").write_bytes(b"not a parquet file")
    with pytest.raises(RunDirError, match="nodes"):
        analyze(run)
    run = write_run(tmp_path / "missing")
    (run / "steps.parquet").unlink()
    with pytest.raises(RunDirError, match="steps.parquet is missing"):
        analyze(run)


def test_missing_column_and_bad_values(tmp_path):
    run = write_run(tmp_path / "nocol")
    table = to_table(node_columns(TINY_NODES), "nodes").drop_columns(["alpha"])
    RunDir(run).write_table("nodes", table)
    with pytest.raises(RunDirError, match="alpha"):
        analyze(run)
    bad = [n[:7] + (float("nan"),) + n[8:] if i == 0 else n for i, n in enumerate(TINY_NODES)]
    with pytest.raises(RunDirError, match="alpha"):
        analyze(write_run(tmp_path / "nan", bad))


def test_no_nodes_is_a_clear_error(tmp_path):
    run = write_run(tmp_path / "empty", nodes=[], steps=[])
    with pytest.raises(RunDirError, match="no node records"):
        analyze(run)


def test_interrupted_run_from_shards(tmp_path):
    run = tmp_path / "partial"
    writer = RunDir(run)
    for order, pid in enumerate(["c1", "k1"]):
        nodes = to_table(node_columns([n for n in TINY_NODES if n[0] == pid]), "nodes")
        steps = to_table(step_columns([s for s in TINY_STEPS if s[0] == pid]), "steps")
        prompt = to_table(prompt_columns([p for p in TINY_PROMPTS if p[0] == pid]), "prompts")
        writer.commit_prompt(order, pid, nodes, steps, prompt)
    RunDir(run).write_manifest(
        {"schema_version": SCHEMA_VERSION, "run_id": "tiny", "status": "running"}
    )
    a = analyze(run, Settings(n_boot=20))
    assert a.paper.table1[-1].nodes == 9
    assert any("not 'complete'" in w for w in a.warnings)


def test_inconsistent_accepted_len_is_flagged(tmp_path):
    steps = [("c1", "chat", 0, 2)] + TINY_STEPS[1:]
    a = analyze(write_run(tmp_path / "acc", steps=steps), Settings(n_boot=10))
    assert any("accepted_len" in w for w in a.warnings)


# --- outputs ---------------------------------------------------------------------------------------


def test_empty_cells_render_as_dash(tiny):
    grids = {g.key: g for g in analysis_grids(tiny)}
    md = to_markdown(grids["table1"])
    math_line = next(line for line in md.splitlines() if line.startswith("| math"))
    assert "—" in math_line and "nan" not in md.lower()
    csv_text = to_csv(grids["table1"])
    assert "nan" not in csv_text.lower()
    assert csv_text.splitlines()[0].startswith("Domain,Nodes,mean α,mean α lo,mean α hi")
    tex = to_latex(grids["table1"])
    assert r"\toprule" in tex and "---" in tex and "nan" not in tex.lower()


@pytest.mark.slow
def test_write_outputs_and_html_escaping(synthetic, tmp_path):
    out = write_outputs(synthetic, tmp_path / "analysis")
    for path in (out.markdown, out.latex, out.json, out.html):
        assert path.is_file() and path.stat().st_size > 0
    assert (out.csv_dir / "table2.csv").is_file() and (out.csv_dir / "tau.csv").is_file()
    page = out.html.read_text()
    for key in (
        "findings",
        "table1",
        "table2",
        "table3",
        "table4",
        "table5",
        "table6",
        "tau",
        "acceptance_vector",
        "effects",
        "paradox",
        "greedy_table1",
        "variance",
        "stratified_rho",
        "stratified_findings",
        "findings_figures",
    ):
        assert f'id="r0-{key}"' in page
    assert "<script" not in page  # the probe in the prompt text is escaped, and no JS is used
    assert "&lt;script&gt;" in page
    assert "http://" not in page and "https://" not in page.replace("https://github.com", "")
    data = json.loads(out.json.read_text())
    assert data["paper"]["table1"][0]["domain"] == "chat"
    if out.plots:
        from specscope.analysis.plots import PLOTS

        assert page.count("data:image/png;base64,") == len(out.plots) == len(PLOTS)
        assert all(p.svg.is_file() for p in out.plots)


def test_compare_runs_and_paper(synthetic, tiny):
    grids = compare_with_paper(synthetic)
    assert {g.key for g in grids} >= {"paper_vs_table_i", "paper_vs_table_ii", "paper_vs_table_vi"}
    t2 = next(g for g in grids if g.key == "paper_vs_table_ii")
    chat = next(row for row in t2.rows if row[0] == "chat")
    assert chat[2].value == 1.065 and isinstance(chat[3], Estimate)
    both = compare(synthetic, tiny)
    assert both[0].key == "compare_findings"
    assert any(g.key == "compare_tau" for g in both)


def test_write_report_of_two_runs(synthetic, tiny, tmp_path):
    page = write_report([synthetic, tiny], tmp_path / "cmp.html", plots=False).read_text()
    assert (
        'id="comparison"' in page
        and 'id="r1-table1"' in page
        and 'id="c1-compare_findings"' in page
    )


def test_plots_skip_cleanly_without_matplotlib(synthetic, tmp_path, monkeypatch):
    from specscope.analysis import plots, report

    monkeypatch.setattr(plots, "plots_unavailable", lambda: "matplotlib is not installed")
    monkeypatch.setattr(report, "plots_unavailable", lambda: "matplotlib is not installed")
    out = write_outputs(synthetic, tmp_path / "noplots")
    assert out.plots == () and "matplotlib" in out.html.read_text()


# --- CLI -------------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_analyze_report_compare(synthetic_run, tmp_path):
    result = runner.invoke(
        app,
        ["analyze", str(synthetic_run), "--boot", "50", "--no-plots", "--out", str(tmp_path / "a")],
    )
    assert result.exit_code == 0, result.output
    assert "Table I" in result.output and (tmp_path / "a" / "tables.md").is_file()
    result = runner.invoke(
        app,
        [
            "report",
            str(synthetic_run),
            str(synthetic_run),
            "--boot",
            "20",
            "--no-plots",
            "--out",
            str(tmp_path / "r.html"),
        ],
    )
    assert result.exit_code == 0, result.output and (tmp_path / "r.html").is_file()
    result = runner.invoke(
        app, ["compare", str(synthetic_run), "--boot", "20", "--out", str(tmp_path / "c")]
    )
    assert result.exit_code == 0, result.output
    assert "paper vs" in result.output and (tmp_path / "c" / "tables.tex").is_file()


def test_cli_errors_are_clear(tmp_path):
    for command in ("analyze", "report", "compare"):
        result = runner.invoke(app, [command, str(tmp_path / "missing")])
        assert result.exit_code == 2
        assert "error:" in result.output and "Traceback" not in result.output


def test_cli_help():
    for command in ("analyze", "report", "compare"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0 and "--boot" in result.output


# --- the report in a real browser ------------------------------------------------------------------

CHROMIUM = next(
    (shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)),
    None,
)


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install -y chromium; .ci/run installs it)",
)
@pytest.mark.slow
def test_report_renders_in_headless_chromium(synthetic_run, tmp_path):
    """The report opened in a real browser: every table there (folded), every plot decoded with a
    natural width (a script run after load records it), the plots visible in a screenshot, and the
    first screen at 1280x800 holding the claims' forest plot and tokens per step and no table."""
    pytest.importorskip("matplotlib")
    script = Path(__file__).resolve().parents[1] / "scripts" / "check_report_chromium.sh"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    result = subprocess.run(
        [str(script), str(synthetic_run), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "plots rendered" in result.stdout and "first screen holds the claims" in result.stdout
    assert (tmp_path / "report.png").stat().st_size > 50_000
    assert (tmp_path / "first-screen.png").stat().st_size > 20_000


def test_bootstrap_gives_no_interval_when_resamples_cannot_vary():
    from specscope.analysis.stats import ClusterBootstrap

    boot = ClusterBootstrap.draw(np.array(["chat", "code", "math"]), n_boot=200, seed=0)
    est = boot.estimate(boot.total(np.array([1.0, 2.0, 3.0])), n=3, prompts=3)
    assert est.value == 6.0 and np.isnan(est.lo) and np.isnan(est.hi)
