"""llama.cpp's pass costs and the break-even points they give (exact values on hand-computed
cases)."""

import pytest

from specscope.serving.llamacpp.costs import PassCosts
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


def test_chain_shapes():
    assert chain(0) is None and chain_k(None) == 0
    assert chain(3).to_paths_literal() == "[(0,), (0, 0), (0, 0, 0)]"
