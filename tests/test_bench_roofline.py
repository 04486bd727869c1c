"""The roofline benchmark (benchmarks/bench_roofline.py, imported from its path) and the stage
timing it rests on (lab.stages_timing), on the tiny random Qwen2 pair: operation
counts against a hand computation, a breakdown that adds up to the wall, records of an
instrumented run equal to a plain run's bit for bit, everything restored after, and the devices
and dtypes it refuses."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import read_records, write_prompts
from lab import stages_timing as st
from specscope.core import batch
from specscope.models import int8

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_roofline.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_roofline", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def tiny_cell(bench, dtype: str, prompts: Path, work: Path, size: int = 2):
    args = bench.parse(
        ["--pair", "tiny", "--device", "cpu", "--prompts", str(prompts), "--max-new-tokens", "4"]
    )
    config = bench.pair_config("tiny", dtype, "cpu")
    pair = bench.build_pair("tiny", config)
    return bench.measure_cell(pair, bench.run_config(args, config), dtype, size, work, 1e-4)


def test_one_linear_call_counts_two_times_rows_in_out_operations():
    linear = torch.nn.Linear(3, 5)
    with st.instrumented({"m": linear}, st.Clock()) as recorder:
        with torch.inference_mode():
            linear(torch.randn(2, 4, 3))  # 8 rows
    b = recorder.breakdown(1.0)
    shape = st.LinearShape("m", 3, 5, head=False)
    assert b.census == {("", shape, 8): 1}
    assert b.ops == 2 * 8 * 3 * 5 == st.linear_ops(8, 3, 5)
    (outside,) = b.stages  # no measurement stage ran: the call is outside every stage
    assert outside.name == "" and outside.kernels[0].calls == 1


def test_the_instrumentation_is_gone_after_the_block_even_after_an_error():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    mapping = type(ALL_ATTENTION_FUNCTIONS)._global_mapping
    before = (batch.verify, batch.Batch.draft_tree, mapping["sdpa"], int8.rowwise_attention)
    linear = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="inside"):
        with st.instrumented({"m": linear}, st.Clock()):
            assert batch.verify is not before[0]
            raise RuntimeError("inside")
    after = (batch.verify, batch.Batch.draft_tree, mapping["sdpa"], int8.rowwise_attention)
    assert after == before
    assert "draft_tree" in vars(batch.Batch)  # restored on the class, not left inherited
    assert not linear._forward_hooks and not linear._forward_pre_hooks


def test_nested_stages_do_not_count_twice():
    recorder = st.Recorder(st.Clock())
    with recorder.region(st.TREE, True):
        with recorder.region(st.CACHE, True):
            with recorder.region(st.LINEARS, False):
                pass
    b = recorder.breakdown(10.0)
    tree, cache = b.stage(st.TREE), b.stage(st.CACHE)
    assert cache.kernels[0].calls == 1 and not tree.kernels  # the innermost stage's kernel
    assert b.staged_s == pytest.approx(tree.seconds + cache.seconds)
    assert tree.seconds >= 0 and b.other_s == pytest.approx(10.0 - b.staged_s)


@pytest.fixture(scope="module")
def float_cell(bench, tmp_path_factory):
    work = tmp_path_factory.mktemp("roofline")
    prompts = write_prompts(work / "prompts.jsonl", domains=("chat",))
    return tiny_cell(bench, "float32", prompts, work), work


def test_the_stages_and_the_remainder_add_up_to_the_wall(float_cell):
    cell, _ = float_cell
    b = cell.breakdown
    assert b.wall_s == cell.instrumented_s > 0
    assert b.other_s >= 0 and b.staged_s + b.other_s == pytest.approx(b.wall_s)
    names = [s.name for s in b.stages]
    for stage in (st.DRAFT, st.TREE, st.STATISTICS, st.CACHE, st.PREFILL, st.RECORDS):
        assert stage in names
    for stage in b.stages:
        assert stage.seconds >= 0 and stage.kernel_seconds <= stage.seconds + 1e-6
    kinds = {k.name for k in b.stage(st.TREE).kernels}
    assert kinds == {st.LINEARS, st.LM_HEAD, st.ATTENTION}


def test_the_counted_operations_are_those_of_the_calls_the_hooks_saw(float_cell):
    cell, _ = float_cell
    b = cell.breakdown
    by_census = sum(
        n * st.linear_ops(rows, s.in_features, s.out_features)
        for (_, s, rows), n in b.census.items()
    )
    assert b.ops == by_census == cell.run.ops > 0
    # the tree pass of a full batch of 2 rows: 1 + 3 scored nodes of the paper tree per row
    assert cell.step_rows == {"draft": (2, 4, 2), "target": (8,)}
    assert math.isfinite(cell.ratio) and cell.ratio > 0
    assert cell.region_cost_s >= 0 and b.regions > 0


def test_an_instrumented_run_records_what_a_plain_run_records_bit_for_bit(float_cell):
    cell, work = float_cell
    assert cell.records_identical
    for plain, timed in zip(
        read_records(work / "plain"), read_records(work / "instrumented"), strict=True
    ):
        pd.testing.assert_frame_equal(plain, timed, check_exact=True)


@pytest.mark.int8
def test_int8_times_the_rowwise_attention_and_keeps_its_records(bench, prompt_file, tmp_path):
    cell = tiny_cell(bench, "int8", prompt_file, tmp_path)
    assert cell.records_identical
    for stage in (st.DRAFT, st.TREE):
        kernels = {k.name: k for k in cell.breakdown.stage(stage).kernels}
        assert kernels[st.ATTENTION].calls > 0 and kernels[st.LINEARS].ops > 0


def test_the_json_holds_the_machine_and_every_cell(bench, prompt_file, tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["--pair", "tiny", "--device", "cpu", "--prompts", str(prompt_file)]
    argv += ["--max-new-tokens", "2", "--sizes", "1", "--min-seconds", "0.0001", "--no-warmup"]
    argv += ["--out", str(out)]
    bench.main(argv)
    report = json.loads(out.read_text())
    assert report["machine"]["torch"] == torch.__version__
    assert "avx2" in report["machine"]["hardware"]
    (cell,) = report["cells"]
    assert cell["batch"] == 1 and cell["records_identical"] is True
    assert cell["achieved_over_attainable"] > 0
    assert "achieved/attainable" in capsys.readouterr().out


def test_int8_on_a_gpu_is_refused_before_anything_loads(bench):
    with pytest.raises(bench.BenchError, match="CPU only"):
        bench.pair_config("tiny", "int8", "cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_refused_with_a_message(bench, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--pair", "tiny", "--device", "cuda", "--dtypes", "float32"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "sees no CUDA GPU" in err and "--device cpu" in err


def test_attainable_sums_each_calls_time_at_its_shapes_timed_speed():
    head = st.LinearShape("target", 4, 10, head=True)
    proj = st.LinearShape("target", 4, 4, head=False)
    timings = {(head, 3): st.LinearTiming(head, 3, 2e-3), (proj, 3): st.LinearTiming(proj, 3, 1e-3)}
    got = st.attainable({(head, 3): 1, (proj, 3): 5}, timings)
    assert got.ops == 2 * 3 * 4 * 10 + 5 * 2 * 3 * 4 * 4 == 720
    assert got.seconds == pytest.approx(2e-3 + 5e-3)
    assert got.gops == pytest.approx(720 / 7e-3 / 1e9)
    with pytest.raises(st.TimingError, match="no timing for 1"):
        st.attainable({(proj, 9): 1}, timings)


def test_a_linear_is_timed_with_its_own_forward():
    linear = torch.nn.Linear(8, 16)
    seconds = st.time_linear(linear, rows=4, clock=st.Clock(), min_seconds=0.0)
    assert 0 < seconds < 1
    assert not linear._forward_hooks  # timed alone, nothing installed


def test_the_random_pair_has_the_demo_pairs_vocabulary_and_an_untied_head(bench, monkeypatch):
    monkeypatch.setattr(bench, "QWEN2_SIZES", bench.TINY_SIZES)  # the real sizes take GBs
    pair = bench.build_pair("random", bench.pair_config("random", "bfloat16", "cpu"))
    target = pair.target.model
    assert pair.vocab_size == 151936 and target.dtype == torch.bfloat16
    head = target.get_output_embeddings()
    assert head.weight.shape == (151936, 64)
    assert head.weight.data_ptr() != target.get_input_embeddings().weight.data_ptr()
    shapes = st.shape_counts(bench.pair_models(pair))
    assert shapes[st.LinearShape("target", 64, 151936, head=True)] == 1


def test_the_random_pairs_sizes_are_the_demo_pairs(bench):
    from transformers import Qwen2ForCausalLM

    # the parameters the demo pair's runs record (results/demo-pair manifests); built on meta
    demo = {"draft": 630_167_424, "target": 1_777_088_000}
    for role, parameters in demo.items():
        with torch.device("meta"):
            model = Qwen2ForCausalLM(bench.qwen2_config("random", role, 151936))
        assert sum(p.numel() for p in model.parameters()) == parameters


def test_the_determinism_bench_finds_two_cpu_runs_equal_and_batch_1_on_the_same_tokens(
    prompt_file, capsys
):
    """benchmarks/bench_determinism.py (the check behind BENCHMARKS' GPU records) on the CPU:
    a second plain run and an instrumented run differ from the first in no column; batch 1 keeps
    every token (float32 probabilities may move in the last bits, as docs/guides/measure.md says)."""
    path = BENCH.with_name("bench_determinism.py")
    spec = importlib.util.spec_from_file_location("bench_determinism", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = "--pair tiny --device cpu --dtype float32 --max-new-tokens 4 --batch-size 2".split()
    results = module.main([*args, "--prompts", str(prompt_file)])
    for other in ("plain-b", "instrumented"):
        assert results["plain-a", other] == {"nodes": [], "steps": [], "prompts": []}
    batch_1 = results["plain-a", "batch-1"]
    assert "token_id" not in batch_1["nodes"] and "emitted_token" not in batch_1["steps"]
    assert batch_1["prompts"] == []
    assert "plain-a against instrumented, nodes: differing columns none" in capsys.readouterr().out
