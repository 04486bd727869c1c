"""Measurement (measure/): the records one step gives, the driver that commits the target's greedy
token per row at any batch size, the naive oracle that proves it, and the checks before a run;
on tiny random Llama and Qwen2 models."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import read_records, run_config
from specscope.core.batch import Batch, Row, StepScores
from specscope.core.passes import greedy_token
from specscope.measure import checks
from specscope.measure.checks import MeasureError
from specscope.measure.naive import NaiveOracle
from specscope.measure.records import step_record
from specscope.models import load_pair
from specscope.models.tiny import near_pair
from specscope.records import RunDir
from specscope.run.study import run_study
from specscope.trees import TreeConfig, TreeShape

SHAPES = {
    "chain": TreeConfig(policy="chain", depth=4).shape(),
    "paper": TreeConfig(policy="paper").shape(),
    "six": TreeShape.parse("[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)]"),
}
EXACT_NODE_COLUMNS = [
    "prompt_id",
    "step",
    "node_id",
    "parent_id",
    "depth",
    "sibling_rank",
    "token_id",
    "greedy_accept",
    "target_rank",
]
FLOAT_NODE_COLUMNS = [
    "p_target",
    "target_entropy",
    "target_top1_prob",
    "target_margin",
    "p_draft",
    "alpha",
    "draft_entropy",
    "kl_target_draft",
]
STEP_COLUMNS = ["prompt_id", "step", "emitted_token", "accepted_len", "tau", "context_len"]


@pytest.fixture(scope="module")
def pair(arch, tokenizer):
    return near_pair(arch, len(tokenizer))


@pytest.fixture
def prompts(tmp_path):
    # prompts of very different lengths, so the batch is ragged and rows finish at other times
    path = tmp_path / "p.jsonl"
    texts = [
        "Hi.",
        "Explain recursion " * 6,
        "2+2?",
        "Write a long story about " * 3 + "a cat.",
        "Why?",
        "List three colours, please.",
        "ok",
        "Translate 'bonjour' to English.",
    ]
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "domain": ["code", "chat"][i % 2], "prompt": t}) + "\n"
            for i, t in enumerate(texts)
        )
    )
    return path


def _context(tokenizer):
    return tokenizer("def add(a, b):\n    return")["input_ids"]


def _steps(draft, target, vocab, context, shape, steps):
    """(scores, record) of ``steps`` steps of one prompt measured alone (a batch of one row)."""
    batch = Batch(draft, target, vocab)
    with torch.inference_mode():
        batch.refill([], [Row(list(context), None)])
        for _ in range(steps):
            scores = batch.score(shape)[0]
            record = step_record(scores, shape)
            yield scores, record
            batch.rows[0].context.append(record.emitted_token)


def _sorted(df: pd.DataFrame, keys) -> pd.DataFrame:
    return df.sort_values(keys).reset_index(drop=True)


def _compare(a_dir, b_dir, atol: float | None, rank_atol: int = 0) -> None:
    """Two runs' records: the same nodes, tokens and steps; floats equal (``atol`` None) or
    within ``atol``; target ranks within ``rank_atol``, and different in at most 5% of nodes."""
    (na, sa, pa_), (nb, sb, pb) = read_records(a_dir), read_records(b_dir)
    na, nb = (_sorted(n, ["prompt_id", "step", "node_id"]) for n in (na, nb))
    assert len(na) == len(nb) > 0
    exact = [c for c in EXACT_NODE_COLUMNS if c != "target_rank" or not rank_atol]
    pd.testing.assert_frame_equal(na[exact], nb[exact])
    rank_diff = (na.target_rank - nb.target_rank).abs()
    assert rank_diff.max() <= rank_atol and (rank_diff > 0).mean() <= 0.05, rank_diff.describe()
    for column in FLOAT_NODE_COLUMNS:
        if atol is None:
            np.testing.assert_array_equal(na[column], nb[column], err_msg=column)
        else:
            np.testing.assert_allclose(na[column], nb[column], atol=atol, rtol=0, err_msg=column)
    sa, sb = (_sorted(s, ["prompt_id", "step"]) for s in (sa, sb))
    pd.testing.assert_frame_equal(sa[STEP_COLUMNS], sb[STEP_COLUMNS])
    pa_, pb = (_sorted(p, ["prompt_id"]) for p in (pa_, pb))
    assert [list(x) for x in pa_.output_token_ids] == [list(x) for x in pb.output_token_ids]
    assert list(pa_.order) == list(pb.order)


# --- one step's records ----------------------------------------------------------------------------


def test_cached_steps_and_the_naive_oracle_agree(pair, tokenizer):
    draft, target = pair
    shape = SHAPES["paper"]
    context = _context(tokenizer)
    naive = NaiveOracle(draft, target, len(tokenizer))
    accepted = 0
    for a, ra in _steps(draft, target, len(tokenizer), context, shape, 6):
        b = naive.score(context, shape)
        rb = step_record(b, shape)
        assert torch.equal(a.tokens, b.tokens)
        assert ra.emitted_token == rb.emitted_token and ra.accepted_len == rb.accepted_len
        for col in ("p_draft", "p_target", "alpha", "target_entropy", "kl_target_draft"):
            np.testing.assert_allclose(ra.nodes[col], rb.nodes[col], atol=1e-5)
        for col in ("greedy_accept", "target_rank", "sibling_rank", "depth"):
            np.testing.assert_array_equal(ra.nodes[col], rb.nodes[col])
        accepted += ra.accepted_len
        context = context + [ra.emitted_token]
    assert accepted > 0, "the close draft should have some greedy-accepted nodes"


def test_trajectory_is_the_targets_greedy_output(pair, tokenizer):
    draft, target = pair
    context = _context(tokenizer)
    out = [
        r.emitted_token
        for _, r in _steps(draft, target, len(tokenizer), context, SHAPES["paper"], 10)
    ]
    with torch.inference_mode():
        ids = torch.tensor([context])
        for _ in range(10):
            nxt = target(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], 1)
    assert out == ids[0, len(context) :].tolist()


def test_node_figures_are_consistent(pair, tokenizer):
    draft, target = pair
    shape = SHAPES["paper"]
    scores, record = next(_steps(draft, target, len(tokenizer), _context(tokenizer), shape, 1))
    nodes = record.nodes
    assert np.all((nodes["p_draft"] > 0) & (nodes["p_draft"] <= 1))
    assert np.all((nodes["p_target"] > 0) & (nodes["p_target"] <= 1))
    np.testing.assert_allclose(nodes["alpha"], np.minimum(1, nodes["p_target"] / nodes["p_draft"]))
    assert np.all(nodes["target_entropy"] >= 0) and np.all(nodes["kl_target_draft"] >= -1e-6)
    assert np.array_equal(nodes["greedy_accept"], nodes["target_rank"] == 0)
    # Siblings share their context: same entropy, distinct tokens in draft-rank order.
    assert nodes["target_entropy"][0] == nodes["target_entropy"][1]
    assert nodes["p_draft"][0] >= nodes["p_draft"][1]
    assert nodes["token_id"][0] != nodes["token_id"][1]
    # Roots' tokens are the draft's top two tokens at the context.
    top2 = torch.topk(scores.q[0], 2).indices.tolist()
    assert nodes["token_id"][:2].tolist() == top2


def test_accepted_len_is_longest_accepted_path():
    shape = SHAPES["paper"]
    V = 5
    # Target greedy token at every context is 0; choose tokens so that path 0 -> 2 -> 6 accepts.
    p = torch.full((len(shape) + 1, V), 0.1)
    p[:, 0] = 0.6
    q = torch.full((1, V), 0.2)
    tokens = torch.tensor([0, 1, 0, 1, 0, 0, 0, 1])

    scores = StepScores(
        tokens, q, torch.zeros(len(shape), dtype=torch.long), p, 0.0, 0.0, len(shape)
    )
    record = step_record(scores, shape)
    assert record.nodes["greedy_accept"].tolist() == [bool(x) for x in (1, 0, 1, 0, 1, 1, 1, 0)]
    assert record.accepted_len == 3  # nodes 4, 5 accept but hang off a rejected root
    assert record.emitted_token == 0


def test_one_tie_rule_for_records_and_decoder():
    # two tokens tie for the target's top probability: the lower id is the greedy token, in the
    # recorded greedy_accept and target_rank as in the emitted token and the decoder's verifier
    p = torch.tensor([[0.1, 0.4, 0.4, 0.1]] * 3)
    q = torch.tensor([[0.1, 0.3, 0.5, 0.1]])
    shape = TreeShape(parents=(-1, -1), ranks=(0, 1))
    tokens = torch.tensor([2, 1])  # the draft's top token (2) and runner-up (1)
    scores = StepScores(tokens, q, torch.tensor([0, 0]), p, 0.0, 0.0, 2)
    rec = step_record(scores, shape)
    assert int(greedy_token(p[0])) == 1 == rec.emitted_token
    assert list(rec.nodes["greedy_accept"]) == [False, True]
    assert list(rec.nodes["target_rank"]) == [1, 0]
    assert rec.accepted_len == 1


@pytest.mark.parametrize("seed", range(4))
def test_target_rank_equals_a_full_ranking(seed):
    """A node's target_rank, read off its context's top 16 when it can be: the rank in a stable
    descending sort of the whole row (ties by token id), for tokens inside and far outside the
    top 16, with many ties."""
    gen = torch.Generator().manual_seed(seed)
    shape = SHAPES["six"]
    V = 300
    logits = torch.randn(len(shape) + 1, V, generator=gen) * 2
    logits[:, ::3] = logits[:, ::3].round()  # ties
    p = torch.softmax(logits, -1)
    contexts = [parent + 1 for parent in shape.parents]
    ranked = [torch.sort(-p[c], stable=True).indices for c in range(len(shape) + 1)]
    picks = [0, 3, 15, 16, 40, 299]  # ranks to draft at: inside, at the edge and outside the top 16
    tokens = torch.stack([ranked[c][picks[i]] for i, c in enumerate(contexts)])
    q = torch.full((1, V), 1 / V)
    scores = StepScores(
        tokens, q, torch.zeros(len(shape), dtype=torch.long), p, 0.0, 0.0, len(shape)
    )
    expected = [int((ranked[c] == t).nonzero()) for c, t in zip(contexts, tokens.tolist())]
    assert step_record(scores, shape).nodes["target_rank"].tolist() == expected == picks


# --- runs: every batch size, both engines, every dtype the tiny pairs allow ------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize(
    "tree",
    [TreeConfig(policy="paper"), TreeConfig(policy="chain", depth=4)],
    ids=["paper", "chain4"],
)
@pytest.mark.slow
def test_batched_records_equal_one_prompt_at_a_time(tiny_dirs, prompts, tmp_path, arch, tree):
    config = run_config(tiny_dirs, prompts, arch, tree=tree, max_new_tokens=7)
    run_study(config, tmp_path / "one", progress=False)
    run_study(config, tmp_path / "three", progress=False, batch_size=3)
    run_study(config, tmp_path / "all", progress=False, batch_size=8)
    _compare(tmp_path / "one", tmp_path / "three", atol=1e-5)
    _compare(tmp_path / "one", tmp_path / "all", atol=1e-5)
    assert (
        json.loads((tmp_path / "three" / "manifest.json").read_text())["execution"]["batch_size"]
        == 3
    )


# How far records of one config may be apart, by dtype, across batch sizes and across engines
# (None = the same bits), and how far target ranks may be: float32: batched kernels round
# differently (1e-5); bfloat16: rounding of 8 mantissa bits, which also reorders near-tied tokens
# far down a row (a token whose logit moves by one rounding step passes the few of the tiny
# pair's 256 tokens within that step: ranks off by up to 8 in a few nodes; tokens and
# trajectories still agree); int8: linears and row-wise attention make every row's figures
# independent of the batch.
PINNED = {"float32": (1e-5, 1e-5, 0), "bfloat16": (2e-2, 2e-2, 8), "int8": (None, 1e-5, 0)}


@pytest.mark.slow
@pytest.mark.parametrize(
    "dtype", [pytest.param(d, marks=pytest.mark.int8) if d == "int8" else d for d in PINNED]
)
def test_records_pinned_across_batch_sizes_and_engines(tiny_dirs, prompts, tmp_path, dtype):
    """One config measured at B = 1 and B = 4 and by the naive oracle: the same nodes, tokens,
    steps and outputs; the figures equal within the dtype's tolerance (batch sizes, engines)."""
    pair = {"dtype": "float32", "quantize": "int8"} if dtype == "int8" else {"dtype": dtype}
    config = run_config(tiny_dirs, prompts, "qwen2", pair=pair, max_new_tokens=6)
    run_study(config, tmp_path / "b1", progress=False, batch_size=1)
    run_study(config, tmp_path / "b4", progress=False, batch_size=4)
    run_study(config.replace(engine="naive"), tmp_path / "naive", progress=False)
    across_batches, across_engines, ranks = PINNED[dtype]
    _compare(tmp_path / "b1", tmp_path / "b4", across_batches, ranks)
    _compare(tmp_path / "b1", tmp_path / "naive", across_engines, ranks)


@pytest.mark.int8
def test_int8_measurement_gives_the_draft_its_attention_back(tiny_dirs, prompts, tmp_path):
    # the draft measures on row-wise attention (batch-invariant q), then decodes on SDPA again
    config = run_config(tiny_dirs, prompts, "qwen2", pair={"quantize": "int8"}, max_new_tokens=2)
    pair = load_pair(config.pair)
    before = pair.draft.model.config._attn_implementation
    run_study(config, tmp_path / "r", progress=False, batch_size=2, pair=pair)
    assert pair.draft.model.config._attn_implementation == before != "specscope_rowwise"


@pytest.mark.slow
def test_an_interrupted_batched_run_resumes_to_the_same_records(
    tiny_dirs, prompts, tmp_path, monkeypatch
):
    config = run_config(tiny_dirs, prompts, "llama", max_new_tokens=7)
    run_study(config, tmp_path / "whole", progress=False, batch_size=3)
    real = RunDir.commit_prompt
    calls = {"n": 0}

    def dies_after_three(self, *args, **kwargs):
        if calls["n"] == 3:
            raise KeyboardInterrupt
        calls["n"] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RunDir, "commit_prompt", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        run_study(config, tmp_path / "cut", progress=False, batch_size=3)
    monkeypatch.setattr(RunDir, "commit_prompt", real)
    summary = run_study(config, tmp_path / "cut", progress=False, batch_size=3)
    assert summary.prompts_measured == 8 - 3
    _compare(tmp_path / "whole", tmp_path / "cut", atol=1e-5)  # rows meet other partners


def test_bad_batch_sizes_are_refused_before_anything_is_written(
    tiny_dirs, prompts, tmp_path, monkeypatch
):
    config = run_config(tiny_dirs, prompts, "llama", max_new_tokens=7)
    with pytest.raises(MeasureError, match="batch size must be >= 1, got 0"):
        run_study(config, tmp_path / "zero", progress=False, batch_size=0)
    monkeypatch.setattr(checks, "_available_bytes", lambda device: 5 * 2**20)
    with pytest.raises(
        MeasureError,
        match=r"--batch-size 64 needs about .* the largest batch "
        r"that fits is about \d+",
    ):
        run_study(config, tmp_path / "huge", progress=False, batch_size=64)
    assert not (tmp_path / "zero").exists() and not (tmp_path / "huge").exists()
    with pytest.raises(MeasureError, match="needs the cached engine"):
        run_study(config.replace(engine="naive"), tmp_path / "n", progress=False, batch_size=2)


@pytest.mark.int8
def test_int8_records_are_the_same_from_a_cold_and_a_warm_int8_cache(
    tiny_dirs, prompts, tmp_path, monkeypatch
):
    """The second int8 run reads both models from the int8 cache and measures what the first
    measured from the float weights: the same records and the same models in the manifest."""
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path / "cache"))
    config = run_config(tiny_dirs, prompts, "llama", pair={"quantize": "int8"}, max_new_tokens=6)
    run_study(config, tmp_path / "cold", progress=False, batch_size=4)
    assert len(list((tmp_path / "cache" / "int8").iterdir())) == 2  # draft and target
    run_study(config, tmp_path / "warm", progress=False, batch_size=4)
    for cold, warm in zip(read_records(tmp_path / "cold"), read_records(tmp_path / "warm")):
        pd.testing.assert_frame_equal(cold, warm)
    models = [
        json.loads((tmp_path / r / "manifest.json").read_text())["models"] for r in ("cold", "warm")
    ]
    assert models[0] == models[1]
