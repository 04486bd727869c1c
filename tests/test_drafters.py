"""Drafters (specscope.drafters): the registry's validation, vLLM's n-gram proposer against vLLM's
own test cases and a brute-force definition, llama.cpp's ngram-simple against a line-by-line
transcription of its C++ loop, the early-exit view against a plain forward, records
of each drafter against an independent recomputation, lossless decoding with each drafter, and
the command line's one-line errors before any model loads."""

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from typer.testing import CliRunner

from conftest import run_config, tiny_pair_args
from specscope.cli import app
from specscope.core.sampling import warp
from specscope.decode import DecodeConfig, SpeculativeDecoder, plain_generate
from specscope.drafters import (
    DrafterConfig,
    DrafterError,
    lookup_for,
    propose_ngram,
    propose_ngram_simple,
)
from specscope.drafters.early_exit import early_exit_view
from specscope.models import load_pair, load_tokenizer
from specscope.models.tiny import near_pair
from specscope.prompts.items import read_jsonl
from specscope.prompts.render import render_item
from specscope.records import load_run
from specscope.run.config import RunConfigError
from specscope.run.study import run_study
from specscope.trees import TreeConfig, TreeShape

# --- the registry ---------------------------------------------------------------------------------


def test_labels_and_vllm_defaults():
    assert DrafterConfig().label == "draft-model"
    assert DrafterConfig("ngram").label == "ngram(prompt_lookup_min=5, prompt_lookup_max=5)"
    # vLLM: one bound given, the other takes its value
    assert DrafterConfig("ngram", prompt_lookup_max=3).params == {
        "prompt_lookup_min": 3,
        "prompt_lookup_max": 3,
    }
    assert DrafterConfig("ngram", prompt_lookup_min=2, prompt_lookup_max=4).params == {
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    assert DrafterConfig("early-exit", exit_layer=8).label == "early-exit(exit_layer=8)"
    # llama.cpp's --spec-ngram-simple-size-n defaults to 12
    assert DrafterConfig("llama-ngram-simple").label == "llama-ngram-simple(ngram_size=12)"
    assert DrafterConfig("llama-ngram-simple", ngram_size=3).params == {"ngram_size": 3}


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(kind="medusa"), "unknown drafter 'medusa'; choose one of draft-model, ngram"),
        (dict(prompt_lookup_max=4), "prompt_lookup_max is a parameter of the ngram drafter"),
        (dict(kind="ngram", exit_layer=3), "exit_layer is a parameter of the early-exit"),
        (dict(kind="ngram", prompt_lookup_min=0), "prompt_lookup_min must be an integer >= 1"),
        (dict(kind="ngram", prompt_lookup_min=4, prompt_lookup_max=2), "must be <="),
        (dict(kind="early-exit"), "needs exit_layer"),
        (dict(kind="early-exit", exit_layer=True), "exit_layer must be an integer"),
        (dict(kind="llama-ngram-simple", ngram_size=0), "ngram_size must be an integer >= 1"),
        (dict(kind="ngram", ngram_size=3), "ngram_size is a parameter of the llama-ngram-simple"),
    ],
)
def test_bad_drafters_are_one_line_errors(fields, message):
    with pytest.raises(DrafterError, match=message):
        DrafterConfig(**fields)


def test_the_ngram_drafter_refuses_trees():
    dirs = {("qwen2", "draft"): "d", ("qwen2", "target"): "t"}
    with pytest.raises(RunConfigError, match="proposes one chain"):
        run_config(dirs, "p.jsonl", drafter=DrafterConfig("ngram"))  # the paper tree
    config = run_config(dirs, "p.jsonl", drafter=DrafterConfig("ngram"), tree=TreeConfig("chain"))
    assert config.criteria is None  # certificates need the draft's distribution
    assert config.run_id != config.replace(drafter={"kind": "draft-model"}).run_id
    llama = DrafterConfig("llama-ngram-simple", ngram_size=4)
    with pytest.raises(RunConfigError, match="never drafts with a chain of 3"):
        run_config(dirs, "p.jsonl", drafter=llama, tree=TreeConfig("chain", depth=3))
    run_config(dirs, "p.jsonl", drafter=llama, tree=TreeConfig("chain", depth=4))


# --- the n-gram proposer ---------------------------------------------------------------------------

# vLLM's own cases (tests/v1/spec_decode/test_ngram.py): context, min_n, max_n, k -> proposal
VLLM_CASES = [
    ([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 2, [4, 1]),
    ([1, 2, 3, 4, 1, 2, 3], 1, 1, 3, [4, 1, 2]),
    ([1, 2, 3, 4, 1, 2, 3], 1, 1, 2, [4, 1]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2, [6, 2]),  # the first (earliest) match
    ([1, 2, 3, 4, 5], 2, 2, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 4, 4, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 3, 4, 2, [4, 1]),
    ([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2, [1, 2]),  # the 4-gram wins, not [5, 1]
    ([3, 4, 5, 2, 3, 4, 1, 2, 3, 4], 2, 4, 2, [1, 2]),  # not [5, 2]
    ([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, 3, 2, [100, 1]),
    ([], 2, 2, 2, []),
    ([1, 2, 3, 1, 2], 2, 2, 2, [3, 1]),
    ([4, 5, 6], 2, 2, 2, []),
    ([7, 8, 9, 7, 8], 2, 2, 2, [9, 7]),
]


@pytest.mark.parametrize("context, min_n, max_n, k, expected", VLLM_CASES)
def test_ngram_matches_vllms_own_cases(context, min_n, max_n, k, expected):
    assert propose_ngram(context, min_n, max_n, k) == expected


def brute_force_ngram(context: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The rule by definition: the longest n in [min_n, max_n] whose suffix occurs earlier
    (ending before the last token), its earliest occurrence, and up to k tokens after it."""
    T = len(context)
    for n in range(min(max_n, T - 1), min_n - 1, -1):
        suffix = context[T - n :]
        for start in range(0, T - n):
            if context[start : start + n] == suffix:
                return context[start + n : start + n + k]
    return []


@settings(max_examples=400, deadline=None)
@given(
    context=st.lists(st.integers(0, 3), max_size=40),
    bounds=st.tuples(st.integers(1, 5), st.integers(0, 3)),
    k=st.integers(1, 6),
)
def test_ngram_equals_its_definition(context, bounds, k):
    min_n, extra = bounds
    assert propose_ngram(context, min_n, min_n + extra, k) == brute_force_ngram(
        context, min_n, min_n + extra, k
    )


def test_ngram_respects_the_models_length_and_refuses_bad_bounds():
    assert propose_ngram([1, 2, 3, 1, 2], 2, 2, 3, max_model_len=6) == [3]
    assert propose_ngram([1, 2, 3, 1, 2], 2, 2, 3, max_model_len=5) == []
    with pytest.raises(DrafterError, match="min_n=3 must be <= max_n=2"):
        propose_ngram([1, 2], 3, 2, 1)
    lookup = lookup_for(DrafterConfig("ngram", prompt_lookup_max=1))
    assert lookup([5, 6, 5], 4) == [6, 5]
    assert lookup_for(DrafterConfig()) is None


# --- llama.cpp's ngram-simple ----------------------------------------------------------------------


def cxx_ngram_simple(context: list[int], size_n: int, size_m: int) -> list[int]:
    """common_ngram_simple_draft (llama.cpp b11312, common/ngram-map.cpp 49-112), line by line:
    ``tokens`` is the context without the token just sampled, which is ``sampled``."""
    tokens, sampled = context[:-1], context[-1]
    cur_len = len(tokens)
    if cur_len <= size_n + size_m + 1:
        return []
    pattern = [tokens[j] for j in range(cur_len - size_n + 1, cur_len)] + [sampled]
    match_pos = 0
    for j in range(cur_len - size_n - 1, 0, -1):
        if all(tokens[j + k] == pattern[k] for k in range(len(pattern))):
            match_pos = j
            break
    if match_pos == 0:
        return []
    copy_max = min(size_m, cur_len - (match_pos + size_n))
    if copy_max < size_n:
        return []
    return [tokens[match_pos + size_n + j] for j in range(copy_max)]


LLAMA_CASES = [  # context (the sampled token last), N, M -> draft
    ([9, 1, 2, 7, 8, 5, 3, 1, 2], 2, 2, [7, 8]),  # the M tokens after the match
    ([9, 1, 2, 7, 8, 1, 2, 6, 6, 6, 1, 2], 2, 3, [6, 6, 6]),  # the latest occurrence
    ([1, 2, 7, 8, 5, 3, 9, 4, 1, 2], 2, 2, []),  # position 0 never matches
    ([9, 8, 7, 6, 1, 2, 7, 1, 2], 2, 3, [7, 1]),  # cut before the sampled token
    ([9, 3, 4, 5, 6, 7, 8, 1, 1], 1, 1, []),  # the occurrence one token back is skipped
    ([9, 3, 4, 8, 6, 5, 0, 7, 3, 4], 2, 6, []),  # 9 cached tokens <= N + M + 1
    ([9, 5, 5, 5, 5, 5, 5, 5], 2, 2, []),  # the latest match (at 4) has 1 < N tokens after it
    ([9, 1, 2, 5, 1, 2, 3, 1, 2], 2, 1, []),  # M < N: never a draft
]


@pytest.mark.parametrize("context, n, m, expected", LLAMA_CASES)
def test_llama_ngram_simple_cases(context, n, m, expected):
    assert propose_ngram_simple(context, n, m) == expected == cxx_ngram_simple(context, n, m)


@settings(max_examples=600, deadline=None)
@given(
    context=st.lists(st.integers(0, 2), min_size=1, max_size=40),
    n=st.integers(1, 4),
    m=st.integers(1, 6),
)
def test_llama_ngram_simple_equals_its_cxx_loop(context, n, m):
    assert propose_ngram_simple(context, n, m) == cxx_ngram_simple(context, n, m)


def test_llama_ngram_simple_lookup_takes_the_chain_depth_as_m():
    lookup = lookup_for(DrafterConfig("llama-ngram-simple", ngram_size=2))
    context = [9, 1, 2, 7, 8, 5, 3, 4, 6, 1, 2]
    assert lookup(context, 3) == cxx_ngram_simple(context, 2, 3) == [7, 8, 5]
    with pytest.raises(DrafterError, match="size_n must be an integer >= 1"):
        propose_ngram_simple(context, 0, 3)


# --- early exit ------------------------------------------------------------------------------------


def exit_distribution(target, context: list[int], exit_layer: int) -> torch.Tensor:
    """q at every position of ``context`` by a plain forward: the hidden state after
    ``exit_layer`` layers, the target's final norm, its LM head."""
    with torch.inference_mode():
        out = target(torch.tensor([context]), output_hidden_states=True)
        hidden = out.hidden_states[exit_layer]
        return torch.softmax(target.lm_head(target.model.norm(hidden))[0].float(), dim=-1)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_early_exit_view_is_the_targets_first_layers(tokenizer, arch):
    _, target = near_pair(arch, len(tokenizer))
    view = early_exit_view(target, 1)
    assert view.model.embed_tokens is target.model.embed_tokens  # shared, not copied
    assert len(view.model.layers) == 1 and len(target.model.layers) == 2
    ids = tokenizer("def add(a, b):")["input_ids"]
    with torch.inference_mode():
        q = torch.softmax(view(torch.tensor([ids])).logits[0].float(), dim=-1)
    torch.testing.assert_close(q, exit_distribution(target, ids, 1), atol=1e-6, rtol=1e-5)
    with pytest.raises(DrafterError, match="exit_layer must be in 1..1"):
        early_exit_view(target, 2)


# --- records of each drafter, recomputed independently ----------------------------------------------


@pytest.fixture
def repetitive_prompts(tmp_path):
    """Prompts that repeat themselves, so n-gram lookup finds matches."""
    path = tmp_path / "p.jsonl"
    texts = ["a b c a b c a b", "x = 1\nx = 1\nx =", "Say hi.", "one two one two one"]
    path.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "domain": ["code", "chat"][i % 2], "prompt": t}) + "\n"
            for i, t in enumerate(texts)
        )
    )
    return path


def _contexts(config, run):
    """Per prompt: its rendered ids and its output tokens (the target's greedy continuation)."""
    tokenizer = load_tokenizer(config.pair.target)
    out = {}
    for item in read_jsonl(config.prompts.file):
        ids = render_item(tokenizer, item, config.rendering, config.max_prompt_tokens).ids
        steps = run.steps[run.steps.prompt_id == item.id].sort_values("step")
        out[item.id] = (list(ids), steps.emitted_token.tolist())
    return out


@pytest.mark.parametrize(
    "drafter, rule",
    [
        (
            DrafterConfig("ngram", prompt_lookup_min=1, prompt_lookup_max=3),
            lambda context: brute_force_ngram(context, 1, 3, 3),
        ),
        (
            DrafterConfig("llama-ngram-simple", ngram_size=1),
            lambda context: cxx_ngram_simple(context, 1, 3),
        ),
    ],
    ids=["ngram", "llama-ngram-simple"],
)
def test_lookup_records_equal_proposals_rederived_from_the_context(
    tiny_dirs, repetitive_prompts, tmp_path, drafter, rule
):
    config = run_config(
        tiny_dirs,
        repetitive_prompts,
        "llama",
        tree=TreeConfig("chain", depth=3),
        drafter=drafter,
        max_new_tokens=10,
        criteria=None,
    )
    run_study(config, tmp_path / "r", progress=False, batch_size=3)
    run = load_run(tmp_path / "r")
    assert set(run.nodes.drafter) == set(run.steps.drafter) == {drafter.label}
    target = load_pair(config.pair, drafter).target.model
    proposed_any = 0
    for pid, (ids, emitted) in _contexts(config, run).items():
        steps = run.steps[run.steps.prompt_id == pid].sort_values("step")
        for s, step in enumerate(steps.itertuples()):
            context = ids + emitted[:s]
            chain = rule(context)
            nodes = run.nodes[(run.nodes.prompt_id == pid) & (run.nodes.step == s)]
            nodes = nodes.sort_values("node_id")
            assert nodes.token_id.tolist() == chain and step.tree_size == len(chain)
            assert (nodes.p_draft == 1).all() and np.allclose(nodes.alpha, nodes.p_target)
            # greedy acceptance along a chain: the chain agrees with the greedy continuation
            agree = 0
            while (
                agree < len(chain)
                and s + agree < len(emitted)
                and chain[agree] == emitted[s + agree]
            ):
                agree += 1
            if s + len(chain) < len(emitted):
                assert step.accepted_len == agree
            if chain:  # p_target by one plain forward of the target
                proposed_any += 1
                with torch.inference_mode():
                    logits = target(torch.tensor([context + chain])).logits[0]
                p = torch.softmax(logits.float(), dim=-1)
                rows = p[len(context) - 1 + np.arange(len(chain)), chain]
                np.testing.assert_allclose(nodes.p_target, rows.numpy(), atol=1e-5)
    assert proposed_any >= 5, "the prompts should make the lookup propose"


def test_early_exit_records_equal_a_plain_forward_through_the_first_layers(
    tiny_dirs, repetitive_prompts, tmp_path
):
    drafter = DrafterConfig("early-exit", exit_layer=1)
    config = run_config(
        tiny_dirs,
        repetitive_prompts,
        "qwen2",
        tree=TreeConfig("chain", depth=2),
        drafter=drafter,
        max_new_tokens=6,
    )
    run_study(config, tmp_path / "r", progress=False, batch_size=2)
    run = load_run(tmp_path / "r")
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["config"]["drafter"]["exit_layer"] == 1
    target = load_pair(config.pair, drafter).target.model
    for pid, (ids, emitted) in _contexts(config, run).items():
        for s in range(len(emitted)):
            context = ids + emitted[:s]
            nodes = run.nodes[(run.nodes.prompt_id == pid) & (run.nodes.step == s)]
            chain = nodes.sort_values("node_id").token_id.tolist()
            q = exit_distribution(target, context + chain, 1)
            # node d was drawn from q at the context extended by the d - 1 nodes above it
            expected = q[len(context) - 1 + np.arange(len(chain)), chain]
            np.testing.assert_allclose(nodes.sort_values("node_id").p_draft, expected, atol=1e-5)
            assert chain[0] == int(q[len(context) - 1].argmax())  # the draft's top token


def test_runs_without_a_drafter_column_read_as_draft_model(tiny_dirs, prompts_file, tmp_path):
    config = run_config(
        tiny_dirs,
        prompts_file,
        tree=TreeConfig("chain", depth=2),
        max_new_tokens=2,
        criteria=None,
    )
    run_study(config, tmp_path / "old", progress=False)
    for name in ("nodes", "steps"):  # a run written before drafters existed
        path = tmp_path / "old" / f"{name}.parquet"
        table = pq.read_table(path)
        pq.write_table(table.drop(["drafter"]), path)
    run = load_run(tmp_path / "old")
    assert set(run.nodes.drafter) == set(run.steps.drafter) == {"draft-model"}


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"id": "q0", "domain": "code", "prompt": "Say hi."}) + "\n")
    return path


# --- decoding with each drafter -------------------------------------------------------------------


@pytest.fixture(scope="module")
def pairs(tokenizer):
    return {arch: near_pair(arch, len(tokenizer), 0.05, seed=7) for arch in ("llama", "qwen2")}


def decoder_for(pairs, tokenizer, arch: str, drafter: DrafterConfig) -> SpeculativeDecoder:
    draft, target = pairs[arch]
    if drafter.kind == "early-exit":
        draft = early_exit_view(target, drafter.exit_layer)
    elif not drafter.has_distribution:  # a lookup: no model drafts
        draft = None
    return SpeculativeDecoder(draft, target, len(tokenizer), frozenset(), lookup_for(drafter))


DRAFTERS = [
    DrafterConfig(),
    DrafterConfig("ngram", prompt_lookup_min=1, prompt_lookup_max=3),
    DrafterConfig("early-exit", exit_layer=1),
    DrafterConfig("llama-ngram-simple", ngram_size=1),
]
PROMPTS = ["a b c a b c a b", "def f(x):\n    return f(x", "one two one two", "z"]


@settings(max_examples=40, deadline=None)
@given(
    which=st.integers(0, len(DRAFTERS) - 1),
    arch=st.sampled_from(["llama", "qwen2"]),
    prompt=st.sampled_from(PROMPTS),
    depth=st.integers(1, 5),
    max_new=st.integers(1, 14),
)
@pytest.mark.slow
def test_greedy_decoding_with_every_drafter_equals_plain_greedy(
    pairs, tokenizer, which, arch, prompt, depth, max_new
):
    decoder = decoder_for(pairs, tokenizer, arch, DRAFTERS[which])
    ids = tokenizer(prompt)["input_ids"]
    config = DecodeConfig(max_new_tokens=max_new)
    chain = TreeShape.from_paths([(0,) * d for d in range(1, depth + 1)])
    out = decoder.generate(ids, chain, config)
    assert out.tokens == plain_generate(decoder.target, ids, config, decoder.vocab).tokens
    assert all(s.tau == s.accepted_len + 1 for s in out.steps)


@pytest.mark.slow
def test_ngram_decoding_accepts_and_sampling_keeps_the_targets_distribution(pairs, tokenizer):
    ngram = DrafterConfig("ngram", prompt_lookup_min=1, prompt_lookup_max=2)
    decoder = decoder_for(pairs, tokenizer, "llama", ngram)
    ids = tokenizer("a b a b a b a b a b")["input_ids"]
    chain = TreeShape.from_paths([(0,), (0, 0), (0, 0, 0)])
    greedy = decoder.generate(ids, chain, DecodeConfig(max_new_tokens=16))
    assert max(s.tree_size for s in greedy.steps) == 3  # the lookup proposed full chains
    warping = dict(temperature=0.7, top_p=0.9)

    def p_next(context):
        with torch.inference_mode():
            logits = decoder.target(torch.tensor([context])).logits[0, -1]
        return warp(logits, decoder.vocab, **warping)

    joint = {}
    p1 = p_next(ids)
    for t1 in torch.nonzero(p1).flatten().tolist():
        p2 = p_next(ids + [t1])
        for t2 in torch.nonzero(p2).flatten().tolist():
            joint[t1, t2] = float(p1[t1] * p2[t2])
    n = 300
    cells = [c for c, prob in joint.items() if prob * n >= 5]
    counts = dict.fromkeys(cells + ["other"], 0)
    for seed in range(n):
        config = DecodeConfig(max_new_tokens=2, seed=seed, **warping)
        out = tuple(decoder.generate(ids, chain, config).tokens)
        assert out in joint
        counts[out if out in counts else "other"] += 1
    expected = np.array([joint[c] for c in cells] + [1 - sum(joint[c] for c in cells)]) * n
    assert stats.chisquare(list(counts.values()), expected).pvalue > 1e-3


# --- the command line ----------------------------------------------------------------------------


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--drafter", "medusa"], "unknown drafter 'medusa'"),
        (["--prompt-lookup-max", "3"], "prompt_lookup_max is a parameter of the ngram drafter"),
        (["--drafter", "ngram", "--prompt-lookup-min", "0"], "prompt_lookup_min must be"),
        (["--drafter", "ngram", "--policy", "paper"], "proposes one chain"),
        (["--drafter", "early-exit"], "needs exit_layer"),
        (["--drafter", "early-exit", "--exit-layer", "9"], "exit_layer must be in 1..1"),
        (["--drafter", "llama-ngram-simple", "--policy", "chain", "--depth", "4"], "never drafts"),
        (["--ngram-size", "2"], "ngram_size is a parameter of the llama-ngram-simple"),
    ],
)
@pytest.mark.parametrize("command", ["run", "decode"])
def test_cli_drafter_errors_come_before_any_model_loads(
    tiny_dirs, tmp_path, monkeypatch, command, args, message
):
    import specscope.models.load as load

    def no_weights(*a, **k):
        raise AssertionError("weights were loaded before the drafter was checked")

    monkeypatch.setattr(load, "load_model", no_weights)
    first = ["--out", tmp_path / "r", "--smoke"] if command == "run" else ["hi"]
    result = _cli(command, *first, *tiny_pair_args(tiny_dirs), *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_run_decode_and_bench_with_each_drafter(tiny_dirs, repetitive_prompts, tmp_path):
    model = tiny_pair_args(tiny_dirs)
    result = _cli(
        "run",
        "--out",
        tmp_path / "ng",
        "--prompts",
        repetitive_prompts,
        "--policy",
        "chain",
        "--depth",
        3,
        "--max-new-tokens",
        4,
        "--drafter",
        "ngram",
        "--prompt-lookup-min",
        1,
        "-q",
        *model,
    )
    assert result.exit_code == 0, result.output
    assert set(load_run(tmp_path / "ng").nodes.drafter) == {
        "ngram(prompt_lookup_min=1, prompt_lookup_max=1)"
    }
    result = _cli(
        "run",
        "--out",
        tmp_path / "dm",
        "--prompts",
        repetitive_prompts,
        "--policy",
        "chain",
        "--depth",
        3,
        "--max-new-tokens",
        4,
        "-q",
        *model,
    )
    assert result.exit_code == 0, result.output
    policy = tmp_path / "policy.json"
    result = _cli(
        "tune",
        tmp_path / "dm",
        tmp_path / "ng",
        "--out",
        policy,
        "--min-count",
        1,
        "--min-speedup",
        0,
        "--repeats",
        1,
        "--context-len",
        16,
        *model,
    )
    assert result.exit_code == 0, result.output
    assert "drafter" in result.output
    written = json.loads(policy.read_text())
    assert set(written["cost_models"]) == {
        "draft-model",
        "ngram(prompt_lookup_min=1, prompt_lookup_max=1)",
    }
    assert written["cost_models"]["ngram(prompt_lookup_min=1, prompt_lookup_max=1)"]["model_free"]
    result = _cli("decode", "def f(x):", "--policy-file", policy, "--max-new-tokens", 4, *model)
    assert result.exit_code == 0, result.output
    for args in (["--drafter", "ngram"], ["--drafter", "early-exit", "--exit-layer", 1]):
        result = _cli("decode", "a b a b a b", "--max-new-tokens", 6, *args, *model)
        assert result.exit_code == 0, result.output
        assert args[1] in result.output
    out = tmp_path / "bench.json"
    result = _cli(
        "bench",
        "--methods",
        "plain,chain,ngram,early-exit",
        "--exit-layer",
        1,
        "--prompt-lookup-max",
        2,
        "--domains",
        "code,chat",
        "--per-domain",
        1,
        "--repeats",
        1,
        "--warmup",
        0,
        "--max-new-tokens",
        6,
        "--out",
        out,
        *model,
    )
    assert result.exit_code == 0, result.output
    rows = pd.DataFrame(json.loads(out.read_text())["rows"])
    assert set(rows.method) == {"plain", "chain", "ngram", "early-exit"}
    assert rows.exact.all()
