"""Backends tune prices and the bench runs: specscope's decoder and transformers' assisted
generation (a chain of K drafted by the draft model), and the LM head's input in bfloat16."""

import copy
import json
import math

import pandas as pd
import pytest
import torch

from conftest import spine_nodes, steps_of
from specscope.analysis.replay import ReplayRecords, Subtree, replay_counts
from specscope.decode import DecodeConfig, SpeculativeDecoder, plain_generate
from specscope.drafters import DrafterConfig
from specscope.models.tiny import near_pair, tiny_model
from specscope.prompts.items import PromptItem
from specscope.records import ALL_DOMAINS
from specscope.trees import TreeShape
from specscope.tune.acceptance import PolicyError
from specscope.tune.bench import BenchConfig, bench_decoder, candidate_predictions
from specscope.tune.costs import CostModel
from specscope.tune.hf_generate import hf_generate
from specscope.tune.policy import Measured, PolicyFile, TuneConfig, tune
from specscope.tune.router import RuleRouter

# --- the LM head in bfloat16 -----------------------------------------------------------------------


def test_the_lm_head_gets_a_row_major_input_with_the_same_values(tiny_dirs):
    """transformers slices the hidden states it keeps logits for; the hook hands the head the
    same values with row-major strides (where bfloat16's matmul on the CPU would otherwise copy
    the whole weight per call), and ``load_model`` installs it."""
    from specscope.models.load import _row_major_input, load_model

    head = torch.nn.Linear(16, 40, bias=False).to(torch.bfloat16)
    hidden = torch.randn(3, 5, 16, dtype=torch.bfloat16)
    for x in (hidden[:1, -1:], hidden[:, -1:], hidden[:1, -4:], hidden):
        (y,) = _row_major_input(head, (x,))
        assert torch.equal(y, x)
        assert y.stride() == torch.empty(x.shape).stride()
        with torch.inference_mode():
            assert torch.equal(head(y), head(x))
    model = load_model(str(tiny_dirs["qwen2", "target"]), dtype="bfloat16").model
    hooks = model.get_output_embeddings()._forward_pre_hooks.values()
    assert _row_major_input in list(hooks)


# --- transformers' assisted generation -----------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_assisted_generation_with_a_perfect_drafter_takes_k_plus_one_tokens_per_step(tokenizer, k):
    """Draft = target: every step of a chain of K keeps K + 1 tokens, so 12 tokens take
    ceil(12 / (K + 1)) passes of the target (the first with the prefill), and the output is
    plain greedy's."""
    torch.manual_seed(0)
    target = tiny_model("qwen2", len(tokenizer), seed=3)
    ids = tokenizer("def add(a, b):")["input_ids"]
    plain = hf_generate(target, ids, 12, frozenset(), min_new_tokens=12)
    assert plain.target_passes == 12 and len(plain.tokens) == 12
    g = hf_generate(target, ids, 12, frozenset(), copy.deepcopy(target), k, min_new_tokens=12)
    assert g.tokens == plain.tokens
    assert g.target_passes == -(-12 // (k + 1))
    assert g.first_tokens == min(k + 1, 12)


def test_assisted_generation_restores_the_assistants_generation_config(tokenizer):
    draft, target = near_pair("qwen2", len(tokenizer), 0.05)
    config = draft.generation_config
    before = (config.num_assistant_tokens, config.assistant_confidence_threshold)
    ids = tokenizer("x = 1")["input_ids"]
    hf_generate(target, ids, 4, frozenset(), draft, 2)
    assert (config.num_assistant_tokens, config.assistant_confidence_threshold) == before


# --- tune across backends ------------------------------------------------------------------------

TARGET_S = ((1, 0.1), (8, 0.11), (16, 0.13), (64, 0.4))


def _costs(assisted_step_s: float) -> CostModel:
    """A draft model's cost model whose assisted steps cost ``assisted_step_s`` at any K."""
    return CostModel(
        draft_s=((1, 0.02), (8, 0.025), (64, 0.05)),
        target_s=TARGET_S,
        plain_token_s=0.1,
        assisted_step_s=((1, assisted_step_s), (8, assisted_step_s)),
        plain_backend="transformers",
    )


def test_a_cost_model_keeps_its_assisted_steps_and_what_timed_plain_decoding():
    costs = _costs(0.3)
    assert CostModel.from_dict(json.loads(json.dumps(costs.to_dict()))) == costs
    assert costs.assisted_step_time(4) == pytest.approx(0.3)
    old = {
        k: v for k, v in costs.to_dict().items() if k not in ("assisted_step_s", "plain_backend")
    }
    read = CostModel.from_dict(old)  # written before backends: specscope's loop timed plain
    assert read.plain_backend == "specscope" and read.assisted_step_s == ()
    with pytest.raises(PolicyError, match="no assisted-generation step times"):
        read.assisted_step_time(2)
    with pytest.raises(PolicyError, match="plain_backend must be one of transformers, specscope"):
        CostModel.from_dict({**costs.to_dict(), "plain_backend": "vllm"})


def test_step_scale_multiplies_the_timed_passes_and_old_files_read_as_one():
    costs = _costs(0.3)
    chain = TreeShape.chain(3)
    scaled = CostModel.from_dict({**costs.to_dict(), "step_scale": 0.9})
    passes = costs.draft_time(chain) + costs.verify_time(chain)
    assert costs.step_scale == 1.0 and costs.step_time(chain) == pytest.approx(passes)
    assert scaled.step_time(chain) == pytest.approx(0.9 * passes)
    assert CostModel.from_dict(json.loads(json.dumps(scaled.to_dict()))) == scaled
    for bad in (0, -1.0, float("inf"), "0.9"):
        with pytest.raises(PolicyError, match="step_scale"):
            CostModel.from_dict({**costs.to_dict(), "step_scale": bad})
        with pytest.raises(PolicyError, match="empty_step_scale"):
            CostModel.from_dict({**costs.to_dict(), "empty_step_scale": bad})


def test_a_step_that_proposes_nothing_costs_empty_step_scale_times_plains_token():
    """A lookup that proposes in half the steps: those cost the scaled passes, the others
    empty_step_scale times plain decoding's token, unscaled by step_scale."""
    costs = CostModel.from_dict(
        {**_costs(0.3).to_dict(), "step_scale": 1.2, "empty_step_scale": 0.9}
    )
    chain = TreeShape.chain(3)
    passes = costs.draft_time(chain) + 0.5 * costs.verify_time(chain)
    empty = 0.5 * 0.9 * costs.plain_token_s
    assert costs.step_time(chain, proposal_rate=0.5) == pytest.approx(1.2 * passes + empty)
    assert CostModel.from_dict(json.loads(json.dumps(costs.to_dict()))) == costs
    older = {k: v for k, v in costs.to_dict().items() if k != "empty_step_scale"}
    assert CostModel.from_dict(older).empty_step_scale == 1.0  # files written before


def test_tune_times_its_costs_over_the_runs_text_at_their_median_context(tiny_dirs, tmp_path):
    """Without --context-len, tune times at the median context of the runs' steps, over real
    text (a recorded prompt and its output, cut there), and calibrates step_scale on a real
    decode of it."""
    from typer.testing import CliRunner

    from conftest import tiny_pair_args
    from specscope.cli import app
    from specscope.models.load import load_model
    from specscope.tune.choose import load_tune_runs
    from specscope.tune.costs import measure_costs

    run_dir, policy = tmp_path / "run", tmp_path / "policy.json"
    args = ["run", "--out", run_dir, "--domains", "code", "--per-domain", 2, "--max-new-tokens", 6,
            "--policy", "chain", "--depth", 3, "--quiet", *tiny_pair_args(tiny_dirs)]  # fmt: skip
    assert CliRunner().invoke(app, [str(a) for a in args]).exit_code == 0
    runs = load_tune_runs([run_dir])
    steps = runs.runs[0].steps
    assert runs.decoding_context == int(steps.context_len.median())
    tokenizer = load_model(str(tiny_dirs["qwen2", "target"]), "float32").tokenizer
    first = runs.runs[0].prompts.iloc[0]
    whole = tokenizer(first.prompt_text, add_special_tokens=False).input_ids + [
        int(t) for t in first.output_token_ids
    ]
    assert runs.timing_text(tokenizer, 20) == whole[:20]
    assert runs.timing_text(tokenizer, 10**6) is None  # no recorded text is that long
    args = ["tune", run_dir, "--out", policy, "--min-count", 1, "--repeats", 1,
            *tiny_pair_args(tiny_dirs)]  # fmt: skip
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    costs = CostModel.from_dict(json.loads(policy.read_text())["cost_model"])
    assert costs.context_len == runs.decoding_context
    # calibrated on the real decode (real steps over their timed passes; near 1 on an idle
    # machine, but a timing: only that it was measured is asserted here)
    assert math.isfinite(costs.step_scale) and costs.step_scale > 0 and costs.step_scale != 1.0
    torch.set_num_threads(1)
    draft, target = near_pair("qwen2", len(tokenizer))
    decoder = SpeculativeDecoder(draft, target, len(tokenizer), frozenset())
    with pytest.raises(PolicyError, match="text has 20 tokens, fewer than context_len 21"):
        measure_costs(decoder, context_len=21, sizes=(1, 2), repeats=1, text=whole[:20])


def test_a_lookups_step_scale_is_set_against_plain_decoding_timed_beside_it(tokenizer):
    """The lookup's cost model takes the target's passes from the draft model's, timed minutes
    before; its step_scale sets each round's real steps against the plain decoding timed in
    that round, so the machine's speed when those passes were timed divides out: target costs
    timed on a machine 3x slower give the same step_scale, not a third of it, and the steps
    that proposed nothing are priced from the same decodes (empty_step_scale, near 1)."""
    from dataclasses import replace

    from specscope.drafters import lookup_for
    from specscope.tune.costs import measure_costs

    torch.set_num_threads(1)
    draft, target = near_pair("qwen2", len(tokenizer))
    vocab = len(tokenizer)
    drafted = SpeculativeDecoder(draft, target, vocab, frozenset())
    text = [t % 50 for t in range(64)]  # repeats, so the lookup finds what to propose
    timed = dict(context_len=32, sizes=(1, 2, 4), repeats=3, text=text, decode_tokens=12)
    costs = measure_costs(drafted, **timed)
    slower = replace(
        costs,
        target_s=tuple((k, 3 * s) for k, s in costs.target_s),
        plain_token_s=3 * costs.plain_token_s,
    )
    ngram = DrafterConfig("ngram")
    lookup = SpeculativeDecoder(None, target, vocab, frozenset(), lookup_for(ngram))
    fast, slow = (
        measure_costs(lookup, **timed, target_costs=base, drafter=ngram) for base in (costs, slower)
    )
    assert 0.6 < slow.step_scale / fast.step_scale < 1.6
    assert 0.3 < fast.empty_step_scale < 3 and 0.3 < slow.empty_step_scale < 3


def _spine(rates: dict[str, list[float]]) -> pd.DataFrame:
    return spine_nodes(rates, prompts=2, steps=40)


def test_tune_chooses_the_backend_per_domain_and_the_policy_file_says_so(tmp_path):
    """Assisted steps cheaper than specscope's (0.05 s against 0.02 + 0.1 + ...): every domain
    that speculates runs transformers' assisted generation, each chain predicted from the same
    replay (steps counted as each backend decodes) and priced by the assisted step table; the
    file round-trips; with assisted steps dearer, specscope's decoder is chosen and the file is
    written as before backends."""
    nodes = _spine({"code": [0.9, 0.8, 0.7], "chat": [0.5, 0.3, 0.2]})
    steps = steps_of(nodes)
    cheap = tune([Measured(DrafterConfig(), nodes, steps, _costs(0.05))], TuneConfig(min_count=1))
    for domain in ("code", "chat"):
        choice = cheap.choices[domain]
        assert choice.backend == "transformers" and choice.shape.is_chain
        assert choice.step_time_s == pytest.approx(0.05)
        later = choice.prediction.decode_tokens_per_step  # after the first pass, as benched
        assert choice.predicted_speedup == pytest.approx(later / 0.05 * 0.1)
        assert cheap.backend_for(domain) == "transformers"
    path = cheap.save(tmp_path / "policy.json")
    loaded = PolicyFile.load(path)
    assert loaded.backends == cheap.backends and loaded.trees == cheap.trees
    assert json.loads(path.read_text())["domains"]["code"]["backend"] == "transformers"
    # both backends' candidates, one replayed prediction each
    cells = {
        (c["domain"], c["tree"], c.get("backend", "specscope")): c
        for c in loaded.info["candidates"]
    }
    chain2 = TreeShape.chain(2).to_paths_literal()
    mine, theirs = cells["code", chain2, "specscope"], cells["code", chain2, "transformers"]
    assert theirs["step_time_s"] == 0.05
    # one replay, its steps counted as each backend decodes: transformers drafts in its first pass
    records = ReplayRecords.from_frames(nodes, steps)
    for prefill_drafts, cell in ((False, mine), (True, theirs)):
        counts = replay_counts(records, Subtree(TreeShape.chain(2)), prefill_drafts)
        expected = counts.ratios(records, "positions", "steps")["code"]
        assert cell["prediction"]["tokens_per_step"] == pytest.approx(expected, abs=1e-4)
    assert theirs["prediction"]["tokens_per_step"] > mine["prediction"]["tokens_per_step"]
    dear = tune([Measured(DrafterConfig(), nodes, steps, _costs(5.0))], TuneConfig(min_count=1))
    assert dear.backends == {} and dear.uniform_backend == "specscope"
    assert "backend" not in json.dumps({k: dear.to_dict()[k] for k in ("domains", "uniform")})


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"tree": "[(0,), (0, 0)]", "backend": "vllm"}, "unknown backend 'vllm'"),
        ({"tree": "[(0,), (1,)]", "backend": "transformers"}, "decodes a chain"),
        ({"tree": "none", "backend": "transformers"}, "decodes a chain"),
        (
            {
                "tree": "[(0,), (0, 0)]",
                "backend": "transformers",
                "drafter": {"kind": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3},
            },
            "drafted by the draft model",
        ),
    ],
)
def test_a_backend_that_cannot_run_the_entry_is_refused_by_name(entry, message):
    with pytest.raises(PolicyError, match=message):
        PolicyFile.from_dict({"domains": {"code": entry}})


# --- the bench runs the backend the policy chose --------------------------------------------------


def test_the_bench_routes_to_assisted_generation_and_predicts_it(tokenizer):
    """A policy sending code to transformers' assisted generation (a chain of 2): routed code
    prompts run it (the assisted method's very run, K = 2), the outputs are plain greedy's, the
    steps are the target's passes, and the assisted method is set against tune's prediction."""
    torch.set_num_threads(1)
    draft, target = near_pair("qwen2", len(tokenizer), noise=0.05)
    decoder = SpeculativeDecoder(draft, target, len(tokenizer), frozenset())
    nodes = _spine({"code": [0.9, 0.8, 0.7]})
    policy = tune(
        [Measured(DrafterConfig(), nodes, steps_of(nodes), _costs(0.05))], TuneConfig(min_count=1)
    )
    policy = PolicyFile.from_dict(json.loads(json.dumps(policy.to_dict())))
    code = TreeShape.chain(2)
    policy.trees["code"] = code  # the chain of 2, whatever K the toy costs preferred
    items = [
        PromptItem(f"code-{i}", "code", ({"role": "user", "content": text},))
        for i, text in enumerate(["Write a Python function to add.", "def fib(n): return"])
    ]
    config = BenchConfig(
        max_new_tokens=8,
        warmup=0,
        repeats=1,
        assisted_tokens=2,
        methods=("plain", "assisted", "routed"),
    )
    runs = bench_decoder(lambda drafter: decoder, tokenizer, items, policy, RuleRouter(), config)
    by = {(r.method, r.prompt_id): r for r in runs}
    for item in items:
        plain, assisted, routed = (by[m, item.id] for m in ("plain", "assisted", "routed"))
        assert routed.routed_to == "code" and routed.repeat_times_s == assisted.repeat_times_s
        assert assisted.tokens == plain.tokens == routed.tokens
        assert 1 <= assisted.steps <= plain.steps == len(plain.tokens)
    found = candidate_predictions(policy, config)
    entry = next(
        c
        for c in policy.info["candidates"]
        if c["domain"] == "code"
        and c.get("backend") == "transformers"
        and c["tree"] == code.to_paths_literal()
    )
    assert found["assisted", "code"].speedup == entry["predicted_speedup"]
    assert ("assisted", ALL_DOMAINS) in found


def test_the_bench_counts_assisted_generations_decoding_after_its_first_step(tokenizer):
    """Assisted generation's first pass verifies a chain drafted from the prompt: with a perfect
    drafter and K = 2 its first step brings 3 tokens, and the bench's decode phase (what its
    speed-up is over) is the 5 tokens after them, not 7 (plain's first step: the prefill's one)."""
    torch.manual_seed(0)
    target = tiny_model("qwen2", len(tokenizer), seed=3)
    decoder = SpeculativeDecoder(copy.deepcopy(target), target, len(tokenizer), frozenset())
    items = [PromptItem("code-0", "code", ({"role": "user", "content": "def add(a, b):"},))]
    config = BenchConfig(
        max_new_tokens=8, warmup=0, repeats=1, assisted_tokens=2, methods=("plain", "assisted")
    )
    runs = bench_decoder(lambda drafter: decoder, tokenizer, items, None, RuleRouter(), config)
    plain, assisted = runs
    assert assisted.tokens == plain.tokens and len(plain.tokens) == 8
    assert (plain.first_tokens, plain.decode_tokens) == (1, 7)
    assert (assisted.first_tokens, assisted.decode_tokens, assisted.steps) == (3, 5, 3)


def test_specscope_and_assisted_generation_decode_the_same_chain_alike(tokenizer):
    """The same speculation in both backends: a chain of 3 decoded by specscope's loop and by
    transformers' assisted generation gives plain greedy's output (float32)."""
    draft, target = near_pair("llama", len(tokenizer), noise=0.05)
    decoder = SpeculativeDecoder(draft, target, len(tokenizer), frozenset())
    ids = tokenizer("The sum of 2 and 3 is")["input_ids"]
    plain = plain_generate(target, ids, DecodeConfig(max_new_tokens=10), len(tokenizer)).tokens
    ours = decoder.generate(ids, TreeShape.chain(3), DecodeConfig(max_new_tokens=10)).tokens
    theirs = hf_generate(target, ids, 10, frozenset(), draft, 3).tokens
    assert ours == theirs == plain
