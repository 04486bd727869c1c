"""analysis/replay: recorded trees replayed as greedy decoding, checked against hand-walked
decoding on tiny records, and against the audit's figures on the shipped paper-protocol run."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specscope.analysis.level_grids import decoded_grid
from specscope.analysis.prepare import ALL
from specscope.analysis.render import to_markdown
from specscope.analysis.replay import (
    MeasuredTree,
    ReplayError,
    ReplayRecords,
    StopRule,
    Subtree,
    decoded_tokens_per_step,
    replay,
    replay_counts,
    top_chain,
)
from specscope.analysis.results import Settings
from specscope.trees import TreeShape

TREE = [(-1, 1, 0), (-1, 1, 1), (0, 2, 0)]  # (parent, depth, rank): [(0,), (1,), (0, 0)]

# per prompt: each step's greedy_accept of the three nodes, and p_draft / draft entropy
CODE = [(1, 0, 1), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 0, 1)]  # accepted 2, 0, 1, 2, 2
CODE_P = [(0.9, 0.9, 0.2), (0.9,) * 3, (0.9,) * 3, (0.9,) * 3, (0.4, 0.9, 0.9)]
CHAT = [(1, 0, 1)] * 3  # accepted 2, 2, 2


def _frames(prompts=(("c", "code", CODE, CODE_P), ("h", "chat", CHAT, None))):
    nodes, steps = [], []
    for pid, domain, accepts, probs in prompts:
        for step, acc in enumerate(accepts):
            p = probs[step] if probs else (0.9,) * 3
            accepted_len = 2 if acc[0] and acc[2] else int(acc[0] or acc[1])
            steps.append(
                dict(
                    prompt_id=pid,
                    domain=domain,
                    step=step,
                    tree_size=3,
                    accepted_len=accepted_len,
                    tau=accepted_len + 1,
                )
            )
            for node, (parent, depth, rank) in enumerate(TREE):
                nodes.append(dict(prompt_id=pid, domain=domain, step=step, node_id=node,
                                  parent_id=parent, depth=depth, sibling_rank=rank,
                                  greedy_accept=bool(acc[node]), p_draft=p[node],
                                  draft_entropy=1.0 - p[node]))  # fmt: skip
    return pd.DataFrame(nodes), pd.DataFrame(steps)


@pytest.fixture
def rec():
    return ReplayRecords.from_frames(*_frames())


def _steps(rec, candidate, prefill_drafts=True):
    return replay_counts(rec, candidate, prefill_drafts).steps.tolist()  # prompts sorted: c, h


def test_the_measured_tree_replays_as_decoding_walks(rec):
    # code: i=0 emits 3 (2 accepted + bonus) -> i=3 emits min(2, 1) + 1 = 2 -> end: 2 steps;
    # chat: i=0 emits min(2, 2) + 1 = 3 -> end: 1 step
    counts = replay_counts(rec, MeasuredTree())
    assert counts.steps.tolist() == [2, 1]
    assert counts.positions.tolist() == [5, 3]
    assert counts.tau_sum.tolist() == [12, 9]  # (3 + 1 + 2 + 3 + 3), 3 * 3
    r = replay(rec)
    assert r.row("code").tokens_per_step.value == pytest.approx(5 / 2)
    assert r.row("code").position_mean.value == pytest.approx(12 / 5)
    assert r.row("chat").tokens_per_step.value == pytest.approx(3.0)
    assert r.row(ALL).tokens_per_step.value == pytest.approx(8 / 3)  # a ratio of sums
    assert (r.row(ALL).steps, r.row(ALL).positions, r.row(ALL).prompts) == (3, 8, 2)


def test_a_plain_prefill_pass_counts_one_step_and_trees_start_at_position_one(rec):
    # code: prefill (token 0) | i=1 a=0 -> 1 token | i=2 a=1 -> 2 | i=4 min(2, 0) + 1 -> 1
    # chat: prefill | i=1 emits min(2, 1) + 1 = 2 -> end
    assert _steps(rec, MeasuredTree(), prefill_drafts=False) == [4, 2]
    r = replay(rec, prefill_drafts=False)
    assert r.row("code").tokens_per_step.value == pytest.approx(5 / 4) and not r.prefill_drafts


def test_subtrees_and_chains_keep_only_their_paths(rec):
    assert _steps(rec, top_chain(1)) == [3, 2]  # code a = 1 0 0 1 1; chat a = 1 1 1
    assert _steps(rec, top_chain(2)) == [2, 1]
    assert _steps(rec, Subtree(TreeShape.from_paths([(0,), (1,)]))) == [3, 2]  # a = 1 0 1 1 1
    assert replay(rec, top_chain(1)).candidate == "chain(1)"


def test_a_perfect_drafter_decodes_k_plus_one_tokens_per_step_less_the_end():
    perfect = [(1, 0, 1)] * 7  # the top-1 chain always accepted
    rec = ReplayRecords.from_frames(*_frames((("p", "math", perfect, None),)))
    # chain of 1: steps of 2 tokens, the 7th token alone: 4 steps; chain of 2: 3 + 3 + 1
    assert _steps(rec, top_chain(1)) == [4]
    assert _steps(rec, top_chain(2)) == [3]
    assert replay(rec, top_chain(2)).row("math").tokens_per_step.value == pytest.approx(7 / 3)


def test_a_stop_rule_cuts_paths_at_the_first_stopped_node(rec):
    # p_min 0.5 drops node (0, 0) at step 0 (p 0.2), and at step 4 node (0,) (p 0.4) with its
    # child, although the child's own p is 0.9: code a = 1 0 1 2 0 -> i=0: 2, i=2: 2, i=4: 1
    rule = StopRule(MeasuredTree(), p_min=0.5)
    counts = replay_counts(rec, rule)
    assert counts.steps.tolist() == [3, 1]
    assert counts.tau_sum.tolist() == [2 + 1 + 2 + 3 + 1, 9]
    # the draft is fed level 1 while node (0,), the one with a child, is kept: at code's steps 0
    # and 2, not at step 4 (stopped); chat's one step too
    assert counts.fed_steps.tolist() == [[1, 2], [0, 1]]
    # the same rule on entropy (1 - p here), and the two together
    assert _steps(rec, StopRule(MeasuredTree(), h_max=0.5)) == [3, 1]
    assert _steps(rec, StopRule(top_chain(1), p_min=0.5, h_max=0.5)) == [3, 2]
    assert "p_draft >= 0.5" in rule.label
    # a rule that stops nothing changes nothing; one that stops everything decodes plainly
    assert _steps(rec, StopRule(MeasuredTree(), p_min=0.0)) == [2, 1]
    everything = replay_counts(rec, StopRule(MeasuredTree(), p_min=1.0))
    assert everything.steps.tolist() == [5, 3] and everything.proposals.tolist() == [0, 0]


def test_a_step_counts_the_nodes_it_drafted(rec):
    """What an engine pricing a step by its tree needs (llama.cpp's draft loop): the chain of 2
    cut by p_min 0.5 drafts 1, 2, 2, 2, 0 nodes at code's positions (accepted 1, 0, 0, 2, 0);
    decoding visits positions 0, 2 and 3: steps of 1, 2 and 2 nodes; chat's one step drafts
    2."""
    rule = StopRule(top_chain(2), p_min=0.5)
    counts = replay_counts(rec, rule)
    assert counts.steps.tolist() == [3, 1] and counts.proposals.tolist() == [3, 1]
    assert counts.drafted_steps.tolist() == [[0, 1, 2], [0, 0, 1]]
    assert counts.drafted.tolist() == [5, 2]
    mix = counts.drafted_mix(rec)
    assert mix["code"] == pytest.approx([0, 1 / 3, 2 / 3])
    assert mix["chat"] == pytest.approx([0, 0, 1])
    assert mix[ALL] == pytest.approx([0, 1 / 4, 3 / 4])
    later = counts.after_first()  # the first steps (positions 0) drafted 1 and 2
    assert later.drafted_steps.tolist() == [[0, 0, 2], [0, 0, 0]]
    assert later.drafted_steps.sum(axis=1).tolist() == later.steps.tolist()
    plain_prefill = replay_counts(rec, rule, prefill_drafts=False)  # the prefill, then 1, 2, 3
    assert plain_prefill.steps.tolist() == [4, 2]
    assert plain_prefill.drafted_steps.tolist() == [[0, 0, 3], [0, 0, 1]]
    assert plain_prefill.after_first().drafted_steps.tolist() == [[0, 0, 3], [0, 0, 1]]


def test_refusals_name_what_is_wrong(rec):
    with pytest.raises(ReplayError, match=r"no node at path \(2,\)"):
        replay_counts(rec, Subtree(TreeShape.from_paths([(0,), (2,)])))
    with pytest.raises(ReplayError, match=r"path \(0, 0, 0\)"):
        replay_counts(rec, top_chain(3))
    with pytest.raises(ReplayError, match="p_min or h_max|p_min .* or h_max"):
        StopRule(MeasuredTree())
    with pytest.raises(ReplayError, match="probability in"):
        StopRule(MeasuredTree(), p_min=1.5)
    nodes, steps = _frames()
    with pytest.raises(ReplayError, match="lack the columns"):
        ReplayRecords.from_frames(nodes, steps.drop(columns="accepted_len"))
    with pytest.raises(ReplayError, match="lack p_draft"):
        replay_counts(
            ReplayRecords.from_frames(nodes.drop(columns="p_draft"), steps),
            StopRule(MeasuredTree(), p_min=0.5),
        )
    with pytest.raises(ReplayError, match="0, 1, ..., L - 1"):
        ReplayRecords.from_frames(nodes, steps[steps.step != 2])


def test_steps_only_records_replay_chains_from_accepted_lengths():
    nodes, steps = _frames()
    chained = steps.assign(tree_size=2, accepted_len=steps.accepted_len.clip(upper=2))
    rec = ReplayRecords.from_frames(pd.DataFrame(), chained)
    assert _steps(rec, MeasuredTree()) == [2, 1]
    assert _steps(rec, top_chain(1)) == [3, 2]
    with pytest.raises(ReplayError, match="chain of 3"):
        replay_counts(rec, top_chain(3))
    with pytest.raises(ReplayError, match="steps only"):
        replay_counts(rec, Subtree(TreeShape.from_paths([(0,), (1,)])))


def test_the_decoded_table_and_its_grid(rec):
    table = decoded_tokens_per_step(rec, Settings(n_boot=50))
    code = next(r for r in table.rows if r.domain == "code")
    assert code.decoded.value == pytest.approx(2.5) and code.chain.value == pytest.approx(2.5)
    assert table.chain_depth == 2 and table.rows[-1].domain == ALL
    text = to_markdown(decoded_grid(table))
    assert "position mean" in text and "chain(2)" in text


def test_intervals_resample_prompts_within_domains():
    prompts = [(f"c{i}", "code", CODE[: 3 + i % 3], None) for i in range(6)]
    prompts += [(f"h{i}", "chat", CHAT, None) for i in range(4)]
    r = replay(ReplayRecords.from_frames(*_frames(prompts)), settings=Settings(n_boot=200))
    code = r.row("code").tokens_per_step
    assert code.has_interval and code.lo < code.value < code.hi and code.prompts == 6
    chat = r.row("chat").tokens_per_step
    assert chat.value == pytest.approx(3.0) and chat.hi - chat.lo == pytest.approx(0.0)


SHIPPED = Path(__file__).resolve().parents[1] / "results" / "demo-pair" / "paper-protocol"


@pytest.mark.skipif(not (SHIPPED / "nodes.parquet").is_file(), reason="shipped run absent")
def test_the_shipped_paper_protocol_run_replays_to_the_audited_figures():
    table = decoded_tokens_per_step(SHIPPED, Settings(n_boot=20))
    got = {r.domain: (r.decoded.value, r.position_mean.value, r.chain.value) for r in table.rows}
    audited = {  # decoded, position mean, top-1 chain of 3 decoded
        "chat": (2.924, 3.081, 2.538),
        "code": (3.613, 3.776, 3.426),
        "math": (3.687, 3.790, 3.482),
        "reasoning": (3.641, 3.726, 3.412),
    }
    for domain, figures in audited.items():
        np.testing.assert_allclose(got[domain], figures, atol=5e-4)
