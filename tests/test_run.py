"""Runs (run/) end to end on tiny saved models: records, resume, determinism, CLI and its errors."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from conftest import HUB_COMMITS, interrupt_at_prompt, read_records, run_config, tiny_pair_args
from specscope.cli import app
from specscope.measure.checks import MeasureError
from specscope.models import PairConfig
from specscope.progress import Silent
from specscope.records import load_run
from specscope.run.config import PromptSpec, RunConfigError, load_config
from specscope.run.manifest import this_machine
from specscope.run.study import run_study

cli = CliRunner()


def write_prompt_file(path):
    lines = [
        {"id": f"p{i}", "domain": ["code", "chat"][i % 2], "prompt": f"Question number {i}: why?"}
        for i in range(6)
    ]
    lines.append({"id": "empty", "domain": "chat", "prompt": "   "})
    lines.append(
        {
            "id": "m",
            "domain": "chat",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hello there"},
            ],
        }
    )
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


@pytest.fixture
def prompt_file(tmp_path):
    return write_prompt_file(tmp_path / "prompts.jsonl")


@pytest.fixture(scope="module")
def whole_run(tiny_dirs, tmp_path_factory):
    """One whole run of the default config over the prompt file, made once for this file: the
    tests that read it, compare their own runs with it or copy it leave it as it is."""
    config = run_config(tiny_dirs, write_prompt_file(tmp_path_factory.mktemp("p") / "p.jsonl"))
    out = tmp_path_factory.mktemp("whole") / "run"
    return config, out, run_study(config, out, progress=False)


@pytest.mark.slow
def test_run_writesread_records(whole_run):
    _, out, summary = whole_run
    assert summary.prompts_measured == 7 and summary.prompts_skipped_empty == 1
    run = load_run(out)
    assert run.manifest["status"] == "complete"
    assert run.manifest["prompts"]["skipped_empty"] == ["empty"]
    assert run.manifest["tree"]["nodes_per_depth"] == [2, 4, 2]
    assert set(run.prompts.prompt_id) == {"p0", "p1", "p2", "p3", "p4", "p5", "m"}
    # The paper tree gives 2/4/2 nodes per depth at every step.
    per_step = run.nodes.groupby(["prompt_id", "step", "depth"]).size().unstack()
    assert (per_step[1] == 2).all() and (per_step[2] == 4).all() and (per_step[3] == 2).all()
    assert (run.steps.tau == run.steps.accepted_len + 1).all()
    assert run.steps.groupby("prompt_id").size().max() <= 12
    # The recorded output is the emitted tokens, and the chat template was applied.
    first = run.prompts.set_index("prompt_id").loc["m"]
    steps = run.steps[run.steps.prompt_id == "m"].sort_values("step")
    assert list(first.output_token_ids) == steps.emitted_token.tolist()
    assert first.prompt_text.startswith("<|im_start|>system\nBe brief.")
    # Each step keeps its root context's margin and KL: node 0's (a root) in the node records.
    roots = run.nodes[run.nodes.node_id == 0].set_index(["prompt_id", "step"])
    by_step = run.steps.set_index(["prompt_id", "step"]).loc[roots.index]
    assert (by_step.target_margin == roots.target_margin).all()
    assert (by_step.kl_target_draft == roots.kl_target_draft).all()
    assert run.manifest["config"]["rendering"] == "task"


@pytest.mark.slow
def test_same_config_gives_identicalread_records(whole_run, tmp_path):
    config, whole, _ = whole_run
    run_study(config, tmp_path / "b", progress=False)
    for x, y in zip(read_records(whole), read_records(tmp_path / "b")):
        pd.testing.assert_frame_equal(x, y)


@pytest.mark.slow
def test_cached_and_naive_runs_agree(tiny_dirs, prompt_file, tmp_path):
    run_study(run_config(tiny_dirs, prompt_file, "llama"), tmp_path / "c", progress=False)
    run_study(
        run_config(tiny_dirs, prompt_file, "llama", engine="naive"), tmp_path / "n", progress=False
    )
    (nc, sc, pc), (nn, sn, pn) = read_records(tmp_path / "c"), read_records(tmp_path / "n")
    floats = [
        "p_draft",
        "p_target",
        "alpha",
        "target_entropy",
        "draft_entropy",
        "target_top1_prob",
        "target_margin",
        "kl_target_draft",
    ]
    pd.testing.assert_frame_equal(
        nc.drop(columns=floats + ["run_id"]), nn.drop(columns=floats + ["run_id"])
    )
    for col in floats:
        assert (nc[col] - nn[col]).abs().max() <= 1e-5, col
    step_floats = ["target_margin", "kl_target_draft"]
    pd.testing.assert_frame_equal(
        sc.drop(columns=step_floats + ["run_id"]), sn.drop(columns=step_floats + ["run_id"])
    )
    for col in step_floats:
        assert (sc[col] - sn[col]).abs().max() <= 1e-5, col
    pd.testing.assert_frame_equal(pc.drop(columns="run_id"), pn.drop(columns="run_id"))


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_sameread_records(whole_run, tmp_path, monkeypatch):
    config, whole, _ = whole_run
    restore = interrupt_at_prompt(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        run_study(config, tmp_path / "cut", progress=False)
    partial = load_run(tmp_path / "cut")
    assert partial.manifest["status"] == "running" and len(partial.prompts) == 2
    restore()
    summary = run_study(config, tmp_path / "cut", progress=False)
    assert summary.prompts_measured == 5
    for x, y in zip(read_records(whole), read_records(tmp_path / "cut")):
        pd.testing.assert_frame_equal(x, y)
    again = run_study(config, tmp_path / "cut", progress=False)
    assert again.already_complete and again.prompts_measured == 0


class Notes(Silent):
    def __init__(self):
        self.notes = []

    def note(self, message, level="info"):
        self.notes.append((level, message))


def test_manifest_names_the_machines_that_measured(tiny_dirs, prompt_file, tmp_path, monkeypatch):
    """A run records this machine; resumed on another (its manifest edited to say so), it keeps
    both and warns that rounding can differ between them."""
    config = run_config(tiny_dirs, prompt_file)
    restore = interrupt_at_prompt(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        run_study(config, tmp_path / "run", progress=False)
    manifest_path = tmp_path / "run" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["machines"] == [this_machine()]
    elsewhere = {**this_machine(), "cpu": "another CPU", "features": ["AVX2"]}
    manifest["machines"] = [elsewhere]
    manifest_path.write_text(json.dumps(manifest))
    restore()
    notes = Notes()
    run_study(config, tmp_path / "run", progress=notes)
    assert load_run(tmp_path / "run").manifest["machines"] == [elsewhere, this_machine()]
    warnings = [m for level, m in notes.notes if level == "warning" and "another machine" in m]
    assert len(warnings) == 1 and "2 in manifest.json's machines" in warnings[0]


@pytest.mark.slow
def test_killed_process_resumes(tiny_dirs, prompt_file, tmp_path):
    """SIGKILL a real ``specscope run`` after its first committed prompts, then resume it."""
    out = tmp_path / "killed"
    args = [
        sys.executable,
        "-m",
        "specscope.cli",
        "run",
        "--out",
        str(out),
        "--quiet",
        *tiny_pair_args(tiny_dirs),
        "--prompts",
        str(prompt_file),
        "--max-new-tokens",
        "32",
        "--max-prompt-tokens",
        "64",
        "--batch-size",
        "2",
    ]  # the default batch holds all 7 prompts: they would commit at once; a batch of 2 prompts
    # x 32 tokens takes seconds, against the 50 ms this test polls at (120 tokens took 4 minutes)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = out / "parts" / "prompts"
    deadline = time.time() + 600
    while time.time() < deadline and not (parts.is_dir() and any(parts.glob("*.parquet"))):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    committed = len(list(parts.glob("*.parquet")))
    assert 1 <= committed < 7
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"measured {7 - committed} prompt(s)" in done.stdout
    run = load_run(out)
    assert len(run.prompts) == 7 and run.prompts.prompt_id.is_unique
    assert not run.nodes.duplicated(["prompt_id", "step", "node_id"]).any()


@pytest.mark.slow
def test_other_config_in_out_dir_is_refused(whole_run, tmp_path):
    config, whole, _ = whole_run
    shutil.copytree(whole, tmp_path / "r")  # a finished run of config, made once (whole_run)
    with pytest.raises(RunConfigError, match="differs in: max_new_tokens"):
        run_study(config.replace(max_new_tokens=3), tmp_path / "r", progress=False)
    summary = run_study(
        config.replace(max_new_tokens=3),
        tmp_path / "r",
        overwrite=True,
        progress=False,
    )
    assert summary.prompts_measured == 7


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 2])
def test_prompts_past_the_models_positions_are_refused_before_anything_is_written(
    tiny_dirs, prompt_file, tmp_path, batch_size
):
    # The tiny models allow 1024 positions. Batched passes would otherwise run past them
    # silently (RoPE extrapolates), and one prompt at a time would fail after the manifest.
    long_file = tmp_path / "long.jsonl"
    long_file.write_text(
        prompt_file.read_text()
        + json.dumps({"id": "long", "domain": "chat", "prompt": "x" * 1000})
        + "\n"
    )
    long = run_config(tiny_dirs, long_file, max_prompt_tokens=2000)
    message = (
        r"prompt 'long' is 10\d\d tokens; with max_new_tokens 12 and the tree's depth 3 it "
        r"needs 10\d\d positions, but the models allow 1024: lower --max-prompt-tokens to "
        r"1009 or fewer"
    )
    with pytest.raises(MeasureError, match=message):
        run_study(long, tmp_path / "new", progress=False, batch_size=batch_size)
    assert not (tmp_path / "new").exists()

    # --overwrite of an earlier run keeps that run when the new one is refused
    run_study(run_config(tiny_dirs, prompt_file), tmp_path / "old", progress=False)
    before = read_records(tmp_path / "old")
    with pytest.raises(MeasureError, match=message):
        run_study(long, tmp_path / "old", overwrite=True, progress=False, batch_size=batch_size)
    for x, y in zip(before, read_records(tmp_path / "old")):
        pd.testing.assert_frame_equal(x, y)

    # truncating prompts to what the message names is accepted
    fits = run_study(
        long.replace(max_prompt_tokens=1009),
        tmp_path / "fits",
        progress=False,
        batch_size=batch_size,
    )
    assert fits.prompts_measured == 8


def test_cli_run_end_to_end(tiny_dirs, prompt_file, tmp_path):
    out = tmp_path / "cli"
    args = [
        "run",
        "--out",
        str(out),
        *tiny_pair_args(tiny_dirs, "llama"),
        "--prompts",
        str(prompt_file),
        "--max-new-tokens",
        "5",
        "--policy",
        "chain",
        "--depth",
        "3",
        "--quiet",
    ]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "measured 7 prompt(s)" in result.output
    run = load_run(out)
    assert set(run.nodes.depth) == {1, 2, 3} and run.manifest["config"]["tree"]["policy"] == "chain"
    again = cli.invoke(app, args)
    assert again.exit_code == 0 and "already complete" in again.output


def test_cli_config_file_and_overrides(tiny_dirs, prompt_file, tmp_path):
    toml = tmp_path / "cfg.toml"
    toml.write_text(
        f'max_new_tokens = 3\n[pair]\ndraft = "{tiny_dirs["qwen2", "draft"]}"\n'
        f'target = "{tiny_dirs["qwen2", "target"]}"\ndtype = "float32"\n'
        f'[tree]\npolicy = "static"\npaths = "[(0,), (0, 0), (0, 1)]"\n'
        f'[prompts]\nfile = "{prompt_file}"\n'
    )
    result = cli.invoke(
        app,
        ["run", "-c", str(toml), "--out", str(tmp_path / "o"), "--max-new-tokens", "2", "--quiet"],
    )
    assert result.exit_code == 0, result.output
    run = load_run(tmp_path / "o")
    assert run.steps.groupby("prompt_id").size().max() == 2
    assert run.nodes.groupby(["prompt_id", "step"]).size().eq(3).all()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--policy", "beam"],
            "unknown tree policy 'beam'; choose one of paper, paper-text, chain, static",
        ),
        (["--measure-engine", "turbo"], "unknown engine 'turbo'; choose one of cached, naive"),
        (["--depth", "0"], "tree depth must be >= 1"),
        (
            ["--max-nodes", "1", "--top-k", "3"],
            "max_nodes (1) is smaller than the number of roots (2)",
        ),
        (["--dtype", "int3"], "unknown dtype 'int3'"),
        (["--prompts", "/nonexistent.jsonl"], "prompt file /nonexistent.jsonl does not exist"),
        (
            ["--draft", "./no/such/dir"],
            "./no/such/dir is neither a model directory nor a .gguf file",
        ),
        (
            ["--target-revision", "v2"],
            "is a local directory: a revision (v2) applies only to a Hugging Face hub id",
        ),
        (["--draft-revision", ""], "draft_revision is empty"),
    ],
)
def test_cli_bad_input_gets_one_line_errors(tiny_dirs, prompt_file, tmp_path, args, message):
    base = [
        "run",
        "--out",
        str(tmp_path / "x"),
        "--draft",
        str(tiny_dirs["qwen2", "draft"]),
        "--target",
        str(tiny_dirs["qwen2", "target"]),
        "--prompts",
        str(prompt_file),
    ]
    result = cli.invoke(app, base + args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_cli_run_of_hub_ids_at_revisions_records_them(local_hub, prompt_file, tmp_path):
    # the draft at the hub's default branch, the target at tag v2 (conftest's local hub)
    models = ["--draft", local_hub, "--target", local_hub, "--target-revision", "v2"]
    out = tmp_path / "run"
    run = ["run", "--dtype", "float32", "--prompts", str(prompt_file), "--out", str(out)]
    small = ["--policy", "chain", "--depth", "2", "--max-new-tokens", "2", "--quiet"]
    result = cli.invoke(app, [*run, *models, *small])
    assert result.exit_code == 0, result.output
    manifest = load_run(out).manifest
    pair = manifest["config"]["pair"]
    assert (pair["draft_revision"], pair["target_revision"]) == (None, "v2")
    models = manifest["models"]
    assert (models["draft"]["revision"], models["draft"]["commit"]) == (None, HUB_COMMITS["main"])
    assert (models["target"]["revision"], models["target"]["commit"]) == ("v2", HUB_COMMITS["v2"])
    assert manifest["run_id"] == load_config(str(out / "manifest.json")).run_id


# the shipped runs (results/demo-pair), but drafters/ngram: its id changed before revisions, when
# DrafterConfig gained ngram_size
SHIPPED_RUNS = (
    "paper-protocol",
    "deep-tree",
    "drafters/draft-model",
    "drafters-bf16-full/draft-model",
    "drafters-bf16-full/ngram",
)


@pytest.mark.parametrize("run", SHIPPED_RUNS)
def test_shipped_runs_keep_their_ids(run):
    manifest = Path(__file__).parents[1] / "results" / "demo-pair" / run / "manifest.json"
    assert load_config(str(manifest)).run_id == json.loads(manifest.read_text())["run_id"]


def test_a_revision_is_part_of_a_runs_id_and_a_config_files_pair(tmp_path):
    toml = tmp_path / "cfg.toml"
    toml.write_text('[pair]\ntarget = "org/tiny"\ntarget_revision = "v2"\ndtype = "float32"\n')
    at_v2 = load_config(str(toml))
    assert (at_v2.pair.draft_revision, at_v2.pair.target_revision) == (None, "v2")
    at_main = at_v2.replace(**{"pair.target_revision": "main"})
    unpinned = dataclasses.replace(at_v2, pair=PairConfig(target="org/tiny", dtype="float32"))
    assert len({c.run_id for c in (at_v2, at_main, unpinned)}) == 3
    toml.write_text("[pair]\ntarget_revision = 2\n")
    with pytest.raises(RunConfigError, match="target_revision"):
        load_config(str(toml))


def test_malformed_prompt_file_names_the_line(tiny_dirs, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "domain": "code", "prompt": "x"}\n{"id": "b", "domain": \n')
    result = cli.invoke(
        app,
        [
            "run",
            "--out",
            str(tmp_path / "x"),
            "--prompts",
            str(bad),
            "--draft",
            str(tiny_dirs["qwen2", "draft"]),
            "--target",
            str(tiny_dirs["qwen2", "target"]),
        ],
    )
    assert result.exit_code == 2 and f"{bad}:2: not valid JSON" in result.output


def test_every_command_has_help():
    result = cli.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in app.registered_commands:
        name = command.name or command.callback.__name__
        sub = cli.invoke(app, [name, "--help"])
        assert sub.exit_code == 0 and len(sub.output) > 100, name
        assert command.callback.__doc__, f"{name} has no help text"


def test_prompt_file_sampled_per_domain(prompt_file):
    spec = PromptSpec(file=str(prompt_file), per_domain=2)
    picked = spec.select(seed=42)
    assert sorted(p.domain for p in picked) == ["chat", "chat", "code", "code"]
    assert [p.id for p in picked] == [p.id for p in spec.select(seed=42)]


def test_a_run_manifest_is_a_config(tiny_dirs, prompt_file, tmp_path):
    # analyze's small-sample warning tells users to measure more with --config RUN/manifest.json
    config = run_config(tiny_dirs, prompt_file).replace(max_new_tokens=2)
    run_study(config, tmp_path / "r", progress=False)
    again = load_config(str(tmp_path / "r" / "manifest.json"))
    assert again == config and again.run_id == config.run_id
    bad = tmp_path / "not-a-manifest.json"
    bad.write_text("[1, 2]")
    with pytest.raises(RunConfigError, match="not a run manifest"):
        load_config(str(bad))
