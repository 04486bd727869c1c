"""What greedy chains of K predict for llama-server (llamarouter), on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from specscope.serving.llamarouter import (
    ChainCounts,
    chain_acceptance,
    chain_counts,
    first_difference,
    preset_section,
    presets_ini,
)
from specscope.serving.llamaserver import ServerSetting

AGREE = [True, True, True, False, True, True, True, True, False, False]


def test_chain_counts_step_as_llama_server_does():
    # token 0: the prompt's pass. t=1: 3 drafted, 2 accepted (a[3] is False) -> t=4;
    # t=4: 3 drafted, 3 accepted -> t=8; t=8: min(3, 10-8-1)=1 drafted, 0 accepted -> t=9;
    # t=9: nothing left to draft (1 token left), a plain step -> t=10
    assert chain_counts(AGREE, 3) == ChainCounts(generated=10, drafted=7, accepted=5, steps=4)
    assert chain_counts(AGREE, 3).tokens_per_step == 9 / 4
    # all agree: steps at t = 1, 5, 9 take 3 + 1 tokens each; at t = 13 only 2 may be drafted
    # (16 - 13 - 1), and 2 + 1 tokens end the output
    assert chain_counts([True] * 16, 3) == ChainCounts(16, 11, 11, 4)
    assert chain_counts([False] * 5, 2) == ChainCounts(5, 2 + 2 + 1, 0, 4)
    assert chain_counts([], 2) == ChainCounts(0, 0, 0, 0)


def test_chain_acceptance_counts_eligible_and_accepted_drafts_by_depth():
    acc = chain_acceptance({"p": np.array(AGREE)}, {"p": "code"}, 3)
    # positions 1..9 are each a step: depth 1 eligible 9 times, hit where a[t]; depth 2 eligible
    # where a[t] (and t+1 < 10), hit where a[t] and a[t+1]; ...
    assert acc.eligible.tolist() == [[9, 6, 4]]
    assert acc.hits.tolist() == [[6, 4, 2]]
    assert acc.tau(3)[0] == pytest.approx(1 + 6 / 9 + 6 / 9 * 4 / 6 + 6 / 9 * 4 / 6 * 2 / 4)
    assert acc.subset("code").prompts.tolist() == ["p"] and not len(acc.subset("math").prompts)


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_a_preset_holds_the_settings_exact_flags():
    section = preset_section(
        "t.gguf", ServerSetting(threads=2, poll=0, k=3, draft_poll=0), "d.gguf"
    )
    assert section["model"] == "t.gguf" and section["md"] == "d.gguf"
    assert (section["spec-draft-n-max"], section["spec-draft-p-min"], section["poll"]) == (
        "3",
        "0",
        "0",
    )
    assert "md" not in preset_section("t.gguf", ServerSetting(), "d.gguf")  # plain: no draft
    assert presets_ini({"plain": {"model": "t.gguf", "t": 2}}) == (
        "version = 1\n\n[plain]\nmodel = t.gguf\nt = 2\n"
    )


class RuleDraft:
    """A stand-in for a draft preset of llama-server: greedy continuation by a fixed rule (the
    next token is the last one + 1, except that 7 is followed by 0)."""

    def __init__(self):
        self.requests = 0

    def post(self, path, body):
        self.requests += 1
        seq, out = list(body["prompt"]), []
        for _ in range(body["n_predict"]):
            out.append(0 if seq[-1] == 7 else seq[-1] + 1)
            seq.append(out[-1])
        return {"tokens": out}


@pytest.mark.parametrize("window", [1, 2, 8])
def test_draft_agreement_asks_once_per_disagreement_and_matches_position_by_position(window):
    from specscope.serving.llamarouter import draft_agreement

    output = [5, 6, 7, 8, 9, 10]
    draft = RuleDraft()
    agree = draft_agreement(draft, "draft", [4], output, window=window)
    brute = [
        (0 if ([4] + output[:t])[-1] == 7 else ([4] + output[:t])[-1] + 1) == output[t]
        for t in range(len(output))
    ]
    assert agree.tolist() == brute == [True, True, True, False, True, True]
    assert draft.requests == {1: 6, 2: 3, 8: 2}[window]
