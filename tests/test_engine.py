"""Measurement through the speculation loop's stages, against the naive oracle and plain forwards,
on tiny random Llama and Qwen2 models."""

import numpy as np
import pytest
import torch
from conftest import make_model
from specscope.core.draft import ChildRule
from specscope.core.loop import Accepted, Speculator
from specscope.core.passes import greedy_token
from specscope.measure.naive import NaiveEngine
from specscope.measure.records import StepScores, step_record, tree_scores
from specscope.trees import TreeConfig, TreeShape

SHAPES = {
    "chain": TreeConfig(policy="chain", depth=4).shape(),
    "paper": TreeConfig(policy="paper").shape(),
    "six": TreeShape.parse("[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)]"),
}


@pytest.fixture(scope="module")
def pair(arch, tokenizer):
    target = make_model(arch, len(tokenizer), seed=2, layers=2)
    draft = make_model(arch, len(tokenizer), seed=2, layers=2)
    with torch.no_grad():  # a draft close to the target, so that some nodes are accepted
        for p in draft.parameters():
            p.mul_(1 + 0.05 * torch.randn_like(p))
    return draft, target


class Measured:
    """The loop's stages as measurement runs them, one step at a time: draft the full tree, verify
    (the leaves' rows too with ``leaves``), then commit the target's greedy token."""

    def __init__(self, draft, target, vocab, context, leaves=False):
        self.loop = Speculator(draft, target, vocab)
        self.session, _ = self.loop.prefill(context, seed=0, with_logits=False)
        self.rule, self.leaves = ChildRule(vocab, keep_q=True), leaves

    @torch.inference_mode()
    def score(self, shape) -> StepScores:
        tree = self.loop.draft_tree(self.session, shape, self.rule)
        nodes = list(range(len(shape))) if self.leaves else tree.non_leaves
        scores = tree_scores(tree, self.loop.verify(self.session, tree, nodes), nodes,
                             self.rule.vocab)
        self.loop.commit(self.session, tree, Accepted([], int(greedy_token(scores.p[0])), 0))
        return scores


def _context(tokenizer):
    return tokenizer("def add(a, b):\n    return")["input_ids"]


@pytest.mark.parametrize("name", list(SHAPES))
def test_tree_pass_equals_per_branch_forward(pair, tokenizer, name):
    """Each node's target row equals a plain causal forward over prefix + its branch."""
    draft, target = pair
    shape = SHAPES[name]
    context = _context(tokenizer)
    scores = Measured(draft, target, len(tokenizer), context, leaves=True).score(shape)
    # Compared as log-probabilities: the logits up to their softmax-invariant constant.
    with torch.inference_mode():
        plain = torch.log_softmax(target(torch.tensor([context])).logits[0, -1].float(), -1)
        assert (scores.p[0].log() - plain).abs().max() <= 1e-4
        for n in range(len(shape)):
            branch, i = [], n
            while i >= 0:
                branch.insert(0, int(scores.tokens[i]))
                i = shape.parents[i]
            logits = target(torch.tensor([context + branch])).logits[0, -1].float()
            assert (scores.p[n + 1].log() - torch.log_softmax(logits, -1)).abs().max() <= 1e-4


def test_leaf_rows_are_skipped_unless_asked(pair, tokenizer):
    draft, target = pair
    shape = SHAPES["paper"]
    context = _context(tokenizer)
    lean, full = (Measured(draft, target, len(tokenizer), context, leaves) for leaves in (False, True))
    a, b = lean.score(shape), full.score(shape)
    internal = [0] + [n + 1 for n in range(len(shape)) if shape.children[n]]
    leaves = [n + 1 for n in shape.leaves]
    assert torch.isnan(a.p[leaves]).all() and not torch.isnan(b.p).any()
    assert (a.p[internal] - b.p[internal]).abs().max() <= 1e-5
    np.testing.assert_allclose(step_record(a, shape).nodes["p_target"],
                               step_record(b, shape).nodes["p_target"], atol=1e-6)


def test_cached_and_naive_engines_agree(pair, tokenizer):
    draft, target = pair
    shape = SHAPES["paper"]
    context = _context(tokenizer)
    cached = Measured(draft, target, len(tokenizer), context)
    naive = NaiveEngine(draft, target, len(tokenizer))
    accepted = 0
    for _ in range(6):
        a, b = cached.score(shape), naive.score(context, shape)
        ra, rb = step_record(a, shape), step_record(b, shape)
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
    shape = SHAPES["paper"]
    context = _context(tokenizer)
    engine = Measured(draft, target, len(tokenizer), context)
    out = []
    for _ in range(10):
        record = step_record(engine.score(shape), shape)
        out.append(record.emitted_token)
    with torch.inference_mode():
        ids = torch.tensor([context])
        for _ in range(10):
            nxt = target(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], 1)
    assert out == ids[0, len(context):].tolist()


def test_node_figures_are_consistent(pair, tokenizer):
    draft, target = pair
    shape = SHAPES["paper"]
    context = _context(tokenizer)
    scores = Measured(draft, target, len(tokenizer), context).score(shape)
    nodes = step_record(scores, shape).nodes
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

    scores = StepScores(tokens, q, torch.zeros(len(shape), dtype=torch.long), p, 0.0, 0.0)
    record = step_record(scores, shape)
    assert record.nodes["greedy_accept"].tolist() == [bool(x) for x in (1, 0, 1, 0, 1, 1, 1, 0)]
    assert record.accepted_len == 3  # nodes 4, 5 accept but hang off a rejected root
    assert record.emitted_token == 0


def test_one_tie_rule_for_records_and_decoder():
    # two tokens tie for the target's top probability: the lower id is the greedy token, in the
    # recorded greedy_accept and target_rank as in the emitted token and the decoder's verifier
    from specscope.trees import TreeShape

    p = torch.tensor([[0.1, 0.4, 0.4, 0.1]] * 3)
    q = torch.tensor([[0.1, 0.3, 0.5, 0.1]])
    shape = TreeShape(parents=(-1, -1), ranks=(0, 1))
    tokens = torch.tensor([2, 1])  # the draft's top token (2) and runner-up (1)
    scores = StepScores(tokens, q, torch.tensor([0, 0]), p, 0.0, 0.0)
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
    scores = StepScores(tokens, q, torch.zeros(len(shape), dtype=torch.long), p, 0.0, 0.0)
    expected = [int((ranked[c] == t).nonzero()) for c, t in zip(contexts, tokens.tolist())]
    assert step_record(scores, shape).nodes["target_rank"].tolist() == expected == picks

