"""Speculative decoding (decode.py and the loop of core/loop.py): greedy verification is exactly
plain greedy decoding, sampled verification keeps the target's distribution; the decode CLI."""

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats
from typer.testing import CliRunner

from conftest import tiny_pair_args
from specscope.cli import app
from specscope.core.sampling import warp
from specscope.decode import (
    DecodeConfig,
    DecodeError,
    SpeculativeDecoder,
    emitted_per_step,
    plain_generate,
)
from specscope.models.tiny import near_pair
from specscope.trees import DynamicTree, TreeShape
from specscope.tune.policy import make_speculation

PROMPTS = [
    "def add(a, b):\n    return",
    "The capital of France is",
    "x = [1, 2, 3]\nfor i in",
    "Once upon a time",
    "a",
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread, and a busy machine does not stall them."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def decoders(tokenizer):
    """(arch, draft quality) -> decoder; shared by the property tests."""
    out = {}
    for arch in ("llama", "qwen2"):
        for name, noise in (("close", 0.05), ("far", 1.0)):
            draft, target = near_pair(arch, len(tokenizer), noise, seed=7)
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
    st.builds(
        DynamicTree, max_nodes=st.integers(1, 12), depth=st.integers(1, 5), top_k=st.integers(1, 4)
    ),
)


# --- greedy: lossless ---------------------------------------------------------------------------


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    spec=specs,
    arch=st.sampled_from(["llama", "qwen2"]),
    quality=st.sampled_from(["close", "far"]),
    prompt=st.sampled_from(PROMPTS),
    max_new=st.integers(1, 14),
    min_path_prob=st.sampled_from([0.0, 0.0, 0.05, 0.5]),
)
def test_greedy_speculation_equals_plain_greedy(
    decoders, tokenizer, spec, arch, quality, prompt, max_new, min_path_prob
):
    decoder = decoders[arch, quality]
    ids = tokenizer(prompt)["input_ids"]
    config = DecodeConfig(max_new_tokens=max_new, min_path_prob=min_path_prob)
    plain = plain_generate(decoder.target, ids, config, decoder.vocab)
    spec_out = decoder.generate(ids, spec, config)
    assert spec_out.tokens == plain.tokens
    assert sum(s.tau for s in spec_out.steps) >= len(spec_out.tokens)
    assert sum(emitted_per_step(spec_out)) == len(spec_out.tokens)  # the end cuts the last step
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
    eos_decoder = SpeculativeDecoder(
        decoder.draft, decoder.target, decoder.vocab, frozenset({first})
    )
    out = eos_decoder.generate(ids, make_speculation("chain", depth=3), config)
    assert out.tokens == [first] and out.stop_reason == "eos"
    assert tokenizer.decode(out.tokens[:-1]) == ""
    # an EOS in the middle of an accepted path cuts the output right after it
    stop = reference[5]
    cut = SpeculativeDecoder(decoder.draft, decoder.target, decoder.vocab, frozenset({stop}))
    out = cut.generate(ids, make_speculation("chain", depth=4), config)
    assert out.tokens == reference[: reference.index(stop) + 1]


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
        decoder.generate(
            [1] * 1000, make_speculation("chain", depth=8), DecodeConfig(max_new_tokens=20)
        )
    with pytest.raises(DecodeError, match="no tokens"):
        decoder.generate([], make_speculation("chain"), DecodeConfig())


def test_min_path_prob_stops_growth(decoders, tokenizer):
    decoder = decoders["llama", "far"]
    ids = tokenizer(PROMPTS[0])["input_ids"]
    deep = make_speculation("chain", depth=8)
    full = decoder.generate(ids, deep, DecodeConfig(max_new_tokens=12))
    cut = decoder.generate(ids, deep, DecodeConfig(max_new_tokens=12, min_path_prob=0.9))
    assert cut.tokens == full.tokens
    assert max(s.tree_size for s in cut.steps) < 8 <= max(s.tree_size for s in full.steps)


# --- stochastic verification --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("min_path_prob", [0.0, 0.5])
def test_sampled_tree_decoding_matches_target_joint_distribution(
    decoders, tokenizer, min_path_prob
):
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
    for spec in (
        make_speculation("paper"),
        TreeShape.parse("[(0,), (2,), (0, 3)]"),
        DynamicTree(6, 3, 2),
        None,
    ):
        out = decoder.generate(
            ids, spec, DecodeConfig(max_new_tokens=10, temperature=0.7, top_p=0.9, seed=3)
        )
        assert len(out.tokens) == 10


# --- CLI -------------------------------------------------------------------------------------------


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_decode_end_to_end(tiny_dirs, tmp_path):
    model = tiny_pair_args(tiny_dirs)
    records = tmp_path / "steps.csv"
    result = _cli(
        "decode",
        "def add(a, b):",
        "--policy",
        "paper",
        "--max-new-tokens",
        8,
        "--records",
        records,
        *model,
    )
    assert result.exit_code == 0, result.output
    assert "tok/s" in result.output and "mean tau" in result.output
    steps = pd.read_csv(records)
    assert {"tree_size", "accepted_len", "tau", "draft_time_s", "verify_time_s"} <= set(
        steps.columns
    )
    assert steps.tau.clip(upper=8).sum() >= 8
    assert steps.emitted.sum() == 8  # the tokens each step kept: the output's length
    assert "tokens per step" in result.output
    # --p-min 1: no draft token is that certain here, so nothing is drafted: plain steps
    cut = _cli("decode", "def add(a, b):", "--depth", 3, "--p-min", 1, "--max-new-tokens", 8,
               "--records", records, *model)  # fmt: skip
    assert cut.exit_code == 0, cut.output
    assert (pd.read_csv(records).tree_size == 0).all()
    result = _cli(
        "decode",
        "hello",
        "--policy",
        "dynamic",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--max-new-tokens",
        6,
        *model,
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "0"], "top_p"),
        (["--policy", "medusa"], "unknown policy"),
        (["--policy", "static", "--paths", "[(0,), (1, 1)]"], "no parent path"),
        (["--p-min", "1.5"], "--p-min"),
    ],
)
def test_cli_decode_bad_input(args, message):
    result = _cli("decode", "hi", *args)
    assert result.exit_code == 2
    assert message in result.output
