"""llama.cpp end to end: cost model and tuning (exact values), and the GGUF pair in llama.cpp
(greedy speculation equals plain greedy; accepted tokens counted as llama.cpp verifies them)."""

import numpy as np
import pytest

from conftest import spine_nodes
from specscope.serving.llamacpp import ChainAcceptance, PassCosts
from specscope.serving.llamacpp_study import chain, chain_k, tune_chains
from specscope.tune.acceptance import ALL_DOMAINS

COSTS = PassCosts(
    target_s=((1, 0.040), (2, 0.050), (3, 0.060), (4, 0.070)),
    draft_s=((1, 0.010), (2, 0.015)),
    sample_s=0.001,
    context_len=100,
    threads=2,
)


def test_pass_costs_predict_speedup_and_break_even():
    assert COSTS.plain_token_s == pytest.approx(0.041)
    # K = 2 at tau 2.5, all accepted half the time: a draft eval of 1.5 tokens on average, one
    # more draft eval, a 3-token target eval and 2.5 samples
    assert COSTS.step_s(2, 2.5, 0.5) == pytest.approx(0.0125 + 0.010 + 0.060 + 0.0025)
    assert COSTS.predicted_speedup(2, 2.5, 0.5) == pytest.approx(2.5 * 0.041 / 0.085)
    assert COSTS.predicted_speedup(0, 1.0, 1.0) == 1.0
    assert COSTS.break_even_tau(2) == pytest.approx((0.020 + 0.060) / 0.040)
    # perfect acceptance (3 tokens per step, 3 draft tokens) pays while 3 d + 0.060 < 3 * 0.040
    assert COSTS.break_even_draft_s(2) == pytest.approx(0.020)


def test_chain_acceptance_and_tuning():
    acc = ChainAcceptance.from_nodes(
        spine_nodes({"code": [0.9, 0.8, 0.5], "chat": [0.2, 0.2, 0.2]})
    )
    code = acc.subset("code")
    # accepted prefixes: 90% reach depth 1, and of those 80/90 reach depth 2 (nested by step)
    assert code.tau(1)[0] == pytest.approx(1.9)
    assert code.tau(2)[0] == pytest.approx(1 + 0.9 + 0.8)
    assert code.tau(3)[0] == pytest.approx(1 + 0.9 + 0.8 + 0.5)
    assert code.p_all(2)[0] == pytest.approx(0.8)
    policy = tune_chains(acc, COSTS, ks=(1, 2, 3))
    # code: K = 1, 2, 3 give 1.9 * 0.041 / 0.0664 = 1.173x, 2.7 * 0.041 / 0.0867 = 1.277x and
    # 3.2 * 0.041 / 0.1057 = 1.241x: K = 2
    assert chain_k(policy.trees["code"]) == 2
    assert policy.choices["code"].predicted_speedup == pytest.approx(2.7 * 0.041 / 0.0867)
    assert policy.trees["chat"] is None  # 1.2 tokens per step never pays
    assert ALL_DOMAINS in policy.choices


def test_chain_shapes():
    assert chain(0) is None and chain_k(None) == 0
    assert chain(3).to_paths_literal() == "[(0,), (0, 0), (0, 0, 0)]"


@pytest.mark.weights
@pytest.mark.llamacpp  # llama-cpp-python
def test_llamacpp_greedy_speculation_follows_plain_greedy_on_the_demo_pair():
    pytest.importorskip("llama_cpp")
    from specscope.models.demo import demo_gguf
    from specscope.serving.llamacpp import (
        GreedyDraft,
        eos_ids,
        generate,
        load_llama,
        measure_pass_costs,
    )

    draft_llama = load_llama(demo_gguf("draft"), threads=2)
    draft = GreedyDraft(draft_llama, 0)
    target = load_llama(demo_gguf("target"), threads=2, logits_all=True, draft_model=draft)
    eos = eos_ids(target)
    for text in (
        b'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
        b"The three primary colours are",
    ):
        prompt = target.tokenize(text, add_bos=False)
        plain = generate(target, draft, prompt, 0, 24, eos)
        assert len(plain.tokens) > 0 and plain.steps == 0
        # the top-1 minus top-2 logit at each generated position of plain decoding
        rows = np.sort(target.scores[len(prompt) - 1 : len(prompt) - 1 + len(plain.tokens)], axis=1)
        margin = rows[:, -1] - rows[:, -2]
        for k in (1, 3):
            spec = generate(target, draft, prompt, k, 24, eos)
            assert spec.steps > 0 and all(0 <= a <= k for a in spec.accepted)
            # every verified step emits its accepted drafts and one target token
            assert sum(spec.accepted) + spec.steps <= len(spec.tokens)
            # llama.cpp's k-token passes round differently from one-token passes (logits differ
            # by up to about 0.4 here), so greedy speculation may leave plain greedy only at a
            # near-tie of plain's logits
            same = next(
                (i for i, (a, b) in enumerate(zip(spec.tokens, plain.tokens)) if a != b), None
            )
            if same is None:
                assert spec.tokens == plain.tokens
            else:
                assert margin[same] < 1.0, (k, same, margin[same])
    costs = measure_pass_costs(target, draft_llama, prompt, max_k=2, repeats=2)
    assert [k for k, _ in costs.target_s] == [1, 2, 3] and [n for n, _ in costs.draft_s] == [1, 2]
    assert all(t > 0 for _, t in costs.target_s + costs.draft_s) and costs.sample_s > 0
