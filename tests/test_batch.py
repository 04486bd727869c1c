"""Batched measurement gives the records of one prompt at a time (tiny random models)."""

import json

import numpy as np
import pandas as pd
import pytest
from specscope.measure import batched as batch_module
from specscope.models import PairConfig
from specscope.records import TIMING_COLUMNS, RunDir, load_run
from specscope.run.config import PromptSpec, RunConfig, RunConfigError
from specscope.run.study import run_study
from specscope.trees import TreeConfig

EXACT_NODE_COLUMNS = ["prompt_id", "step", "node_id", "parent_id", "depth", "sibling_rank",
                      "token_id", "greedy_accept", "target_rank"]
TARGET_COLUMNS = ["p_target", "target_entropy", "target_top1_prob", "target_margin"]
DRAFT_COLUMNS = ["p_draft", "alpha", "draft_entropy", "kl_target_draft"]


@pytest.fixture
def prompts(tmp_path):
    # prompts of very different lengths, so the batch is ragged and rows finish at other times
    path = tmp_path / "p.jsonl"
    texts = ["Hi.", "Explain recursion " * 6, "2+2?", "Write a long story about " * 3 + "a cat.",
             "Why?", "List three colours, please.", "ok", "Translate 'bonjour' to English."]
    path.write_text("".join(json.dumps({"id": f"q{i}", "domain": ["code", "chat"][i % 2],
                                        "prompt": t}) + "\n" for i, t in enumerate(texts)))
    return path


def _config(tiny_dirs, prompts, arch, tree=TreeConfig(policy="paper"), **pair) -> RunConfig:
    return RunConfig(pair=PairConfig(draft=str(tiny_dirs[arch, "draft"]),
                                     target=str(tiny_dirs[arch, "target"]), dtype="float32",
                                     **pair),
                     tree=tree, prompts=PromptSpec(file=str(prompts)), max_new_tokens=7)


def _sorted(df: pd.DataFrame, keys) -> pd.DataFrame:
    return df.drop(columns=[c for c in TIMING_COLUMNS if c in df]).sort_values(keys).reset_index(
        drop=True)


def _compare(a, b, exact_p: bool) -> None:
    na, nb = (_sorted(r.nodes, ["prompt_id", "step", "node_id"]) for r in (a, b))
    assert len(na) == len(nb) > 0
    pd.testing.assert_frame_equal(na[EXACT_NODE_COLUMNS], nb[EXACT_NODE_COLUMNS])
    for column in TARGET_COLUMNS + DRAFT_COLUMNS:
        if exact_p:
            np.testing.assert_array_equal(na[column], nb[column])
        else:
            np.testing.assert_allclose(na[column], nb[column], atol=1e-5, rtol=0)
    sa, sb = (_sorted(r.steps, ["prompt_id", "step"]) for r in (a, b))
    pd.testing.assert_frame_equal(sa[["prompt_id", "step", "emitted_token", "accepted_len", "tau",
                                      "context_len"]],
                                  sb[["prompt_id", "step", "emitted_token", "accepted_len", "tau",
                                      "context_len"]])
    pa_, pb = (_sorted(r.prompts, ["prompt_id"]) for r in (a, b))
    assert [list(x) for x in pa_.output_token_ids] == [list(x) for x in pb.output_token_ids]
    assert list(pa_.order) == list(pb.order)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("tree", [TreeConfig(policy="paper"), TreeConfig(policy="chain", depth=4)],
                         ids=["paper", "chain4"])
def test_batched_records_equal_one_prompt_at_a_time(tiny_dirs, prompts, tmp_path, arch, tree):
    config = _config(tiny_dirs, prompts, arch, tree)
    run_study(config, tmp_path / "one", progress=False)
    run_study(config, tmp_path / "three", progress=False, batch_size=3)
    run_study(config, tmp_path / "all", progress=False, batch_size=8)
    one = load_run(tmp_path / "one")
    _compare(one, load_run(tmp_path / "three"), exact_p=False)
    _compare(one, load_run(tmp_path / "all"), exact_p=False)
    assert json.loads((tmp_path / "three" / "manifest.json").read_text())["execution"][
        "batch_size"] == 3


def test_batched_int8_records_are_bit_identical(tiny_dirs, prompts, tmp_path):
    # int8 linears and row-wise attention in both models: nothing depends on the batch
    config = _config(tiny_dirs, prompts, "qwen2", quantize="int8")
    run_study(config, tmp_path / "one", progress=False)
    run_study(config, tmp_path / "four", progress=False, batch_size=4)
    _compare(load_run(tmp_path / "one"), load_run(tmp_path / "four"), exact_p=True)


def test_an_interrupted_batched_run_resumes_to_the_same_records(tiny_dirs, prompts, tmp_path,
                                                                monkeypatch):
    config = _config(tiny_dirs, prompts, "llama")
    run_study(config, tmp_path / "whole", progress=False, batch_size=3)
    real = RunDir.commit_prompt
    calls = {"n": 0}

    def dies_after_three(self, *args, **kwargs):
        if calls["n"] == 3:
            raise KeyboardInterrupt
        calls["n"] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RunDir, "commit_prompt", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        run_study(config, tmp_path / "cut", progress=False, batch_size=3)
    monkeypatch.setattr(RunDir, "commit_prompt", real)
    summary = run_study(config, tmp_path / "cut", progress=False, batch_size=3)
    assert summary.prompts_measured == 8 - 3
    whole, cut = load_run(tmp_path / "whole"), load_run(tmp_path / "cut")
    _compare(whole, cut, exact_p=False)  # rows meet other batch partners after the resume


def test_bad_batch_sizes_are_refused_before_anything_is_written(tiny_dirs, prompts, tmp_path,
                                                               monkeypatch):
    config = _config(tiny_dirs, prompts, "llama")
    with pytest.raises(RunConfigError, match="batch size must be >= 1, got 0"):
        run_study(config, tmp_path / "zero", progress=False, batch_size=0)
    monkeypatch.setattr(batch_module, "_available_bytes", lambda device: 5 * 2**20)
    with pytest.raises(RunConfigError, match=r"--batch-size 64 needs about .* the largest batch "
                                             r"that fits is about \d+"):
        run_study(config, tmp_path / "huge", progress=False, batch_size=64)
    assert not (tmp_path / "zero").exists() and not (tmp_path / "huge").exists()
    with pytest.raises(RunConfigError, match="needs the cached engine"):
        run_study(RunConfig(**{**config.__dict__, "engine": "naive"}), tmp_path / "n",
                  progress=False, batch_size=2)
