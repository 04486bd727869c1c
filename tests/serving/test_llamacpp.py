"""llama.cpp's cost model and the choice of K it makes (exact values on hand-computed cases)."""

import pytest

from conftest import spine_nodes
from specscope.serving.llamacpp.costs import ChainAcceptance, PassCosts
from specscope.serving.llamacpp.study import chain, chain_k

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
    # code: K = 1, 2, 3 give 1.9 * 0.041 / 0.0664 = 1.173x, 2.7 * 0.041 / 0.0867 = 1.277x and
    # 3.2 * 0.041 / 0.1057 = 1.241x
    assert COSTS.predicted_speedup(2, 2.7, 0.8) == pytest.approx(2.7 * 0.041 / 0.0867)
    chat = acc.subset("chat")
    assert chat.tau(1)[0] == pytest.approx(1.2)  # 1.2 tokens per step never pays
    assert COSTS.predicted_speedup(1, 1.2, chat.p_all(1)[0]) < 1


def test_chain_shapes():
    assert chain(0) is None and chain_k(None) == 0
    assert chain(3).to_paths_literal() == "[(0,), (0, 0), (0, 0, 0)]"
