"""Speculative decoding, verification, optimal trees, policies, routing: on tiny random models."""

import itertools
import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import make_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats
from specscope.cli import app
from specscope.core.passes import keep_positions
from specscope.core.sampling import gumbel_topk_scores, speculative_sample, warp
from specscope.decode import (
    DecodeConfig,
    DecodeError,
    SpeculativeDecoder,
    plain_generate,
)
from specscope.prompts.items import PromptItem
from specscope.trees import (
    DynamicTree,
    TreeShape,
    bfs_prefix,
    contiguous_ranks,
    cut_depth,
)
from specscope.tune.acceptance import AcceptanceVector, PolicyError, acceptance_vectors
from specscope.tune.bench import BenchConfig, summarize_bench
from specscope.tune.costs import CostModel
from specscope.tune.optimal import optimal_tree
from specscope.tune.policy import (
    PolicyFile,
    TuneConfig,
    best_tree,
    make_speculation,
    tune,
)
from specscope.tune.router import (
    LearnedRouter,
    RuleRouter,
    holdout_split,
    prompt_text,
    router_accuracy,
)
from typer.testing import CliRunner

PROMPTS = ["def add(a, b):\n    return", "The capital of France is", "x = [1, 2, 3]\nfor i in",
           "Once upon a time", "a"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread, and a busy machine does not stall them."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _pair(arch: str, tokenizer, noise: float, seed: int):
    target = make_model(arch, len(tokenizer), seed=2, layers=2)
    draft = make_model(arch, len(tokenizer), seed=2, layers=2)
    torch.manual_seed(seed)
    with torch.no_grad():  # a draft near the target (noise 0.05) or far from it (noise 1.0)
        for p in draft.parameters():
            p.mul_(1 + noise * torch.randn_like(p))
    return draft, target


@pytest.fixture(scope="module")
def decoders(tokenizer):
    """(arch, draft quality) -> decoder; shared by the property tests."""
    out = {}
    for arch in ("llama", "qwen2"):
        for name, noise in (("close", 0.05), ("far", 1.0)):
            draft, target = _pair(arch, tokenizer, noise, seed=7)
            out[arch, name] = SpeculativeDecoder(draft, target, len(tokenizer), frozenset())
    return out


@st.composite
def tree_shapes(draw, max_nodes: int = 10):
    """Random trees: each new node hangs under the root or an earlier node, at an unused rank."""
    paths: list[tuple[int, ...]] = []
    for _ in range(draw(st.integers(1, max_nodes))):
        parent = draw(st.sampled_from([()] + paths))
        used = {p[-1] for p in paths if p[:-1] == parent}
        free = [r for r in range(4) if r not in used]
        if free:
            paths.append(parent + (draw(st.sampled_from(free)),))
    return TreeShape.from_paths(paths)


specs = st.one_of(
    tree_shapes(),
    st.builds(DynamicTree, max_nodes=st.integers(1, 12), depth=st.integers(1, 5),
              top_k=st.integers(1, 4)),
)


# --- greedy: lossless ---------------------------------------------------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=specs, arch=st.sampled_from(["llama", "qwen2"]),
       quality=st.sampled_from(["close", "far"]), prompt=st.sampled_from(PROMPTS),
       max_new=st.integers(1, 14), min_path_prob=st.sampled_from([0.0, 0.0, 0.05, 0.5]))
def test_greedy_speculation_equals_plain_greedy(decoders, tokenizer, spec, arch, quality, prompt,
                                                max_new, min_path_prob):
    decoder = decoders[arch, quality]
    ids = tokenizer(prompt)["input_ids"]
    config = DecodeConfig(max_new_tokens=max_new, min_path_prob=min_path_prob)
    plain = plain_generate(decoder.target, ids, config, decoder.vocab)
    spec_out = decoder.generate(ids, spec, config)
    assert spec_out.tokens == plain.tokens
    assert sum(s.tau for s in spec_out.steps) >= len(spec_out.tokens)
    assert all(s.tau == s.accepted_len + 1 for s in spec_out.steps)


def test_close_draft_accepts_and_far_draft_still_lossless(decoders, tokenizer):
    ids = tokenizer(PROMPTS[0])["input_ids"]
    config = DecodeConfig(max_new_tokens=24)
    shape = make_speculation("paper")
    close = decoders["llama", "close"].generate(ids, shape, config)
    assert close.mean_tau > 1.5, "a draft near the target should get nodes accepted"
    assert len(close.steps) < 24


def test_eos_stops_and_eos_at_once_gives_empty_text(decoders, tokenizer):
    decoder = decoders["qwen2", "close"]
    ids = tokenizer(PROMPTS[1])["input_ids"]
    config = DecodeConfig(max_new_tokens=12)
    reference = plain_generate(decoder.target, ids, config, decoder.vocab).tokens
    first = reference[0]
    eos_decoder = SpeculativeDecoder(decoder.draft, decoder.target, decoder.vocab, frozenset({first}))
    out = eos_decoder.generate(ids, make_speculation("chain", depth=3), config)
    assert out.tokens == [first] and out.stop_reason == "eos"
    assert tokenizer.decode(out.tokens[:-1]) == ""
    # an EOS in the middle of an accepted path cuts the output right after it
    stop = reference[5]
    cut = SpeculativeDecoder(decoder.draft, decoder.target, decoder.vocab, frozenset({stop}))
    out = cut.generate(ids, make_speculation("chain", depth=4), config)
    assert out.tokens == reference[:reference.index(stop) + 1]


def test_bad_decode_settings_are_clear_errors(decoders, tokenizer):
    with pytest.raises(DecodeError, match="temperature"):
        DecodeConfig(temperature=-0.1)
    for top_p in (0.0, 1.5, -1):
        with pytest.raises(DecodeError, match="top_p"):
            DecodeConfig(top_p=top_p)
    with pytest.raises(DecodeError, match="max_new_tokens"):
        DecodeConfig(max_new_tokens=0)
    with pytest.raises(DecodeError, match="min_path_prob"):
        DecodeConfig(min_path_prob=1.0)
    decoder = decoders["llama", "close"]
    with pytest.raises(DecodeError, match="positions"):  # tiny models allow 1024 positions
        decoder.generate([1] * 1000, make_speculation("chain", depth=8), DecodeConfig(max_new_tokens=20))
    with pytest.raises(DecodeError, match="no tokens"):
        decoder.generate([], make_speculation("chain"), DecodeConfig())


def test_int8_linear_is_batch_invariant_and_close():
    from specscope.models.int8 import Int8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    int8 = Int8Linear(linear)
    x = torch.randn(2, 9, 64) * torch.rand(2, 9, 1) * 10
    with torch.inference_mode():
        together = int8(x)
        alone = torch.stack([torch.cat([int8(x[b, i:i + 1]) for i in range(9)]) for b in range(2)])
        exact = linear(x)
    assert torch.equal(together, alone)  # bit for bit, whatever else is in the batch
    assert ((together - exact).norm() / exact.norm()) < 0.03


def test_rowwise_attention_causal_prefix_equals_the_masked_gather():
    # A prefill passes no mask: each query reads a prefix view of the keys instead of gathering
    # them through the mask; the results must be the same bits.
    from specscope.models.int8 import rowwise_attention

    torch.manual_seed(0)
    query = torch.randn(2, 4, 7, 16)
    key, value = torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16)
    causal = torch.ones(7, 10, dtype=torch.bool).tril(3)[None, None].expand(2, 1, 7, 10)
    no_mask, _ = rowwise_attention(None, query, key, value, None)
    masked, _ = rowwise_attention(None, query, key, value, causal)
    assert torch.equal(no_mask, masked)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int8_pair_greedy_speculation_is_exactly_plain(tokenizer, arch):
    """int8 models with row-wise attention: every tree, transformers' greedy generate() and its
    assisted generation give the same tokens, because a token's logits do not depend on the pass."""
    from specscope.models.int8 import quantize_int8, use_rowwise_attention
    from specscope.tune.bench import hf_generate

    draft, target = _pair(arch, tokenizer, 0.3, seed=7)
    quantize_int8(draft)
    use_rowwise_attention(quantize_int8(target))
    decoder = SpeculativeDecoder(draft, target, len(tokenizer), frozenset())
    config = DecodeConfig(max_new_tokens=24)
    for prompt in PROMPTS[:3]:
        ids = tokenizer(prompt)["input_ids"]
        plain, _ = hf_generate(target, ids, 24, frozenset())
        assert plain_generate(target, ids, config, len(tokenizer)).tokens == plain
        for spec in (make_speculation("paper"), make_speculation("chain", depth=6),
                     TreeShape.parse("[(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)]"),
                     DynamicTree(12, 4, 3)):
            assert decoder.generate(ids, spec, config).tokens == plain, (prompt, spec)
        assert hf_generate(target, ids, 24, frozenset(), assistant=draft)[0] == plain


def test_int8_needs_float32_on_the_cpu(tokenizer):
    from specscope.models import ModelLoadError, PairConfig
    from specscope.models.int8 import quantize_int8

    with pytest.raises(ModelLoadError, match="float32"):
        quantize_int8(make_model("llama", len(tokenizer), seed=1).to(torch.bfloat16))
    with pytest.raises(ModelLoadError, match="float32"):
        PairConfig(quantize="int8")  # dtype defaults to bfloat16
    with pytest.raises(ModelLoadError, match="unknown quantization"):
        PairConfig(dtype="float32", quantize="int4")


def test_keep_positions_gathers_every_layer(tokenizer):
    from transformers import DynamicCache

    model = make_model("llama", len(tokenizer), seed=3, layers=2)
    ids = tokenizer("hello world, tree")["input_ids"]
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
        before = [layer.keys.clone() for layer in cache.layers]
        keep = [0, 1, 2, 5, 7, 8]
        keep_positions(cache, keep)
        assert cache.get_seq_length() == len(keep)
        for layer, old in zip(cache.layers, before):
            torch.testing.assert_close(layer.keys, old[..., keep, :])


# --- stochastic verification --------------------------------------------------------------------


def _chi_square_p(samples: list[int], p: np.ndarray) -> float:
    counts = np.bincount(samples, minlength=len(p))
    keep = p > 0
    assert counts[~keep].sum() == 0, "a token outside the target's support was emitted"
    return stats.chisquare(counts[keep], p[keep] * len(samples)).pvalue


@pytest.mark.parametrize("k, sampled", [(1, True), (3, True), (2, False), (4, False)])
def test_speculative_sampling_preserves_the_target_distribution(k, sampled):
    """The emitted token of one node's multi-round verification is distributed as p."""
    rng = np.random.default_rng(0)
    p = torch.tensor(rng.dirichlet(np.ones(6) * 0.7))
    p[5] = 0.0  # a token the target never emits
    p /= p.sum()
    q = torch.tensor(rng.dirichlet(np.ones(6)))
    gen = torch.Generator().manual_seed(1)
    emitted = []
    for _ in range(10000):
        if sampled:  # k draws from q without replacement
            cands = torch.topk(gumbel_topk_scores(q.float(), gen), k).indices.tolist()
            _, token = speculative_sample(p, cands, q, gen)
        else:  # the draft's top-k tokens, deterministic
            _, token = speculative_sample(p, torch.topk(q, k).indices.tolist(), None, gen)
        emitted.append(token)
    assert _chi_square_p(emitted, p.numpy()) > 1e-3


@pytest.mark.parametrize("min_path_prob", [0.0, 0.5])
def test_sampled_tree_decoding_matches_target_joint_distribution(decoders, tokenizer, min_path_prob):
    """Three tokens vs the target's exact joint p(t1) p(t2|t1) p(t3|t1,t2): t1 comes from the
    prefill, t2 and t3 from speculative sampling over the tree."""
    decoder = decoders["llama", "close"]
    ids = tokenizer(PROMPTS[3])["input_ids"]
    warping = dict(temperature=0.5, top_p=0.8)

    def p_next(context):
        return warp(decoder.target(torch.tensor([context])).logits[0, -1], decoder.vocab, **warping)

    joint = {}
    with torch.inference_mode():
        p1 = p_next(ids)
        for t1 in torch.nonzero(p1).flatten().tolist():
            p2 = p_next(ids + [t1])
            for t2 in torch.nonzero(p2).flatten().tolist():
                p3 = p_next(ids + [t1, t2])
                for t3 in torch.nonzero(p3).flatten().tolist():
                    joint[t1, t2, t3] = float(p1[t1] * p2[t2] * p3[t3])
    n = 400
    cells = [cell for cell, prob in joint.items() if prob * n >= 5]  # the rest pooled as "other"
    shape = make_speculation("static", paths="[(0,), (1,), (0, 0), (0, 1), (1, 0)]")
    counts = dict.fromkeys(cells + ["other"], 0)
    for seed in range(n):
        config = DecodeConfig(max_new_tokens=3, seed=seed, min_path_prob=min_path_prob, **warping)
        out = tuple(decoder.generate(ids, shape, config).tokens)
        assert out in joint, "tokens outside the target's nucleus were emitted"
        counts[out if out in counts else "other"] += 1
    expected = np.array([joint[c] for c in cells] + [1 - sum(joint[c] for c in cells)]) * n
    assert len(cells) >= 3
    assert stats.chisquare(list(counts.values()), expected).pvalue > 1e-3


def test_sampling_runs_on_every_policy(decoders, tokenizer):
    decoder = decoders["qwen2", "close"]
    ids = tokenizer(PROMPTS[0])["input_ids"]
    for spec in (make_speculation("paper"), TreeShape.parse("[(0,), (2,), (0, 3)]"),
                 DynamicTree(6, 3, 2), None):
        out = decoder.generate(ids, spec, DecodeConfig(max_new_tokens=10, temperature=0.7,
                                                       top_p=0.9, seed=3))
        assert len(out.tokens) == 10


def test_shape_helpers():
    shape = TreeShape.parse("[(0,), (2,), (0, 1), (0, 3), (2, 2), (0, 1, 0)]")
    assert contiguous_ranks(shape).paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert cut_depth(shape, 2).paths == shape.paths[:5]
    assert cut_depth(shape, 9) is shape and bfs_prefix(shape, 2).paths == ((0,), (2,))


def test_min_path_prob_stops_growth(decoders, tokenizer):
    decoder = decoders["llama", "far"]
    ids = tokenizer(PROMPTS[0])["input_ids"]
    deep = make_speculation("chain", depth=8)
    full = decoder.generate(ids, deep, DecodeConfig(max_new_tokens=12))
    cut = decoder.generate(ids, deep, DecodeConfig(max_new_tokens=12, min_path_prob=0.9))
    assert cut.tokens == full.tokens
    assert max(s.tree_size for s in cut.steps) < 8 <= max(s.tree_size for s in full.steps)


# --- the optimal tree ------------------------------------------------------------------------------


def _all_trees(max_nodes: int, max_depth: int, max_rank: int):
    """Every parent-closed set of paths (ranks < max_rank, depth <= max_depth), by brute force."""
    universe = [p for d in range(1, max_depth + 1)
                for p in itertools.product(range(max_rank), repeat=d)]
    for n in range(1, max_nodes + 1):
        for subset in itertools.combinations(universe, n):
            chosen = set(subset)
            if all(len(p) == 1 or p[:-1] in chosen for p in subset):
                yield TreeShape.from_paths(list(subset))


@settings(max_examples=15, deadline=None)
@given(rates=st.lists(st.lists(st.floats(0, 1), min_size=3, max_size=3), min_size=3, max_size=3),
       max_nodes=st.integers(1, 5), max_depth=st.integers(1, 3))
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
    accepts = {("code", 0): (True, False, True), ("code", 1): (True, False, False),
               ("chat", 0): (False, True, True), ("chat", 1): (False, False, True)}
    for (domain, step), acc in accepts.items():
        for node, (parent, depth, rank) in enumerate([(-1, 1, 0), (-1, 1, 1), (0, 2, 0)]):
            rows.append(dict(prompt_id=f"{domain}-p", domain=domain, step=step, node_id=node,
                             parent_id=parent, depth=depth, sibling_rank=rank,
                             greedy_accept=acc[node]))
    return pd.DataFrame(rows)


def test_acceptance_vector_counts_nodes_whose_parent_was_accepted():
    vectors = acceptance_vectors(_nodes_frame(), min_count=1)
    code, chat = vectors["code"], vectors["chat"]
    assert code.rates.tolist() == [[1.0, 0.0], [0.5, 0.0]]  # depth 2: parent accepted twice
    assert chat.rates[0].tolist() == [0.0, 0.5]
    assert chat.counts[1, 0] == 0  # the depth-2 node never had an accepted parent
    assert vectors["all"].counts.tolist() == [[4, 4], [2, 0]]
    assert acceptance_vectors(_nodes_frame(), min_count=3)["code"].rates[1, 0] == 0.0


def test_acceptance_vector_extrapolation():
    acc = AcceptanceVector(np.array([[0.9, 0.1], [0.8, 0.1], [0.0, 0.0]]), np.array([[9, 9], [9, 9], [1, 1]]))
    ext = acc.extrapolated(4)
    assert ext.rates.tolist() == [[0.9, 0.1], [0.8, 0.1], [0.8, 0.1], [0.8, 0.1]]
    assert ext.counts[2:].sum() == 0
    assert acc.extrapolated(2) is acc


COSTS = CostModel(draft_s=((1, 0.01), (8, 0.012), (64, 0.03)),
                  target_s=((1, 0.1), (8, 0.11), (16, 0.13), (64, 0.4)), plain_token_s=0.1)


def test_tune_picks_trees_and_no_speculation_where_nothing_helps():
    nodes = _nodes_frame()
    nodes.loc[nodes.domain == "chat", "greedy_accept"] = False
    policy = tune(nodes, COSTS, TuneConfig(min_count=1))
    assert policy.tree_for("chat") is None
    code = policy.tree_for("code")
    assert code is not None and code.paths[0] == (0,)
    assert policy.choices["code"].predicted_speedup > 1
    assert best_tree(AcceptanceVector.from_rates([[0.01]]), COSTS).shape is None


# --- policy files --------------------------------------------------------------------------------


def test_policy_file_round_trip(tmp_path):
    policy = tune(_nodes_frame(), COSTS, TuneConfig(min_count=1))
    path = policy.save(tmp_path / "policy.json")
    loaded = PolicyFile.load(path)
    assert loaded.trees == policy.trees and loaded.uniform == policy.uniform
    toml = tmp_path / "policy.toml"
    toml.write_text('[domains.code]\ntree = "[(0,), (0, 0)]"\n[domains.chat]\ntree = "none"\n')
    loaded = PolicyFile.load(toml)
    assert loaded.tree_for("code").paths == ((0,), (0, 0)) and loaded.tree_for("chat") is None
    assert loaded.tree_for("math") is None  # not listed, no uniform tree: plain decoding


@pytest.mark.parametrize("content, message", [
    ({"domains": {"poetry": {"tree": "none"}}}, "unknown domain"),
    ({"domains": {"code": {"tree": "[(0,), (1, 0, 0)]"}}}, "no parent path"),
    ({"domains": {"code": {"tree": "[(0,), (-1,)]"}}}, "malformed tree"),
    ({"domains": {"code": {"tree": "((0,)"}}}, "cannot parse"),
    ({"domains": {"code": {"tree": 3}}}, "malformed tree"),
    ({"domains": {"code": {"tree": []}}}, "at least one node"),
    ({"domains": {"code": {}}}, "missing 'tree'"),
    ({"trees": {}}, "needs a 'domains' table"),
])
def test_policy_file_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(PolicyError, match=message):
        PolicyFile.load(path)


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


# --- router ----------------------------------------------------------------------------------------


def _items():
    texts = {
        "code": ["Complete the following Python function.\n```python\ndef f(x):\n    return x\n```",
                 "Implement a function in Python that reverses a list."],
        "math": ["Find all real numbers x such that x^2 - 5x + 6 = 0.",
                 "Let f(x) be a polynomial with integer coefficients. Prove f(2) is even."],
        "reasoning": ["Tom has 12 apples and buys 5 more. How many apples does he have in total?",
                      "A shirt costs $15. Mia buys 3. How much does she pay? Give the result as your final answer."],
        "chat": ["Write a short poem about the sea.", "Describe your favourite holiday."],
    }
    return [PromptItem(f"{d}-{i}", d, ({"role": "user", "content": t},))
            for d, ts in texts.items() for i, t in enumerate(ts)]


def test_rule_router_and_accuracy_report():
    items = _items()
    report = router_accuracy(RuleRouter(), items)
    assert report.accuracy == 1.0
    assert report.per_domain == {d: (2, 2) for d in ("code", "math", "reasoning", "chat")}

    class AlwaysChat:
        name = "chat-only"

        def classify(self, text):
            return "chat"

    report = router_accuracy(AlwaysChat(), items)
    assert report.accuracy == 0.25 and report.domain_accuracy("chat") == 1.0
    assert report.domain_accuracy("code") == 0.0 and report.confusion["code", "chat"] == 2
    assert RuleRouter().explain(prompt_text(items[0]))


def test_holdout_split_and_learned_router():
    items = _items() * 1
    train, test = holdout_split(items, 0.5, seed=3)
    assert {i.id for i in train}.isdisjoint({i.id for i in test})
    assert sorted(i.id for i in train + test) == sorted(i.id for i in items)
    assert holdout_split(items, 0.5, seed=3) == (train, test)
    router = LearnedRouter().fit([prompt_text(i) for i in items], [i.domain for i in items])
    assert router_accuracy(router, items).accuracy == 1.0


# --- bench summary ---------------------------------------------------------------------------------


def test_bench_summary_and_config():
    from specscope.tune.bench import BenchRun

    runs = [BenchRun("plain", "a", "code", "", (1, 2, 3, 4), 4, 2.0, 0.5),
            BenchRun("chain", "a", "code", "", (1, 2, 3, 4), 2, 1.0, 0.5),
            BenchRun("plain", "b", "chat", "", (5, 6), 2, 1.0, 0.5),
            BenchRun("chain", "b", "chat", "", (5, 7), 1, 2.0, 0.5)]
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
    with pytest.raises(DecodeError, match="unknown bench method"):
        BenchConfig(methods=("plain", "medusa"))
    with pytest.raises(DecodeError, match="reference"):
        BenchConfig(methods=("chain",))


# --- CLI -------------------------------------------------------------------------------------------


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_decode_end_to_end(tiny_dirs, tmp_path):
    model = ["--draft", tiny_dirs["qwen2", "draft"], "--target", tiny_dirs["qwen2", "target"],
             "--dtype", "float32"]
    records = tmp_path / "steps.csv"
    result = _cli("decode", "def add(a, b):", "--policy", "paper", "--max-new-tokens", 8,
                  "--records", records, *model)
    assert result.exit_code == 0, result.output
    assert "tok/s" in result.output and "mean tau" in result.output
    steps = pd.read_csv(records)
    assert {"tree_size", "accepted_len", "tau", "draft_time_s", "verify_time_s"} <= set(steps.columns)
    assert steps.tau.clip(upper=8).sum() >= 8
    result = _cli("decode", "hello", "--policy", "dynamic", "--temperature", "0.8", "--top-p", "0.9",
                  "--max-new-tokens", 6, *model)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("args, message", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--policy", "medusa"], "unknown policy"),
    (["--policy", "static", "--paths", "[(0,), (1, 1)]"], "no parent path"),
])
def test_cli_decode_bad_input(args, message):
    result = _cli("decode", "hi", *args)
    assert result.exit_code == 2
    assert message in result.output


def test_cli_tune_then_routed_decode(tiny_dirs, tmp_path):
    from specscope.models import PairConfig
    from specscope.run.config import PromptSpec, RunConfig
    from specscope.run.study import run_study
    from specscope.trees import TreeConfig

    pair = PairConfig(draft=str(tiny_dirs["llama", "draft"]), target=str(tiny_dirs["llama", "target"]),
                      dtype="float32")
    config = RunConfig(pair=pair, tree=TreeConfig(policy="static", paths="[(0,), (1,), (0, 0), (0, 1)]"),
                       prompts=PromptSpec(smoke=True), max_new_tokens=4, criteria=None)
    run_study(config, tmp_path / "run", progress=False)
    costs = COSTS.save(tmp_path / "costs.json")
    policy = tmp_path / "policy.json"
    result = _cli("tune", tmp_path / "run", "--costs", costs, "--out", policy, "--min-count", 1)
    assert result.exit_code == 0, result.output
    assert "uniform" in result.output
    loaded = PolicyFile.load(policy)
    assert set(loaded.trees) <= {"code", "math", "reasoning", "chat"}
    result = _cli("decode", "def f(x):", "--policy-file", policy, "--max-new-tokens", 5,
                  "--draft", pair.draft, "--target", pair.target, "--dtype", "float32")
    assert result.exit_code == 0, result.output
    assert "domain code" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"domains": {"poetry": {"tree": "none"}}}))
    result = _cli("decode", "x", "--policy-file", bad)
    assert result.exit_code == 2 and "unknown domain" in result.output


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int8_tree_pass_logits_equal_one_token_passes_bit_for_bit(tokenizer, arch):
    """A tree pass over the cache gives each node exactly the logits of decoding its path alone."""
    from specscope.core.passes import feed
    from specscope.models.int8 import quantize_int8, use_rowwise_attention
    from transformers import DynamicCache

    target = quantize_int8(make_model(arch, len(tokenizer), seed=5, layers=2))
    use_rowwise_attention(target)
    ids = tokenizer(PROMPTS[1])["input_ids"]
    shape = TreeShape.parse("[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]")
    nodes = torch.tensor([11, 12, 13, 14, 15, 16])
    with torch.inference_mode():
        cache = DynamicCache(config=target.config)
        target(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
        L = len(ids)
        tree = feed(target, cache, nodes, L + torch.tensor(shape.depths) - 1,
                    torch.ones(len(shape), L, dtype=torch.bool), shape.ancestor_mask())
        for n in range(len(shape)):
            path = [a for a in range(len(shape)) if shape.ancestor_mask()[n, a]]  # root first
            alone = DynamicCache(config=target.config)
            target(input_ids=torch.tensor([ids]), past_key_values=alone, use_cache=True)
            for a in path:
                logits = target(input_ids=nodes[a].view(1, 1), past_key_values=alone,
                                use_cache=True).logits[0, -1]
            assert torch.equal(tree[n], logits), n
