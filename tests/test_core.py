"""The speculation core (core/): the cached masked passes and cache surgery, sampling, the stages
of one step for B rows (the tree pass against plain forwards), and batched rows; on tiny random
Llama and Qwen2 models."""

import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from specscope.core import passes
from specscope.core.batch import Batch, Row
from specscope.core.draft import ChildRule
from specscope.core.loop import Speculator
from specscope.core.passes import gather_rows, keep_positions, prefill
from specscope.core.sampling import gumbel_topk_scores, speculative_sample
from specscope.models.tiny import near_pair, tiny_model
from specscope.trees import TreeConfig, TreeShape

SHAPES = {
    "chain": TreeConfig(policy="chain", depth=4).shape(),
    "paper": TreeConfig(policy="paper").shape(),
    "six": TreeShape.parse("[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)]"),
}
CONTEXTS = [
    "def add(a, b):\n    return",
    "The capital of",
    "x = [1, 2, 3]\nfor i in range(len(x)):",
]


@pytest.fixture(scope="module")
def pair(arch, tokenizer):
    return near_pair(arch, len(tokenizer))


def _plain(model, ids: list[int]) -> torch.Tensor:
    """log-probabilities after ``ids`` from a plain causal forward (no cache, no mask)."""
    return torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)


def _branch(tokens: torch.Tensor, shape: TreeShape, n: int) -> list[int]:
    out = []
    while n >= 0:
        out.insert(0, int(tokens[n]))
        n = shape.parents[n]
    return out


# --- passes: cache surgery ---------------------------------------------------------------------


def test_the_cache_goes_by_the_name_forward_takes(pair):
    # transformers 5.24 renamed forward's past_key_values to cache; the old name warned on every
    # forward, into every command's stderr
    class Renamed:
        def forward(self, input_ids=None, cache=None, use_cache=None): ...

    class Before:
        def forward(self, input_ids=None, past_key_values=None, use_cache=None): ...

    assert passes._cache_keyword(Renamed) == "cache"
    assert passes._cache_keyword(Before) == "past_key_values"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        cache, logits = prefill(pair[1], [1, 2, 3], logits=True)
    assert cache.get_seq_length() == 3 and logits is not None


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_prefill_without_logits_skips_the_lm_head_and_fills_the_same_cache(tokenizer, arch):
    """Refills and the draft's prefill need the cache alone: the decoder body runs, the LM head
    does not, and the cache holds the same bits as a prefill with logits (both float32 and int8
    take this path)."""
    model = tiny_model(arch, len(tokenizer), seed=3, layers=2)
    ids = tokenizer("the same cache")["input_ids"]
    head = model.get_output_embeddings()
    calls = []
    hook = head.register_forward_hook(lambda *a: calls.append(1))
    try:
        with torch.inference_mode():
            with_logits, logits = prefill(model, ids, logits=True)
            assert calls == [1] and logits is not None
            without, none = prefill(model, ids)
    finally:
        hook.remove()
    assert none is None and calls == [1]  # no second call of the head
    assert without.get_seq_length() == with_logits.get_seq_length() == len(ids)
    for a, b in zip(with_logits.layers, without.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_keep_positions_gathers_every_layer(tokenizer):
    from transformers import DynamicCache

    model = tiny_model("llama", len(tokenizer), seed=3, layers=2)
    ids = tokenizer("hello world, tree")["input_ids"]
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ids, ids[::-1]]), past_key_values=cache, use_cache=True)
        before = [layer.keys.clone() for layer in cache.layers]
        keep = [0, 1, 2, 5, 7, 8]
        keep_positions(cache, keep)  # the same positions in every row
        assert cache.get_seq_length() == len(keep)
        for layer, old in zip(cache.layers, before):
            torch.testing.assert_close(layer.keys, old[..., keep, :])
        rows = torch.tensor([[0, 1, 3, 4], [0, 2, 4, 5]])  # other positions in each row
        keep_positions(cache, rows)
        for layer, old in zip(cache.layers, before):
            for b in range(2):
                torch.testing.assert_close(
                    layer.keys[b], old[b][..., [keep[i] for i in rows[b]], :]
                )


def test_gather_rows_right_aligns_rows_of_several_caches(tokenizer):
    model = tiny_model("qwen2", len(tokenizer), seed=3, layers=2)
    a, b = tokenizer("short")["input_ids"], tokenizer("a longer context")["input_ids"]
    with torch.inference_mode():
        cache_a, _ = prefill(model, a)
        cache_b, _ = prefill(model, b)
        empty, _ = prefill(model, [])
        packed, valid = gather_rows(
            model,
            [
                (cache_b, 0, torch.tensor([0, 2, 3])),
                (cache_a, 0, torch.arange(len(a))),
                (empty, 0, torch.arange(0)),
            ],
        )
    width = len(a)
    assert valid.tolist() == [[False] * (width - 3) + [True] * 3, [True] * width, [False] * width]
    for layer, la, lb in zip(packed.layers, cache_a.layers, cache_b.layers):
        assert torch.equal(layer.keys[1], la.keys[0])
        assert torch.equal(layer.keys[0, :, width - 3 :], lb.keys[0][:, [0, 2, 3]])
        assert not layer.keys[2].any()


# --- sampling ------------------------------------------------------------------------------------


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


# --- the stages: the tree pass against plain forwards ---------------------------------------------


@pytest.mark.parametrize("name", list(SHAPES))
def test_one_prompt_tree_pass_equals_per_branch_forward(pair, tokenizer, name):
    """B = 1 (decoding): each node's target row equals a plain causal forward over the context
    and its branch; compared as log-probabilities (logits up to a softmax-invariant constant)."""
    draft, target = pair
    shape = SHAPES[name]
    context = tokenizer(CONTEXTS[0])["input_ids"]
    loop = Speculator(draft, target, len(tokenizer))
    with torch.inference_mode():
        s, first = loop.prefill(context, seed=0)
        s.tokens.append(int(first.argmax()))
        tree = loop.draft_tree(s, shape, ChildRule(len(tokenizer), keep_q=True))
        logits = torch.log_softmax(loop.verify(s, tree).float(), -1)
        assert (logits[0] - _plain(target, s.tokens)).abs().max() <= 1e-4
        for n in range(len(shape)):
            plain = _plain(target, s.tokens + _branch(tree.tokens, shape, n))
            assert (logits[n + 1] - plain).abs().max() <= 1e-4


@pytest.mark.parametrize("name", list(SHAPES))
def test_batched_rows_tree_pass_equals_per_branch_forward(pair, tokenizer, name):
    """B ragged rows (padding in the batched caches), before and after a refill: every row's
    draft and target distributions are those of plain forwards over its own context."""
    draft, target = pair
    shape = SHAPES[name]
    vocab = len(tokenizer)
    contexts = [tokenizer(c)["input_ids"] for c in CONTEXTS]
    batch = Batch(draft, target, vocab)
    with torch.inference_mode():
        batch.refill([], [Row(list(c), None) for c in contexts[:2]])
        for step in range(3):
            if step == 1:  # the first row finishes: the second stays, a longer one joins
                batch.refill([1], [Row(list(contexts[2]), None)])
            for row, scores in zip(batch.rows, batch.score(shape)):
                assert (scores.p[0].log() - _plain(target, row.context)).abs().max() <= 1e-4
                assert (scores.q[0].log() - _plain(draft, row.context)).abs().max() <= 1e-4
                for n in range(len(shape)):
                    context = row.context + _branch(scores.tokens, shape, n)
                    if shape.children[n]:
                        q = scores.q[scores.q_index[shape.children[n][0]]]
                        assert (scores.p[n + 1].log() - _plain(target, context)).abs().max() <= 1e-4
                        assert (q.log() - _plain(draft, context)).abs().max() <= 1e-4
                    else:  # a leaf's context has no children: never scored
                        assert torch.isnan(scores.p[n + 1]).all()
                row.context.append(int(scores.p[0].argmax()))
