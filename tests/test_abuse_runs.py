"""Issue 25, run directories under abuse: what a run directory or config file may make specscope do.

Covers: remote code only from the command line (a shared manifest or config asking for
``trust_remote_code`` runs nothing), one writer per run (an exclusive lock; a live run is never
replaced, a dead one's failed start still is), record files never torn by two writers, records of
another run refused, ``analyze`` of a grown-then-interrupted run reading its newest committed
parts, and one-line errors (exit 2, naming the path) for a full disk, a read-only ``parts/``,
prompt ids too long to be file names, unusable manifests and fingerprint caches, and pickle
checkpoints that ``weights_only`` refuses.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specscope.cli import app
from specscope.models import PairConfig
from specscope.run.config import PromptSpec, RunConfig, load_config
from specscope.trees import TreeConfig

cli = CliRunner()
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [{"id": f"p{i}", "domain": ["code", "chat"][i % 2], "prompt": f"Question {i}: why?"}
             for i in range(3)]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def _config(tiny_dirs, prompt_file, **overrides) -> RunConfig:
    return RunConfig(
        pair=PairConfig(draft=str(tiny_dirs["qwen2", "draft"]),
                        target=str(tiny_dirs["qwen2", "target"]), dtype="float32"),
        tree=TreeConfig(policy="chain", depth=2),
        prompts=PromptSpec(file=str(prompt_file)), max_new_tokens=3, criteria=None, **overrides)


def _run_args(tiny_dirs, prompt_file, out, *extra) -> list[str]:
    return ["run", "--out", str(out), "--quiet", "--draft", str(tiny_dirs["qwen2", "draft"]),
            "--target", str(tiny_dirs["qwen2", "target"]), "--dtype", "float32",
            "--prompts", str(prompt_file), "--policy", "chain", "--depth", "2",
            "--max-new-tokens", "3", "--batch-size", "1", *extra]


# --- case 1: remote code only from the command line ---------------------------------------------


@pytest.fixture
def evil_model(tiny_dirs, tmp_path):
    """A local model whose config.json maps its classes to a Python file that, when imported,
    writes a marker file: loading it with trust_remote_code runs that file."""
    model = tmp_path / "evil-model"
    shutil.copytree(tiny_dirs["qwen2", "target"], model)
    marker = tmp_path / "MARKER"
    (model / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('code ran')\n"
        "from transformers import Qwen2Config as EvilConfig, Qwen2ForCausalLM as EvilModel\n")
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (model / "config.json").write_text(json.dumps(config))
    return model, marker


def test_a_shared_run_manifest_runs_no_model_code_in_tune(evil_model, tiny_dirs, prompt_file,
                                                         tmp_path):
    # Before: `tune RUN_DIR` took trust_remote_code from the run's manifest and imported evil.py.
    from specscope.run.study import run_study

    model, marker = evil_model
    run = tmp_path / "shared-run"
    run_study(_config(tiny_dirs, prompt_file), run, progress=False)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["pair"].update(draft=str(tiny_dirs["qwen2", "draft"]), target=str(model),
                                      trust_remote_code=True)
    (run / "manifest.json").write_text(json.dumps(manifest))
    result = cli.invoke(app, ["tune", str(run), "--context-len", "8", "--repeats", "1",
                              "--max-nodes", "2", "-o", str(tmp_path / "policy.json")])
    assert not marker.exists()
    assert result.exit_code == 0, result.output
    assert result.stderr.count("--trust-remote-code") == 1


def test_a_config_file_asking_for_remote_code_runs_none(evil_model, tiny_dirs, prompt_file,
                                                       tmp_path):
    # Before: `run --config OTHER/manifest.json` (the README's "measure more like it") took
    # trust_remote_code from the file and imported evil.py.
    model, marker = evil_model
    other = tmp_path / "other.json"
    config = _config(tiny_dirs, prompt_file).to_dict()
    config["pair"].update(target=str(model), trust_remote_code=True)
    other.write_text(json.dumps({"config": config}))
    result = cli.invoke(app, ["run", "--config", str(other), "--out", str(tmp_path / "o"),
                              "--quiet", "--batch-size", "1"])
    assert not marker.exists()
    assert result.exit_code == 0, result.output
    assert result.stderr.count("--trust-remote-code") == 1
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())[
        "config"]["pair"]["trust_remote_code"] is False


def test_remote_code_still_comes_from_the_command_line(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("[pair]\ntrust_remote_code = true\n")
    assert load_config(str(toml)).pair.trust_remote_code is False
    assert load_config(str(toml)).replace(**{"pair.trust_remote_code": True}).pair.trust_remote_code
    kept = RunConfig().replace(**{"pair.trust_remote_code": True}).replace(seed=1)
    assert kept.pair.trust_remote_code is True
