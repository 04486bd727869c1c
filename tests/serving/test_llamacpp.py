"""llama.cpp's pass costs and the break-even points they give (exact values on hand-computed
cases)."""

import pytest

from specscope.serving.llamacpp.costs import PassCosts
from specscope.serving.llamacpp.study import chain, chain_k

COSTS = PassCosts(
    target_s=((1, 0.040), (2, 0.050), (3, 0.060), (4, 0.070)),
    draft_s=((1, 0.010), (2, 0.015), (3, 0.020)),
    sample_s=0.001,
    context_len=100,
    threads=2,
)


def test_a_draft_model_steps_passes_and_the_break_even_points():
    assert COSTS.plain_token_s == pytest.approx(0.041)
    # K = 2, both drafted: the draft evaluates the last token and the first draft (2 x 10 ms),
    # the target the 3-token batch (60 ms), and the draft that batch again (20 ms)
    assert COSTS.passes_s(2) == pytest.approx(0.020 + 0.060 + 0.020)
    # p_min stopped after 1 draft: its draft is evaluated too (2 x 10), batches of 2 (50 + 15)
    assert COSTS.passes_s(1, stopped=1) == pytest.approx(0.020 + 0.050 + 0.015)
    # p_min stopped at once: the last token in the draft, then one token in each model
    assert COSTS.passes_s(0, stopped=1) == pytest.approx(0.010 + 0.040 + 0.010)
    assert COSTS.break_even_tau(2) == pytest.approx(0.100 / 0.040)
    # perfect acceptance (3 tokens a step) pays while 2 d + 2 d + 0.060 < 3 x 0.040 (the draft's
    # batch of 3 costs 2 one-token passes here): d < 15 ms
    assert COSTS.break_even_draft_s(2) == pytest.approx(0.015)


def test_chain_shapes():
    assert chain(0) is None and chain_k(None) == 0
    assert chain(3).to_paths_literal() == "[(0,), (0, 0), (0, 0, 0)]"
