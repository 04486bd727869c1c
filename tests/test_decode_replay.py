"""Decoding is what the replay of a measurement predicts: tiny float32 pairs (Qwen2, Llama) are
measured with a tree (``run_study``), then the same prompts are decoded by specscope's decoder with a chain
inside that tree, a subtree and a draft-probability stop rule; per prompt, decode's output tokens
and steps equal those of the recorded trees replayed as greedy decoding
(:mod:`specscope.analysis.replay`, ``prefill_drafts=False``), and decode's output is the
measurement's trajectory. A perfect drafter (draft = target) decodes K + 1 tokens per step with a
chain of K, less the output's end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from conftest import run_config
from specscope.analysis.replay import (
    StopRule,
    Subtree,
    index_records,
    replay_counts,
    top_chain,
)
from specscope.decode import (
    DecodeConfig,
    DecodeError,
    SpeculativeDecoder,
    emitted_per_step,
    make_decoder,
    tokens_per_step,
)
from specscope.drafters import DrafterConfig
from specscope.models.load import load_pair
from specscope.models.tiny import near_pair
from specscope.prompts.render import render_item
from specscope.run.study import run_study
from specscope.trees import DynamicTree, TreeConfig, TreeShape

MEASURED = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)]"
NEW_TOKENS = 20
PROMPTS = [
    ("c0", "code", "def add(a, b):\n    return"),
    ("c1", "code", "x = [1, 2, 3]\nfor i in"),
    ("h0", "chat", "The capital of France is"),
    ("h1", "chat", "Once upon a time"),
]


def _measure(root, arch: str, tokenizer, pair: dict | None = None, batch_size: int = 1):
    """A near pair (many nodes accepted) of ``arch`` saved as checkpoints under ``root`` and
    measured with MEASURED on PROMPTS: (the run's config, its directory)."""
    draft, target = near_pair(arch, len(tokenizer), noise=0.05)
    dirs = {}
    for role, model in (("draft", draft), ("target", target)):
        model.save_pretrained(root / role)
        tokenizer.save_pretrained(root / role)
        dirs[arch, role] = root / role
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": i, "domain": d, "prompt": p}) + "\n" for i, d, p in PROMPTS)
    )
    config = run_config(
        dirs,
        prompts,
        arch,
        pair=pair,
        tree=TreeConfig(policy="static", paths=MEASURED),
        max_new_tokens=NEW_TOKENS,
        criteria=None,
    )
    run_study(config, root / "run", progress=False, batch_size=batch_size)
    return config, root / "run"


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def measured(request, tmp_path_factory, tokenizer):
    """Each architecture's near pair measured in float32: (the run's config, its directory, the
    loaded pair)."""
    arch = request.param
    config, run_dir = _measure(tmp_path_factory.mktemp(f"decode-replay-{arch}"), arch, tokenizer)
    return config, run_dir, load_pair(config.pair)


def _decode_all(measured, spec, **stop) -> dict:
    """prompt id -> decode's result on the measured prompt, rendered as the run rendered it
    (``stop``: ``p_min`` or ``h_max``)."""
    config, _, pair = measured
    decoder = make_decoder(pair)
    out = {}
    for item in config.prompts.select(config.seed):
        ids = render_item(pair.tokenizer, item, config.rendering, config.max_prompt_tokens).ids
        out[item.id] = decoder.generate(ids, spec, DecodeConfig(NEW_TOKENS), **stop)
    return out


def _p_min_between_recorded_values(run_dir, signal="p_draft", quantiles=(0.3, 0.7)) -> float:
    """A threshold between the recorded draft probabilities' (or ``signal``'s) 30th and 70th
    percentiles (so that it stops some nodes and keeps others), in the widest gap there: no
    recorded value within 1e-4 of it (float32 drafts of the same context may differ in the last
    digits)."""
    from specscope.records import load_run

    p = np.sort(load_run(run_dir).nodes[signal].to_numpy())
    lo, hi = np.quantile(p, quantiles)
    gap, middle = max((b - a, (a + b) / 2) for a, b in zip(p, p[1:]) if lo < (a + b) / 2 < hi)
    assert gap > 2e-4
    return float(middle)


@pytest.mark.parametrize("candidate", ["chain(1)", "chain(3)", "chain(4)", "subtree", "p_min"])
def test_decoding_equals_the_replay_of_the_measured_trees(measured, candidate):
    config, run_dir, _ = measured
    p_min = 0.0
    if candidate == "subtree":
        shape = TreeShape.parse("[(0,), (1,), (0, 0), (0, 0, 0)]")
        rule = Subtree(shape)
    elif candidate == "p_min":
        shape, p_min = TreeShape.parse(MEASURED), _p_min_between_recorded_values(run_dir)
        rule = StopRule(Subtree(shape), p_min=p_min)
    else:
        rule = top_chain(int(candidate[6:-1]))
        shape = rule.shape
    rec = index_records(run_dir)
    counts = replay_counts(rec, rule, prefill_drafts=False)
    decoded = _decode_all(measured, shape, p_min=p_min)
    steps = load_run_steps(run_dir)
    accepted_somewhere = 0
    for p, prompt in enumerate(rec.prompt_ids):
        result = decoded[prompt]
        assert result.tokens == steps[prompt], prompt  # the measurement's trajectory
        assert (len(result.tokens), len(result.steps)) == (counts.positions[p], counts.steps[p])
        proposed = sum(s.tree_size > 0 for s in result.steps)
        assert proposed == counts.proposals[p], prompt
        accepted_somewhere += sum(s.accepted_len for s in result.steps)
    assert accepted_somewhere > 0  # the check is not only of empty trees


@pytest.mark.parametrize(
    "signal, quantiles",
    [("p_draft", (0.3, 0.7)), ("p_draft", (0.05, 0.3)), ("draft_entropy", (0.3, 0.7))],
)
def test_tune_predicts_a_stop_rules_tokens_per_step_as_decode_measures_them(
    measured, signal, quantiles
):
    """The stop rule as ``tune`` weighs it (:class:`Stop` on the measured tree, predicted by the
    chooser's replay) decodes, per domain and pooled, exactly the tokens per step that
    ``decode`` with it measures (``--p-min``, or its entropy twin), at thresholds that cut."""
    from specscope.records import ALL_DOMAINS, load_run
    from specscope.tune.policy import Measured, TuneConfig
    from specscope.tune.predict import Stop

    _, run_dir, _ = measured
    run = load_run(run_dir)
    m = Measured(DrafterConfig(), run.nodes, run.steps, costs=None)
    predictor = m.predictor(m.vectors(TuneConfig(min_count=1)))
    shape = TreeShape.parse(MEASURED)
    stop = Stop(signal, _p_min_between_recorded_values(run_dir, signal, quantiles))
    assert predictor.counts(shape, stop).drafted.sum() < predictor.counts(shape).drafted.sum()
    decoded = _decode_all(measured, shape, **stop.decode_args)
    domains = run.prompts.set_index("prompt_id")["domain"]
    for domain in (*sorted(set(domains)), ALL_DOMAINS):
        mine = [r for p, r in decoded.items() if domain in (ALL_DOMAINS, domains[p])]
        tokens, steps = sum(len(r.tokens) for r in mine), sum(len(r.steps) for r in mine)
        assert predictor.predict(shape, domain, stop).tokens_per_step == tokens / steps, domain


@pytest.mark.parametrize("k", [1, 3, 4])
def test_assisted_generation_equals_the_replay_counted_as_transformers_counts(measured, k):
    """transformers' assisted generation with a chain of K (constant schedule, no confidence
    stop) decodes the measurement's trajectory, in as many target passes as the recorded trees
    replayed with the chain drafted from the prompt in the first pass (``prefill_drafts=True``),
    prompt by prompt; and after the first pass, the tokens and steps the replay's
    ``after_first`` gives (what tune predicts its decode speed from)."""
    from specscope.tune.hf_generate import hf_generate

    config, run_dir, pair = measured
    rec = index_records(run_dir)
    counts = replay_counts(rec, top_chain(k), prefill_drafts=True)
    later = counts.after_first()
    steps = load_run_steps(run_dir)
    for item in config.prompts.select(config.seed):
        ids = render_item(pair.tokenizer, item, config.rendering, config.max_prompt_tokens).ids
        g = hf_generate(
            pair.target.model, ids, NEW_TOKENS, frozenset(), pair.draft.model, k, NEW_TOKENS
        )
        p = rec.prompt_ids.index(item.id)
        assert g.tokens == steps[item.id], item.id
        assert g.target_passes == counts.steps[p], item.id
        assert len(g.tokens) - g.first_tokens == later.positions[p], item.id


def load_run_steps(run_dir) -> dict[str, list[int]]:
    """prompt id -> the target's greedy tokens the measurement committed, in order."""
    from specscope.records import load_run

    steps = load_run(run_dir).steps.sort_values(["prompt_id", "step"])
    return {p: g["emitted_token"].tolist() for p, g in steps.groupby("prompt_id")}


def test_the_stop_rule_drafts_less_than_the_tree_it_cuts(measured):
    _, run_dir, _ = measured
    shape = TreeShape.parse(MEASURED)
    p_min = _p_min_between_recorded_values(run_dir)
    whole = _decode_all(measured, shape)
    cut = _decode_all(measured, shape, p_min=p_min)
    drafted = [sum(s.tree_size for s in r.steps) for r in whole.values()]
    kept = [sum(s.tree_size for s in r.steps) for r in cut.values()]
    assert sum(kept) < sum(drafted)
    assert all(a.tokens == b.tokens for a, b in zip(whole.values(), cut.values()))


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("new_tokens", [1, 7, 16])
def test_a_perfect_drafter_decodes_k_plus_one_tokens_per_step(tokenizer, k, new_tokens):
    _, target = near_pair("llama", len(tokenizer), noise=0.0)
    decoder = SpeculativeDecoder(target, target, len(tokenizer), frozenset())
    ids = tokenizer("def add(a, b):\n    return")["input_ids"]
    result = decoder.generate(ids, TreeShape.chain(k), DecodeConfig(new_tokens))
    n = len(result.tokens)
    assert n == new_tokens  # no EOS: the budget ends the output
    # the prefill's token, then K + 1 per step until fewer are left: the last step takes the rest
    expected = (
        [1] + [k + 1] * ((n - 1) // (k + 1)) + ([(n - 1) % (k + 1)] if (n - 1) % (k + 1) else [])
    )
    assert emitted_per_step(result) == expected
    assert tokens_per_step(result) == n / (1 + math.ceil((n - 1) / (k + 1)))


def test_records_count_the_tokens_the_output_keeps(measured):
    """The output's end cuts the last step: a step's ``emitted`` sums to the output's length,
    while its ``tau`` (accepted path + bonus, as verified) may exceed it."""
    from specscope.decode import steps_frame

    cut = 0
    for result in _decode_all(measured, TreeShape.parse(MEASURED)).values():
        frame = steps_frame(result)
        assert frame["emitted"].sum() == len(result.tokens) == NEW_TOKENS
        assert (frame["emitted"] <= frame["tau"]).all()
        assert (frame["emitted"].iloc[:-1] == frame["tau"].iloc[:-1]).all()
        cut += frame["tau"].sum() > NEW_TOKENS
    assert cut  # some output's last step verified more than the budget kept


def test_p_min_is_refused_where_it_has_no_meaning(measured):
    _, _, pair = measured
    decoder = make_decoder(pair)
    chain = TreeShape.chain(2)
    with pytest.raises(DecodeError, match="in \\[0, 1\\]"):
        decoder.generate([1, 2, 3], chain, DecodeConfig(4), p_min=1.5)
    with pytest.raises(DecodeError, match="temperature"):
        decoder.generate([1, 2, 3], chain, DecodeConfig(4, temperature=1.0), p_min=0.5)
    with pytest.raises(DecodeError, match="dynamic tree"):
        decoder.generate([1, 2, 3], DynamicTree(), DecodeConfig(4), p_min=0.5)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def measured_int8(tmp_path_factory, tokenizer):
    """The near Llama pair measured in int8 in batches of 4 (the draft on row-wise attention,
    as int8 measurement runs it): (the run's config, its directory)."""
    root = tmp_path_factory.mktemp("decode-replay-int8")
    return _measure(root, "llama", tokenizer, pair={"quantize": "int8"}, batch_size=4)


@pytest.mark.int8
@pytest.mark.parametrize("k", [2, 4])
def test_int8_decoding_on_the_measured_draft_attention_is_the_replay(measured_int8, k):
    """With the draft on the attention int8 measurement drafts with (``--draft-attention
    rowwise``), specscope's decoder and transformers' assisted generation decode each prompt in
    exactly the steps the records replay to, and the measurement's trajectory."""
    from specscope.tune.choose import PairRequest, load_decode_pair
    from specscope.tune.hf_generate import hf_generate

    config, run_dir = measured_int8
    pair = load_decode_pair(
        PairRequest(config.pair.draft, config.pair.target, int8=True, draft_attention="rowwise")
    )
    assert pair.draft.model.config._attn_implementation == "specscope_rowwise"
    rec = index_records(run_dir)
    ours = replay_counts(rec, top_chain(k), prefill_drafts=False)
    theirs = replay_counts(rec, top_chain(k), prefill_drafts=True)
    steps = load_run_steps(run_dir)
    decoder = make_decoder(pair)
    for item in config.prompts.select(config.seed):
        ids = render_item(pair.tokenizer, item, config.rendering, config.max_prompt_tokens).ids
        p = rec.prompt_ids.index(item.id)
        result = decoder.generate(ids, TreeShape.chain(k), DecodeConfig(NEW_TOKENS))
        assert result.tokens == steps[item.id], item.id
        assert len(result.steps) == ours.steps[p], item.id
        g = hf_generate(
            pair.target.model, ids, NEW_TOKENS, frozenset(), pair.draft.model, k, NEW_TOKENS
        )
        assert g.tokens == steps[item.id], item.id
        assert g.target_passes == theirs.steps[p], item.id


def test_rowwise_draft_attention_is_refused_without_int8():
    from specscope.tune.acceptance import PolicyError
    from specscope.tune.choose import PairRequest

    with pytest.raises(PolicyError, match="needs --int8"):
        PairRequest(draft_attention="rowwise")
    with pytest.raises(PolicyError, match="one of sdpa, rowwise, not 'flash'"):
        PairRequest(int8=True, draft_attention="flash")
