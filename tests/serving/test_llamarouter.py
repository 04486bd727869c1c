"""What greedy chains of K predict for llama-server (llamacpp.router), on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from specscope.serving.llamacpp.router import (
    ChainCounts,
    agreement_steps,
    chain_counts,
    chain_predictions,
    first_difference,
    preset_section,
    presets_ini,
)
from specscope.serving.llamacpp.server import ServerSetting

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


def test_agreements_become_the_step_records_of_a_chain_drafter():
    steps = agreement_steps({"p": np.array(AGREE)}, {"p": "code"}, 3)
    # runs of agreement from each position, capped at 3; drafts that fit before the end
    assert steps["accepted_len"].tolist() == [3, 2, 1, 0, 3, 3, 2, 1, 0, 0]
    assert steps["tree_size"].tolist() == [3] * 8 + [2, 1]
    assert steps["step"].tolist() == list(range(10)) and set(steps["domain"]) == {"code"}


def test_chain_predictions_replay_measured_chains_and_label_deeper_ones_extrapolated():
    agreements = {"p": np.array(AGREE), "q": np.array([True] * 16), "r": np.array([False] * 5)}
    domains = {"p": "code", "q": "code", "r": "chat"}
    got = {
        (c.domain, c.k): c.prediction for c in chain_predictions(agreements, domains, (2, 3, 5), 3)
    }
    # replayed: what llama-server's steps give, counting the prompt's pass as one step with
    # one token (chain_counts counts verify steps only)
    for k in (2, 3):
        counts = [chain_counts(agreements[p], k) for p in ("p", "q")]
        tokens = sum(c.generated for c in counts)
        assert got["code", k].tokens_per_step == pytest.approx(
            tokens / sum(c.steps + 1 for c in counts)
        )
        assert got["code", k].method == "replay"
        assert got["code", k].lo <= got["code", k].tokens_per_step <= got["code", k].hi
    assert got["chat", 3].tokens_per_step == pytest.approx(5 / 5)  # nothing ever agrees
    # past the 3 drafts measured: extrapolated, labelled, no interval
    assert got["code", 5].extrapolated and np.isnan(got["code", 5].lo)
    assert got["code", 5].tokens_per_step >= got["code", 3].tokens_per_step


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
    from specscope.serving.llamacpp.router import draft_agreement

    output = [5, 6, 7, 8, 9, 10]
    draft = RuleDraft()
    agree = draft_agreement(draft, "draft", [4], output, window=window)
    brute = [
        (0 if ([4] + output[:t])[-1] == 7 else ([4] + output[:t])[-1] + 1) == output[t]
        for t in range(len(output))
    ]
    assert agree.tolist() == brute == [True, True, True, False, True, True]
    assert draft.requests == {1: 6, 2: 3, 8: 2}[window]
