"""tune/: optimal trees, acceptance vectors, the tuner, policy files, the bench summary, and
``specscope tune`` feeding a routed ``decode`` (the routers: test_router.py)."""

import dataclasses
import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import steps_of, tiny_pair_args
from specscope.analysis.bench_stats import summarize_bench
from specscope.analysis.replay import (
    ReplayRecords,
    StopRule,
    Subtree,
    replay_counts,
    top_chain,
)
from specscope.cli import app
from specscope.decode import DecodeError
from specscope.drafters import DrafterConfig
from specscope.records import ALL_DOMAINS, load_run
from specscope.serving.export_plan import DeploymentPlan
from specscope.trees import TreeShape
from specscope.tune.acceptance import (
    AcceptanceVector,
    PolicyError,
    acceptance_vectors,
    chain_acceptance,
)
from specscope.tune.bench import (
    BenchConfig,
    candidate_predictions,
    method_settings,
    policy_setting,
)
from specscope.tune.costs import CostModel
from specscope.tune.optimal import optimal_tree
from specscope.tune.policy import (
    Choice,
    Measured,
    PolicyFile,
    TuneConfig,
    best_tree,
    make_speculation,
    tune,
)
from specscope.tune.predict import EXTRAPOLATED, REPLAY, Prediction, Predictor, Stop

# --- the optimal tree ------------------------------------------------------------------------------


def _all_trees(max_nodes: int, max_depth: int, max_rank: int):
    """Every parent-closed set of paths (ranks < max_rank, depth <= max_depth), by brute force."""
    universe = [
        p for d in range(1, max_depth + 1) for p in itertools.product(range(max_rank), repeat=d)
    ]
    for n in range(1, max_nodes + 1):
        for subset in itertools.combinations(universe, n):
            chosen = set(subset)
            if all(len(p) == 1 or p[:-1] in chosen for p in subset):
                yield TreeShape.from_paths(list(subset))


@settings(max_examples=15, deadline=None)
@given(
    rates=st.lists(st.lists(st.floats(0, 1), min_size=3, max_size=3), min_size=3, max_size=3),
    max_nodes=st.integers(1, 5),
    max_depth=st.integers(1, 3),
)
def test_optimal_tree_equals_brute_force(rates, max_nodes, max_depth):
    acc = AcceptanceVector.from_rates(rates)
    dp = optimal_tree(acc, max_nodes, max_depth)
    brute = max((acc.expected_tau(t) for t in _all_trees(max_nodes, max_depth, 3)), default=1.0)
    assert dp.expected_tau == pytest.approx(max(brute, 1.0), abs=1e-9)
    if dp.shape is not None:
        assert len(dp.shape) <= max_nodes and dp.shape.max_depth <= max_depth
        assert acc.expected_tau(dp.shape) == pytest.approx(dp.expected_tau)


def test_optimal_tree_prefers_width_when_top1_is_weak():
    strong = AcceptanceVector.from_rates([[0.9, 0.05], [0.9, 0.05], [0.9, 0.05]])
    weak = AcceptanceVector.from_rates([[0.4, 0.3], [0.4, 0.3], [0.4, 0.3]])
    assert optimal_tree(strong, 3, 3).shape.paths == ((0,), (0, 0), (0, 0, 0))
    assert optimal_tree(weak, 3, 3).shape.depth_counts()[0] == 2


def _nodes_frame():
    """Two steps of a 3-node tree [(0,), (1,), (0, 0)] in two domains."""
    rows = []
    accepts = {
        ("code", 0): (True, False, True),
        ("code", 1): (True, False, False),
        ("chat", 0): (False, True, True),
        ("chat", 1): (False, False, True),
    }
    for (domain, step), acc in accepts.items():
        for node, (parent, depth, rank) in enumerate([(-1, 1, 0), (-1, 1, 1), (0, 2, 0)]):
            rows.append(
                dict(
                    prompt_id=f"{domain}-p",
                    domain=domain,
                    step=step,
                    node_id=node,
                    parent_id=parent,
                    depth=depth,
                    sibling_rank=rank,
                    greedy_accept=acc[node],
                )
            )
    return pd.DataFrame(rows)


def _long_nodes_frame(steps: int = 8):
    """Step 0 of :func:`_nodes_frame` at every one of ``steps`` positions: long enough to pay
    back the plain prefill step that predictions count (as the decoder does)."""
    first = _nodes_frame().query("step == 0")
    return pd.concat([first.assign(step=step) for step in range(steps)], ignore_index=True)


def test_acceptance_vector_counts_nodes_whose_parent_was_accepted():
    vectors = acceptance_vectors(_nodes_frame(), min_count=1)
    code, chat = vectors["code"], vectors["chat"]
    assert code.rates.tolist() == [[1.0, 0.0], [0.5, 0.0]]  # depth 2: parent accepted twice
    assert chat.rates[0].tolist() == [0.0, 0.5]
    assert chat.counts[1, 0] == 0  # the depth-2 node never had an accepted parent
    assert vectors["all"].counts.tolist() == [[4, 4], [2, 0]]
    assert acceptance_vectors(_nodes_frame(), min_count=3)["code"].rates[1, 0] == 0.0


def test_acceptance_vector_extrapolation():
    acc = AcceptanceVector(
        np.array([[0.9, 0.1], [0.8, 0.1], [0.0, 0.0]]), np.array([[9, 9], [9, 9], [1, 1]])
    )
    ext = acc.extrapolated(4)
    assert ext.rates.tolist() == [[0.9, 0.1], [0.8, 0.1], [0.8, 0.1], [0.8, 0.1]]
    assert ext.counts[2:].sum() == 0
    assert acc.extrapolated(2) is acc


COSTS = CostModel(
    draft_s=((1, 0.01), (8, 0.012), (64, 0.03)),
    target_s=((1, 0.1), (8, 0.11), (16, 0.13), (64, 0.4)),
    plain_token_s=0.1,
)


def draft_model(nodes: pd.DataFrame, costs: CostModel = COSTS) -> Measured:
    """A draft-model measurement for tune, its step records derived from its nodes."""
    return Measured(DrafterConfig(), nodes, steps_of(nodes), costs)


def test_tune_picks_trees_and_no_speculation_where_nothing_helps():
    nodes = _long_nodes_frame()
    nodes.loc[nodes.domain == "chat", "greedy_accept"] = False
    policy = tune([draft_model(nodes)], TuneConfig(min_count=1))
    assert policy.tree_for("chat") is None
    code = policy.tree_for("code")
    assert code is not None and code.paths[0] == (0,)
    assert policy.choices["code"].predicted_speedup > 1
    assert best_tree(AcceptanceVector.from_rates([[0.01]]), COSTS).shape is None


CODE_TEXT = "Write a Python function that returns the sum of a list.\n\ndef total(xs):"


def test_routed_prediction_replays_each_prompt_with_the_entry_it_is_sent_to():
    """code speculates, chat does not; the router sends chat's one prompt (code-like text) to
    code's tree, on which it accepts nothing: routed chat decodes one token a step with the tree's
    cost, routed code is code's own entry."""
    nodes = _long_nodes_frame()
    nodes.loc[nodes.domain == "chat", "greedy_accept"] = False
    texts = {"code-p": CODE_TEXT, "chat-p": CODE_TEXT}
    measured = dataclasses.replace(draft_model(nodes), texts=texts)
    policy = tune([measured], TuneConfig(min_count=1))
    assert policy.tree_for("chat") is None and policy.tree_for("code") is not None
    routed = policy.info["routed"]
    assert routed["router"] == "rules"
    chat, code = routed["domains"]["chat"], routed["domains"]["code"]
    assert chat["sent"] == {"code": 1} and code["sent"] == {"code": 1}
    assert chat["prediction"]["tokens_per_step"] == 1.0  # every chat step rejects the tree
    step = COSTS.step_time(policy.tree_for("code"), 1.0)
    assert chat["predicted_speedup"] == pytest.approx(COSTS.plain_token_s / step, abs=1e-4)
    entry = policy.choices["code"]
    assert code["prediction"]["tokens_per_step"] == pytest.approx(entry.tokens_per_step, abs=1e-4)
    assert code["predicted_speedup"] == pytest.approx(entry.predicted_speedup, abs=1e-4)
    # without the prompts' texts nothing is routed, and the file says nothing about it
    assert "routed" not in tune([draft_model(nodes)], TuneConfig(min_count=1)).info


def test_an_extrapolated_entry_gives_no_routed_prediction():
    """Every node accepted on trees of depth 2, trees of depth 4 allowed: the chosen chain is
    deeper than the records hold (extrapolated), so no prompt can be replayed through it; tune
    chooses without the routed prediction instead of failing in its replay."""
    nodes = _long_nodes_frame()
    nodes["greedy_accept"] = True
    texts = {"code-p": CODE_TEXT, "chat-p": CODE_TEXT}
    measured = dataclasses.replace(draft_model(nodes), texts=texts)
    policy = tune([measured], TuneConfig(min_count=1, max_depth=4))
    assert policy.choices["code"].prediction.extrapolated
    assert "routed" not in policy.info


def test_best_tree_weighs_only_chains_llama_ngram_simple_drafts_with():
    """llama.cpp's ngram-simple never drafts with a chain shorter than its n-gram (N = 3): chains
    of 1 and 2, which the rates would favour, are no candidates; with N = 6 nothing is."""
    acc = AcceptanceVector.from_rates([[0.9], [0.5], [0.1], [0.05], [0.05]])
    config = TuneConfig(max_nodes=5, max_depth=5, min_speedup=0)
    model = best_tree(acc, COSTS, config)
    assert model.shape is not None and len(model.shape) < 3
    llama = DrafterConfig("llama-ngram-simple", ngram_size=3)
    choice = best_tree(acc, COSTS, config, drafter=llama)
    assert choice.shape is not None and choice.shape.is_chain and len(choice.shape) >= 3
    wide = DrafterConfig("llama-ngram-simple", ngram_size=6)
    assert best_tree(acc, COSTS, config, drafter=wide).shape is None


def _ngram_steps() -> pd.DataFrame:
    """Chains of 3 from a lookup, one prompt per domain, a step per position: code proposes at
    every position and accepts 2 nodes at three positions of four; chat proposes at one position
    of ten, and that chain is rejected."""
    rows = []
    for step in range(40):
        rows.append(("c", "code", step, 3, 2 if step % 4 else 0))
        rows.append(("h", "chat", step, 3 if step % 10 == 0 else 0, 0))
    return pd.DataFrame(rows, columns=["prompt_id", "domain", "step", "tree_size", "accepted_len"])


def test_chain_acceptance_is_conditional_per_depth_beyond_depth_two():
    """Accepted lengths 4, 3, 3, 1, 0 (chains of 4): depth d's rate is P(>= d | >= d - 1)."""
    steps = pd.DataFrame(
        {
            "prompt_id": "p",
            "domain": "code",
            "step": range(5),
            "tree_size": 4,
            "accepted_len": [4, 3, 3, 1, 0],
        }
    )
    acc = chain_acceptance(steps, min_count=1)["code"]
    np.testing.assert_allclose(acc.rates[:, 0], [4 / 5, 3 / 4, 3 / 3, 1 / 3])
    assert acc.counts[:, 0].tolist() == [5, 4, 3, 3]
    # a chain of k: 1 + P(>= 1) + ... + P(>= k), the position mean of min(accepted_len, k) + 1
    for k in range(1, 5):
        position_mean = 1 + np.minimum(steps.accepted_len, k).mean()
        assert acc.expected_tau(TreeShape.chain(k)) == pytest.approx(position_mean)


@pytest.mark.parametrize("positions", [40, 42, 7])
def test_a_perfect_drafter_predicts_k_plus_one_tokens_per_step_less_the_end(positions):
    """A drafter that always accepts its chain of 4: the vector says 5.0 for a chain of 4 (the
    old per-depth rates said 3.657), and tune's replay says what decoding does: L tokens in
    ceil(L / (k + 1)) steps (the last step cut at the output's end)."""
    steps = pd.DataFrame(
        {
            "prompt_id": "p",
            "domain": "math",
            "step": range(positions),
            "tree_size": 4,
            "accepted_len": 4,
        }
    )
    acc = chain_acceptance(steps, min_count=1)["math"]
    assert acc.expected_tau(TreeShape.chain(4)) == pytest.approx(5.0)
    predictor = Predictor(ReplayRecords.from_frames(pd.DataFrame(), steps), {"math": acc})
    for k in range(1, 5):
        exact = positions / -(-positions // (k + 1))
        prediction = predictor.predict(TreeShape.chain(k), "math")
        assert prediction.tokens_per_step == pytest.approx(exact) and prediction.method == REPLAY
    assert predictor.predict(TreeShape.chain(4), "math").tokens_per_step == pytest.approx(
        5.0 if positions % 5 == 0 else positions / -(-positions // 5)
    )
    # as specscope's decoder counts: a plain prefill step, then chains from the second token
    decoder = Predictor(predictor.records, {"math": acc}, prefill_drafts=False)
    steps_after = -(-(positions - 1) // 5)
    chain4 = decoder.predict(TreeShape.chain(4), "math")
    assert chain4.tokens_per_step == pytest.approx(positions / (1 + steps_after))
    # after the first token (what a bench's decode speed is made of): the chains alone
    assert chain4.decode_tokens_per_step == pytest.approx((positions - 1) / steps_after)
    # transformers' assisted generation drafts in its first pass: after it, L - 5 tokens
    first = predictor.predict(TreeShape.chain(4), "math")
    assert first.decode_tokens_per_step == pytest.approx((positions - 5) / (-(-positions // 5) - 1))


def _lookup_chains_of_three():
    """A lookup's chains of 3 on one code prompt of 40 tokens, accepting 3 at positions 0, 4, 8,
    ... and 2 elsewhere; its cost model (a lookup of 0.5 ms) and its config."""
    steps = pd.DataFrame(
        {
            "prompt_id": "c",
            "domain": "code",
            "step": range(40),
            "tree_size": 3,
            "accepted_len": [3 if i % 4 == 0 else 2 for i in range(40)],
        }
    )
    lookup = CostModel(
        draft_s=((1, 0.0005),), target_s=COSTS.target_s, plain_token_s=0.1, model_free=True
    )
    return steps, lookup, DrafterConfig("ngram", prompt_lookup_min=1, prompt_lookup_max=3)


def test_tune_replays_chains_that_accept_past_depth_two():
    """Chains of 3 from a lookup that accepts 3 at positions 0, 4, 8, ... and 2 elsewhere:
    the chain of 3 decodes 4 + 4 + ... tokens, and tune's prediction is that replay, steps
    counted as the decoder counts them (the prefill a plain step: 1, 3, then 4 + 4 + ...)."""
    steps, lookup, ngram = _lookup_chains_of_three()
    rec = ReplayRecords.from_frames(pd.DataFrame(), steps)
    assert replay_counts(rec, top_chain(3)).steps.tolist() == [10]  # 0 -> 4 -> 8 ... -> 40
    policy = tune([Measured(ngram, pd.DataFrame(), steps, lookup)], TuneConfig(min_count=1))
    choice = policy.choices["code"]
    assert choice.shape == TreeShape.chain(3)
    decoded = replay_counts(rec, top_chain(3), prefill_drafts=False)
    assert decoded.steps.tolist() == [11]  # 0 (prefill) -> 1 -> 4 -> 8 ... -> 40
    assert choice.tokens_per_step == pytest.approx(40 / 11) and choice.prediction.method == REPLAY
    # after the first token (the prefill's, the same work in every method: a bench's decode
    # speed leaves it out): 39 tokens in 10 chain steps, each proposing, against plain decoding's
    # 0.1 s per token
    assert choice.prediction.decode_tokens_per_step == pytest.approx(39 / 10)
    time = 10 * lookup.step_time(choice.shape, 1.0)
    assert choice.predicted_speedup == pytest.approx(39 * 0.1 / time)


def test_every_chain_tuned_over_is_predicted_in_the_policy_and_found_by_the_bench():
    """The policy's candidates: every chain of the drafter its records hold (1 to 3 here), in
    every domain, replayed, with the speed-up its cost model gives; a bench method decoding one
    of them (ngram with chain depth 2) is set against that prediction, not left unpredicted."""
    steps, lookup, ngram = _lookup_chains_of_three()
    policy = tune([Measured(ngram, pd.DataFrame(), steps, lookup)], TuneConfig(min_count=1))
    loaded = PolicyFile.from_dict(json.loads(json.dumps(policy.to_dict())))
    cells = {(c["domain"], c["tree"]): c for c in loaded.info["candidates"]}
    chains = [TreeShape.chain(k).to_paths_literal() for k in (1, 2, 3)]
    assert set(cells) == {(d, c) for d in ("code", ALL_DOMAINS) for c in chains}
    rec = ReplayRecords.from_frames(pd.DataFrame(), steps)
    for k in (1, 2, 3):
        cell = cells["code", TreeShape.chain(k).to_paths_literal()]
        decoded = replay_counts(rec, top_chain(k), prefill_drafts=False)
        tau = 40 / decoded.steps[0]
        assert cell["prediction"]["tokens_per_step"] == pytest.approx(tau, abs=1e-4)
        assert cell["prediction"]["method"] == REPLAY
        # the speed-up from the steps after the first token (the prefill's plain step)
        later = decoded.after_first()
        rate = later.positions[0] / later.steps[0]
        step = lookup.step_time(TreeShape.chain(k), later.proposals[0] / later.steps[0])
        assert "decode_tokens_per_step" not in cell["prediction"]  # one figure per entry
        assert cell["predicted_speedup"] == pytest.approx(rate / step * 0.1, abs=1e-4)
    config = BenchConfig(chain_depth=2, methods=("plain", "ngram", "uniform"), ngram=ngram)
    found = candidate_predictions(loaded, config)
    assert {k for k in found if k[0] == "ngram"} == {("ngram", "code"), ("ngram", ALL_DOMAINS)}
    # the uniform tree, per domain: its own candidate in that domain, not the pooled entry
    uniform = cells["code", loaded.uniform.to_paths_literal()]
    assert found["uniform", "code"].speedup == uniform["predicted_speedup"]
    chain2 = cells["code", TreeShape.chain(2).to_paths_literal()]
    assert found["ngram", "code"].speedup == chain2["predicted_speedup"]
    assert found["ngram", "code"].tokens_per_step.tokens_per_step == pytest.approx(
        chain2["prediction"]["tokens_per_step"]
    )


def test_step_time_of_a_lookup_that_sometimes_proposes_nothing():
    lookup = CostModel(
        draft_s=((1, 0.001),), target_s=COSTS.target_s, plain_token_s=0.1, model_free=True
    )
    chain = TreeShape.from_paths([(0,), (0, 0), (0, 0, 0)])
    assert lookup.draft_time(chain) == 0.001  # one lookup per step, whatever the depth
    verify = lookup.verify_time(chain)
    assert lookup.step_time(chain, 0.25) == pytest.approx(0.001 + 0.25 * verify + 0.75 * 0.1)
    assert CostModel.from_dict(lookup.to_dict()) == lookup


def test_tune_picks_the_drafter_per_domain():
    """A costly draft model that accepts a little everywhere, a lookup that accepts a lot on
    code and never proposes on chat: code takes the lookup's chain, chat the draft model's tree
    or nothing, and the policy file says which drafter each domain uses."""
    nodes = _nodes_frame()
    slow = CostModel(
        draft_s=((1, 0.05), (8, 0.06), (64, 0.1)), target_s=COSTS.target_s, plain_token_s=0.1
    )
    lookup = CostModel(
        draft_s=((1, 0.0005),), target_s=COSTS.target_s, plain_token_s=0.1, model_free=True
    )
    ngram = DrafterConfig("ngram", prompt_lookup_min=1, prompt_lookup_max=3)
    steps = _ngram_steps()
    policy = tune(
        [draft_model(nodes, slow), Measured(ngram, pd.DataFrame(), steps, lookup)],
        TuneConfig(min_count=1),
    )
    assert policy.drafter_for("code") == ngram and policy.tree_for("code").is_chain
    replayed = replay_counts(
        ReplayRecords.from_frames(pd.DataFrame(), steps), Subtree(policy.tree_for("code"))
    )
    code = (replayed.positions[0], replayed.steps[0])  # prompts sorted: c (code), h (chat)
    assert policy.choices["code"].tokens_per_step == pytest.approx(code[0] / code[1])
    assert policy.drafter_for("chat") == DrafterConfig()
    loaded = PolicyFile.from_dict(json.loads(json.dumps(policy.to_dict())))
    assert loaded.drafter_for("code") == ngram and loaded.trees == policy.trees
    assert set(policy.info["cost_models"]) == {"draft-model", ngram.label}
    with pytest.raises(PolicyError, match="two runs of one drafter"):
        tune([draft_model(nodes), draft_model(nodes)])


def test_trees_deeper_than_measured_are_extrapolated_and_labelled():
    """Records of depth 2: a chain of 3 is the vector's tau, scaled by replay over vector on the
    chain of 2 the records hold, and says it is extrapolated; a chain of 2 is replayed."""
    nodes = _nodes_frame()
    vectors = {k: v.extrapolated(3) for k, v in acceptance_vectors(nodes, 1).items()}
    predictor = Predictor(ReplayRecords.from_frames(nodes, steps_of(nodes)), vectors)
    two, three = TreeShape.chain(2), TreeShape.chain(3)
    replayed = predictor.predict(two, "code")
    assert replayed.method == REPLAY and replayed.tokens_per_step == pytest.approx(2.0)
    far = predictor.predict(three, "code")
    assert far.extrapolated and far.method == EXTRAPOLATED
    scale = 2.0 / vectors["code"].expected_tau(two)
    assert far.tokens_per_step == pytest.approx(vectors["code"].expected_tau(three) * scale)
    assert predictor.with_interval(three, "code") == far  # no interval to give
    assert far.to_dict() == {
        "tokens_per_step": round(far.tokens_per_step, 4),
        "interval": None,
        "method": "extrapolated (acceptance vector)",
    }


def _signal_chains(steps: int = 24) -> pd.DataFrame:
    """Chains of 3 drafted at every position of one prompt per domain: chat's are accepted
    whole, with draft probability 0.9 (entropy 0.5 nats); code's at positions 0-3 of every 8,
    and elsewhere rejected from the root with probability 0.02 (entropy 3.5)."""
    rows = []
    for domain, step in itertools.product(("code", "chat"), range(steps)):
        good = domain == "chat" or step % 8 < 4
        for d in (1, 2, 3):
            rows.append(
                dict(
                    prompt_id=f"{domain}-p",
                    domain=domain,
                    step=step,
                    node_id=d - 1,
                    parent_id=d - 2,
                    depth=d,
                    sibling_rank=0,
                    greedy_accept=good,
                    p_draft=0.9 if good else 0.02,
                    draft_entropy=0.5 if good else 3.5,
                )
            )
    return pd.DataFrame(rows)


def test_tune_cuts_trees_by_a_stop_rule_where_it_pays(tmp_path):
    """Code's rejected chains have draft probability 0.02: a stop at p_draft >= 0.05 drafts
    nothing there (a draft call and a pass of one token instead of three draft calls and a
    verify of four), which loses no token; chat's chains are all kept, so no stop pays there.
    The stop's step time is the cost model's price of the steps the replay cut (nodes verified,
    draft levels fed); the policy file records it, reads it back, and weighs the four kinds."""
    nodes = _signal_chains()
    policy = tune([draft_model(nodes)], TuneConfig(min_count=1, max_depth=3))
    stop = Stop("p_draft", 0.05)  # the first of the grid that cuts
    code = policy.choices["code"]
    assert code.stop == stop and policy.stop_for("code") == stop and code.shape.is_chain
    assert policy.stop_for("chat") is None and policy.uniform_stop == stop
    rec = ReplayRecords.from_frames(nodes, steps_of(nodes))
    cut = replay_counts(rec, StopRule(Subtree(code.shape), p_min=0.05), prefill_drafts=False)
    later = cut.after_first()
    assert cut.positions[1] / cut.steps[1] == code.tokens_per_step  # prompts: chat-p, code-p
    k = len(code.shape)
    kept, stopped = later.drafted_steps[1, k], later.drafted_steps[1, 0]
    assert kept + stopped == later.steps[1] and stopped > 0
    root = np.interp(COSTS.root_tokens, *zip(*COSTS.draft_s))  # the draft's call of 2 tokens
    full = root + (k - 1) * 0.01 + np.interp(k + 1, *zip(*COSTS.target_s))  # levels, verify
    step = (kept * full + stopped * (root + COSTS.plain_token_s)) / later.steps[1]
    assert code.step_time_s == pytest.approx(step)
    rate = later.positions[1] / later.steps[1]
    assert code.predicted_speedup == pytest.approx(rate / step * COSTS.plain_token_s)
    kinds = policy.info["kinds"]  # per domain and mixed: what each kind of policy predicts
    assert kinds["one tree + stop"]["mixed"] > kinds["one tree"]["mixed"]
    for d in ("code", "chat", "mixed"):
        assert kinds["tree per domain"][d] >= kinds["one tree"][d]
        assert kinds["tree per domain + stop"][d] >= kinds["one tree + stop"][d]
    assert kinds["tree per domain + stop"]["code"] == pytest.approx(code.predicted_speedup, 1e-4)
    uniform = policy.choices[ALL_DOMAINS].predicted_speedup  # mixed traffic is the pooled entry
    assert kinds["one tree + stop"]["mixed"] == pytest.approx(uniform, abs=1e-4)
    loaded = PolicyFile.load(policy.save(tmp_path / "policy.json"))
    assert (loaded.stops, loaded.uniform_stop) == ({"code": stop}, stop)
    written = loaded.to_dict()
    assert written["domains"]["code"]["stop"] == {"signal": "p_draft", "threshold": 0.05}
    assert "stop" not in written["domains"]["chat"]
    uniform_method = method_settings(loaded, BenchConfig(methods=("plain", "uniform")))["uniform"]
    assert policy_setting(loaded, "code").stop == uniform_method.stop == stop  # what bench runs
    notes = DeploymentPlan.from_policy(loaded).notes  # an engine export drafts trees whole
    assert any("code: p_draft >= 0.05" in note for note in notes)
    # without the signals, no stop rule is weighed
    blind = tune([draft_model(nodes.drop(columns=["p_draft", "draft_entropy"]))], TuneConfig(1))
    assert blind.stops == {} and blind.choices["code"].predicted_speedup < code.predicted_speedup


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"tree": "none", "stop": {"signal": "p_draft", "threshold": 0.3}}, "cuts a tree"),
        ({"tree": "[(0,)]", "stop": {"signal": "logit", "threshold": 0.3}}, "unknown"),
        ({"tree": "[(0,)]", "stop": {"signal": "p_draft", "threshold": 1.5}}, r"\(0, 1\]"),
        (
            {"tree": "[(0,)]", "backend": "transformers", "stop": Stop("p_draft", 0.3).__dict__},
            "cuts a tree in specscope's decoder",
        ),
    ],
)
def test_policy_file_stop_errors(entry, message):
    with pytest.raises(PolicyError, match=message):
        PolicyFile.from_dict({"domains": {"code": entry}})


# --- policy files --------------------------------------------------------------------------------


def test_policy_file_round_trip(tmp_path):
    policy = tune([draft_model(_long_nodes_frame())], TuneConfig(min_count=1))
    path = policy.save(tmp_path / "policy.json")
    loaded = PolicyFile.load(path)
    assert loaded.trees == policy.trees and loaded.uniform == policy.uniform
    toml = tmp_path / "policy.toml"
    toml.write_text('[domains.code]\ntree = "[(0,), (0, 0)]"\n[domains.chat]\ntree = "none"\n')
    loaded = PolicyFile.load(toml)
    assert loaded.tree_for("code").paths == ((0,), (0, 0)) and loaded.tree_for("chat") is None
    assert loaded.tree_for("math") is None  # not listed, no uniform tree: plain decoding
    # a tuned file says how each tree's tokens per step were predicted, and reads back
    entry = json.loads(path.read_text())["domains"]["code"]
    assert entry["prediction"]["method"] == "replay"
    # the prompts behind the interval, for a bench to widen it for its own sample
    code_prompts = steps_of(_long_nodes_frame()).query("domain == 'code'")["prompt_id"].nunique()
    assert entry["prediction"]["prompts"] == code_prompts
    reloaded = PolicyFile.load(path)
    assert reloaded.predictions["code"].tokens_per_step == pytest.approx(
        policy.choices["code"].tokens_per_step, abs=1e-4
    )
    again = PolicyFile.load(reloaded.save(tmp_path / "again.json"))
    assert again.predictions == reloaded.predictions
    extrapolated = Prediction(4.2, method=EXTRAPOLATED)
    assert Prediction.from_dict(extrapolated.to_dict(), "here") == extrapolated
    with pytest.raises(PolicyError, match="domain 'code'.*method 'guess' is unknown"):
        PolicyFile.from_dict(
            {
                "domains": {
                    "code": {
                        "tree": "[(0,)]",
                        "prediction": {"tokens_per_step": 2, "method": "guess"},
                    }
                }
            }
        )
    with pytest.raises(
        PolicyError, match="^here: prediction.tokens_per_step must be a number, got '3'$"
    ):
        Prediction.from_dict({"tokens_per_step": "3", "method": "replay"}, "here")
    with pytest.raises(PolicyError, match="tokens_per_step must be a number >= 1, got 0.5$"):
        Prediction.from_dict({"tokens_per_step": 0.5, "method": "replay"}, "here")
    with pytest.raises(PolicyError, match="prediction.prompts must be an integer, got 2.5$"):
        Prediction.from_dict({"tokens_per_step": 3, "method": "replay", "prompts": 2.5}, "here")
    with pytest.raises(PolicyError, match="unknown key 'prediction.tokens'; allowed: "):
        Prediction.from_dict({"tokens": 3, "tokens_per_step": 3, "method": "replay"}, "here")


def test_a_prediction_says_where_a_held_out_sample_falls():
    """The interval of 30 tuning prompts, widened for 20 held-out ones by sqrt(1 + 30/20); the
    prompts behind it are recorded in the policy file (older files: the tuning runs' count)."""
    p = Prediction(3.0, 2.9, 3.2, prompts=30)
    assert Prediction.from_dict(p.to_dict(), "here") == p and p.to_dict()["prompts"] == 30
    widen = math.sqrt(2.5)
    assert p.held_out(20) == pytest.approx((3.0 - 0.1 * widen, 3.0 + 0.2 * widen))
    older = Prediction(3.0, 2.9, 3.2)  # a file that predates the count: the tuning runs' prompts
    assert older.held_out(20) is None and older.held_out(20, fitted=30) == p.held_out(20)
    assert p.held_out(20, fitted=5) == p.held_out(20)  # its own count wins
    assert Prediction(3.0, prompts=30).held_out(20) is None  # no interval: nothing to widen


@pytest.mark.parametrize(
    "content, message",
    [
        ({"domains": {"poetry": {"tree": "none"}}}, "unknown domain"),
        ({"domains": {"code": {"tree": "[(0,), (1, 0, 0)]"}}}, "no parent path"),
        ({"domains": {"code": {"tree": "[(0,), (-1,)]"}}}, "malformed tree"),
        ({"domains": {"code": {"tree": "((0,)"}}}, "cannot parse"),
        ({"domains": {"code": {"tree": 3}}}, "domains.code.tree must be a string or a list, got 3"),
        ({"domains": {"code": {"tree": []}}}, "at least one node"),
        ({"domains": {"code": {}}}, "domains.code.tree is missing; give a string or a list"),
        ({"trees": {}}, "domains is missing; give a table"),
        (
            {"domains": {"code": {"tree": "[(0,)]", "expected_taus": 2}}},
            "unknown key 'domains.code.expected_taus'",
        ),
    ],
)
def test_policy_file_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(PolicyError, match=message):
        PolicyFile.load(path)


NGRAM_2_4 = {"kind": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def test_policy_file_drafters_round_trip_json_and_toml(tmp_path):
    chain3 = TreeShape.from_paths([(0,), (0, 0), (0, 0, 0)])
    policy = PolicyFile(
        trees={"code": chain3, "math": TreeShape.from_paths([(0,), (1,)]), "chat": None},
        uniform=TreeShape.from_paths([(0,)]),
        drafters={"code": DrafterConfig("ngram", 2, 4)},
        uniform_drafter=DrafterConfig("early-exit", exit_layer=8),
    )
    written = policy.to_dict()
    assert written["domains"] == {
        "code": {"tree": "[(0,), (0, 0), (0, 0, 0)]", "drafter": NGRAM_2_4},
        "math": {"tree": "[(0,), (1,)]"},  # the draft model: no drafter entry
        "chat": {"tree": "none"},
    }
    assert written["uniform"] == {
        "tree": "[(0,)]",
        "drafter": {"kind": "early-exit", "exit_layer": 8},
    }
    loaded = PolicyFile.load(policy.save(tmp_path / "policy.json"))
    assert loaded.drafters == policy.drafters and loaded.uniform_drafter == policy.uniform_drafter
    assert loaded.drafter_for("code").label == "ngram(prompt_lookup_min=2, prompt_lookup_max=4)"
    assert loaded.drafter_for("math") == DrafterConfig()
    assert loaded.drafter_for("reasoning").kind == "early-exit"  # not listed: the uniform's
    assert loaded.to_dict() == written
    toml = tmp_path / "policy.toml"
    toml.write_text(
        '[domains.code]\ntree = "[(0,), (0, 0), (0, 0, 0)]"\n'
        '[domains.code.drafter]\nkind = "ngram"\nprompt_lookup_min = 2\nprompt_lookup_max = 4\n'
        '[domains.math]\ntree = "[(0,), (1,)]"\n[domains.chat]\ntree = "none"\n'
        '[uniform]\ntree = "[(0,)]"\ndrafter = {kind = "early-exit", exit_layer = 8}\n'
    )
    from_toml = PolicyFile.load(toml)
    assert from_toml.to_dict() == written
    again = PolicyFile.load(from_toml.save(tmp_path / "again.json"))
    assert again.drafters == policy.drafters and again.trees == policy.trees
    # ngram with no bounds is written with vLLM's defaults (both 5), as the engine runs it
    bare = PolicyFile(trees={"code": chain3}, drafters={"code": DrafterConfig("ngram")})
    assert bare.to_dict()["domains"]["code"]["drafter"] == {
        "kind": "ngram",
        "prompt_lookup_min": 5,
        "prompt_lookup_max": 5,
    }


def test_policy_files_without_drafters_are_written_unchanged(tmp_path):
    policy = tune([draft_model(_long_nodes_frame())], TuneConfig(min_count=1))
    assert policy.drafters == {} and policy.uniform_drafter == DrafterConfig()
    written = policy.to_dict()
    assert not any("drafter" in e for e in (*written["domains"].values(), written["uniform"]))
    loaded = PolicyFile.load(policy.save(tmp_path / "policy.json"))
    assert loaded.to_dict()["domains"] == {  # the tree and how its tau was predicted
        d: {"tree": e["tree"], "prediction": e["prediction"]} for d, e in written["domains"].items()
    }
    # the domain policy takes its drafter as an argument (tune will choose it)
    choice = Choice(TreeShape.from_paths([(0,)]), 1.2, 0.1, DrafterConfig("ngram", 1, 3))
    assert choice.drafter.params == {"prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.mark.parametrize(
    "drafter, tree, message",
    [
        ("ngram", '"[(0,)]"', "drafter must be a table \\(an object\\) or none, got 'ngram'"),
        (
            {"prompt_lookup_min": 2},
            '"[(0,)]"',
            "prompt_lookup_min is a parameter of the ngram drafter, not of draft-model",
        ),
        ({"kind": "medusa"}, '"[(0,)]"', r"drafter: unknown drafter 'medusa'; choose one of"),
        (
            {"kind": "ngram", "prompt_lookup_min": 0},
            '"[(0,)]"',
            r"drafter: prompt_lookup_min must be an integer >= 1, got 0$",
        ),
        (
            {"kind": "ngram", "prompt_lookup_min": 2.0},
            '"[(0,)]"',
            r"drafter.prompt_lookup_min must be an integer or none, got 2.0$",
        ),
        (
            {"kind": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            '"[(0,)]"',
            r"prompt_lookup_min \(4\) must be <= prompt_lookup_max \(2\)",
        ),
        (
            {"kind": "ngram", "exit_layer": 3},
            '"[(0,)]"',
            "exit_layer is a parameter of the early-exit drafter, not of ngram",
        ),
        ({"kind": "early-exit"}, '"[(0,)]"', "the early-exit drafter needs exit_layer"),
        (
            {"kind": "ngram", "lookahead": 3},
            '"[(0,)]"',
            r"unknown key 'domains.code.drafter.lookahead'; allowed: exit_layer, kind, ngram_size, "
            r"prompt_lookup_max, prompt_lookup_min$",
        ),
        (
            NGRAM_2_4,
            '"[(0,), (1,), (0, 0)]"',
            r"the ngram drafter proposes one chain, but tree \[\(0,\), \(1,\), \(0, 0\)\] "
            r"has branches; give a chain",
        ),
        (NGRAM_2_4, '"none"', "with tree none; a domain that does not speculate has no drafter"),
    ],
)
def test_policy_file_drafter_errors_name_the_domain_and_field(tmp_path, drafter, tree, message):
    path = tmp_path / "bad.json"
    path.write_text(
        f'{{"domains": {{"code": {{"tree": {tree}, "drafter": {json.dumps(drafter)}}}}}}}'
    )
    # the file first, then the entry: its key (a type, an unknown key) or its domain (a meaning)
    with pytest.raises(
        PolicyError, match=rf"^{path}: (domain 'code': |(unknown key ')?domains.code)"
    ) as error:
        PolicyFile.load(path)
    assert "\n" not in str(error.value)
    with pytest.raises(PolicyError, match=message):
        PolicyFile.load(path)


def test_policy_drafters_are_checked_when_built_in_code():
    with pytest.raises(
        PolicyError, match=r"^domain 'math' has a drafter \(ngram\(.*\)\) but no tree"
    ):
        PolicyFile(trees={"code": None}, drafters={"math": DrafterConfig("ngram")})
    with pytest.raises(PolicyError, match=r"^uniform: the ngram drafter proposes one chain"):
        PolicyFile(
            trees={},
            uniform=TreeShape.from_paths([(0,), (1,)]),
            uniform_drafter=DrafterConfig("ngram"),
        )
    # early exit drafts trees as the draft model does
    tree = TreeShape.from_paths([(0,), (1,)])
    policy = PolicyFile(
        trees={"code": tree}, drafters={"code": DrafterConfig("early-exit", exit_layer=2)}
    )
    assert policy.drafter_for("code").exit_layer == 2


def test_decode_follows_the_policy_files_drafter(tiny_dirs, tmp_path):
    chain = TreeShape.from_paths([(0,), (0, 0)])
    policy = PolicyFile(
        trees={"code": chain, "math": chain}, drafters={"code": DrafterConfig("ngram")}
    )
    path = policy.save(tmp_path / "policy.json")
    for domain, label in (("code", "ngram(prompt_lookup_min=5"), ("math", "draft-model, ")):
        result = CliRunner().invoke(
            app,
            [
                "decode",
                "def f(x):",
                "--policy-file",
                str(path),
                "--domain",
                domain,
                "--max-new-tokens",
                "3",
                *tiny_pair_args(tiny_dirs),
            ],
        )
        assert result.exit_code == 0, result.output
        assert label in result.output


def test_decode_applies_the_policy_files_stop_rule(tiny_dirs, tmp_path):
    """A policy entry's stop rule cuts decode's trees: at p_draft >= 1 a random tiny draft is
    never sure enough, so every step drafts nothing; the same tree uncut drafts its chain."""
    chain = TreeShape.chain(2)
    for stops in ({}, {"code": Stop("p_draft", 1.0)}):
        path = PolicyFile(trees={"code": chain}, stops=stops).save(tmp_path / "policy.json")
        records = tmp_path / "steps.jsonl"
        result = CliRunner().invoke(
            app,
            [
                "decode",
                "def f(x):",
                *("--policy-file", str(path), "--domain", "code", "--max-new-tokens", "6"),
                *("--records", str(records), *tiny_pair_args(tiny_dirs)),
            ],
        )
        assert result.exit_code == 0, result.output
        assert ("stop p_draft >= 1" in result.output) == bool(stops)
        drafted = pd.read_json(records, lines=True)["tree_size"].iloc[1:]
        assert (drafted == 0).all() if stops else (drafted > 0).all()


def test_policy_file_not_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{domains: ")
    with pytest.raises(PolicyError, match="not valid"):
        PolicyFile.load(path)


def test_make_speculation_errors():
    with pytest.raises(PolicyError, match="unknown policy"):
        make_speculation("medusa")
    with pytest.raises(PolicyError, match="acceptance vector"):
        make_speculation("optimal")
    with pytest.raises(PolicyError, match=">= 1"):
        make_speculation("dynamic", max_nodes=0)
    assert make_speculation("none") is None
    assert len(make_speculation("chain", depth=3)) == 3


# --- bench summary ---------------------------------------------------------------------------------


def test_bench_summary_and_config():
    from specscope.tune.bench import BenchRun

    runs = [
        BenchRun("plain", "a", "code", "", (1, 2, 3, 4), 4, 2.0, 0.5),
        BenchRun("chain", "a", "code", "", (1, 2, 3, 4), 2, 1.0, 0.5),
        BenchRun("plain", "b", "chat", "", (5, 6), 2, 1.0, 0.5),
        BenchRun("chain", "b", "chat", "", (5, 7), 1, 2.0, 0.5),
    ]
    rows = {(r.method, r.domain): r for r in summarize_bench(runs)}
    # code: plain 3 later tokens in 1.5 s, chain in 0.5 s; end to end 4 tokens in 2 s vs 1 s
    assert rows["chain", "code"].decode_tokens_per_s == pytest.approx(6.0)
    assert rows["chain", "code"].speedup == pytest.approx(3.0)
    assert rows["chain", "code"].e2e_speedup == pytest.approx(2.0)
    assert rows["chain", "code"].tau == 2.0 and rows["chain", "code"].exact
    assert not rows["chain", "chat"].exact and not rows["chain", "all"].exact
    assert rows["chain", "all"].tokens_per_s == pytest.approx(2.0)
    assert rows["chain", "all"].decode_tokens_per_s == pytest.approx(4 / 2.0)
    assert rows["plain", "all"].decode_tokens_per_s == pytest.approx(4 / 2.0)
    assert np.isnan(rows["chain", "code"].speedup_lo)  # one prompt per domain: no interval
    # five prompts of one domain, speed-ups 1.5x to 2.5x: an interval around the pooled ratio
    many = [
        BenchRun(method, f"p{i}", "code", "", (1,) * 11, 10, 0.5 + secs, 0.5)
        for i, factor in enumerate((1.5, 1.75, 2.0, 2.25, 2.5))
        for method, secs in (("plain", 1.0), ("chain", 1.0 / factor))
    ]
    row = {(r.method, r.domain): r for r in summarize_bench(many)}["chain", "code"]
    pooled = 50 / sum(1 / f for f in (1.5, 1.75, 2.0, 2.25, 2.5)) / 10  # decode tok/s over plain's
    assert row.speedup == pytest.approx(pooled)
    assert 1.0 < row.speedup_lo < pooled < row.speedup_hi < 3.0  # a t interval on 4 df
    with pytest.raises(DecodeError, match="unknown bench method"):
        BenchConfig(methods=("plain", "medusa"))
    with pytest.raises(DecodeError, match="reference"):
        BenchConfig(methods=("chain",))


# --- CLI -------------------------------------------------------------------------------------------


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_tune_then_routed_decode(tiny_dirs, tmp_path):
    from specscope.models import PairConfig
    from specscope.run.config import PromptSpec, RunConfig
    from specscope.run.study import run_study
    from specscope.trees import TreeConfig

    pair = PairConfig(
        draft=str(tiny_dirs["llama", "draft"]),
        target=str(tiny_dirs["llama", "target"]),
        dtype="float32",
    )
    config = RunConfig(
        pair=pair,
        tree=TreeConfig(policy="static", paths="[(0,), (1,), (0, 0), (0, 1)]"),
        prompts=PromptSpec(smoke=True),
        max_new_tokens=4,
        criteria=None,
    )
    run_study(config, tmp_path / "run", progress=False)
    costs = COSTS.save(tmp_path / "costs.json")
    policy = tmp_path / "policy.json"
    result = _cli("tune", tmp_path / "run", "--costs", costs, "--out", policy, "--min-count", 1)
    assert result.exit_code == 0, result.output
    assert "uniform" in result.output
    loaded = PolicyFile.load(policy)
    assert set(loaded.trees) <= {"code", "math", "reasoning", "chat"}
    result = _cli(
        "decode",
        "def f(x):",
        "--policy-file",
        policy,
        "--max-new-tokens",
        5,
        "--draft",
        pair.draft,
        "--target",
        pair.target,
        "--dtype",
        "float32",
    )
    assert result.exit_code == 0, result.output
    assert "domain code" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"domains": {"poetry": {"tree": "none"}}}))
    result = _cli("decode", "x", "--policy-file", bad)
    assert result.exit_code == 2 and "unknown domain" in result.output


def test_decode_and_tune_take_hub_ids_at_revisions(local_hub, tmp_path):
    from specscope.models import PairConfig
    from specscope.run.config import PromptSpec, RunConfig
    from specscope.run.study import run_study
    from specscope.trees import TreeConfig
    from specscope.tune.choose import PairRequest, decode_pair_config

    hub_pair = ["--draft", local_hub, "--target", local_hub, "--dtype", "float32"]
    result = _cli(
        "decode", "def f(x):", "--max-new-tokens", 3, "--target-revision", "v2", *hub_pair
    )
    assert result.exit_code == 0, result.output
    runs = {}
    for revision in ("v2", None):  # the target at tag v2, then at the hub's default branch
        pair = PairConfig(draft=local_hub, target=local_hub, target_revision=revision)
        config = RunConfig(
            pair=dataclasses.replace(pair, dtype="float32"),
            tree=TreeConfig(policy="chain", depth=2),
            prompts=PromptSpec(smoke=True),
            max_new_tokens=2,
            criteria=None,
        )
        runs[revision] = run_study(config, tmp_path / f"run-{revision}", progress=False).run_dir
    section = load_run(runs["v2"]).manifest["config"]["pair"]
    assert decode_pair_config(PairRequest(), section).target_revision == "v2"  # the run's
    assert (
        decode_pair_config(PairRequest(target_revision="main"), section).target_revision == "main"
    )
    costs = COSTS.save(tmp_path / "costs.json")
    policy = tmp_path / "policy.json"
    result = _cli("tune", runs["v2"], "--costs", costs, "--out", policy, "--min-count", 1)
    assert result.exit_code == 0, result.output
    target = PolicyFile.load(policy).info["source"]["target"]
    assert (target["model"], target["revision"]) == (local_hub, "v2")
    result = _cli("tune", runs["v2"], runs[None], "--out", tmp_path / "both.json")
    assert result.exit_code == 2
    assert "different targets (org/tiny, org/tiny at revision v2)" in result.output
