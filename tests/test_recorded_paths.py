"""Issue 61, no absolute path of the machine that made a file in it: a file in specscope's cache is
recorded as ``$SPECSCOPE_CACHE/...``, one in the home directory as ``~/...`` (run manifests,
llama-server policies and benches, cost grids), and read back on any machine; the shipped results
hold none."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import small_run_config
from specscope.cache import cache_dir, local_path, recorded_path

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home directory of its own, with specscope's cache where it is by default."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("SPECSCOPE_CACHE", str(home / ".cache" / "specscope"))
    return home


def test_the_cache_and_home_are_recorded_by_name_and_read_back(home):
    gguf = cache_dir() / "gguf" / "t.gguf"
    assert recorded_path(gguf) == "$SPECSCOPE_CACHE/gguf/t.gguf"  # the cache before home
    assert recorded_path(home / "models" / "d") == "~/models/d"
    assert recorded_path(cache_dir()) == "$SPECSCOPE_CACHE"
    for given in ("/data/models/d", "runs/demo", "demo:draft"):  # any other path as given
        assert recorded_path(given) == given
    for path in (gguf, home / "models" / "d", Path("/data/models/d"), Path("runs/demo")):
        assert local_path(recorded_path(path)) == path
    assert local_path("/data/x.gguf") == Path("/data/x.gguf")  # a file written before: as it is


def test_a_fresh_run_manifest_names_no_absolute_path_of_the_cache_or_home(
    home, tiny_dirs, prompt_file, tmp_path
):
    from specscope.run.study import run_study

    draft, target = cache_dir() / "demo" / "draft", home / "models" / "target"
    shutil.copytree(tiny_dirs["qwen2", "draft"], draft)
    shutil.copytree(tiny_dirs["qwen2", "target"], target)
    config = small_run_config(tiny_dirs, prompt_file).replace(
        **{"pair.draft": "~/.cache/specscope/demo/draft", "pair.target": "~/models/target"}
    )
    run_study(config, tmp_path / "run", progress=False)
    text = (tmp_path / "run" / "manifest.json").read_text()
    assert str(home) not in text and str(cache_dir()) not in text
    models = json.loads(text)["models"]
    assert models["draft"]["resolved"] == "$SPECSCOPE_CACHE/demo/draft"
    assert models["target"]["resolved"] == "~/models/target"


def test_a_llama_server_policy_names_its_gguf_files_portably_and_exports_them_here(home):
    from specscope.serving.export import ExportOptions, export_policy
    from specscope.serving.llamacpp.server import ServerSetting
    from specscope.serving.llamacpp.study import server_entry
    from specscope.trees import TreeShape
    from specscope.tune.policy import PolicyFile

    target, draft = cache_dir() / "gguf" / "t.gguf", home / "models" / "d.gguf"
    chain = server_entry("draft-simple:k=2", ServerSetting(poll=0).with_k(2), target, draft)
    plain = server_entry("plain", ServerSetting(poll=0), target, draft)
    assert (chain["target_gguf"], chain["draft_gguf"]) == (
        "$SPECSCOPE_CACHE/gguf/t.gguf",
        "~/models/d.gguf",
    )
    info = {"llama_server": {"domains": {"code": chain}, "fallback": plain}}
    policy = PolicyFile({"code": TreeShape.chain(2)}, info=info)
    flags = export_policy(policy, "llama.cpp", ExportOptions())["domains"]["code"]["flags"]
    assert (flags["--model"], flags["--spec-draft-model"]) == (str(target), str(draft))


def test_a_cost_grid_names_its_programs_and_models_portably(home, monkeypatch):
    from specscope.serving.llamacpp import costs
    from specscope.serving.llamacpp.programs import BenchGrid, LlamaTools

    monkeypatch.setattr(costs, "run_llama_bench", lambda tools, path, grid: [])
    monkeypatch.setattr(costs, "curves_from_bench", lambda rows, role, quant: [])
    tools = LlamaTools(cache_dir() / "llama.cpp" / "build" / "bin", "0.3.36")
    gguf = cache_dir() / "gguf"
    grid = costs.measure_cost_grid(
        tools, {"Q4_K_M": gguf / "t.gguf"}, {"Q4_K_M": gguf / "d.gguf"}, BenchGrid(), BenchGrid()
    )
    assert grid.info["bin_dir"] == "$SPECSCOPE_CACHE/llama.cpp/build/bin"
    assert grid.info["models"] == {
        "target Q4_K_M": "$SPECSCOPE_CACHE/gguf/t.gguf",
        "draft Q4_K_M": "$SPECSCOPE_CACHE/gguf/d.gguf",
    }


# A directory of a machine, not of the project: a home, the root's home, a checkout elsewhere.
MACHINE_PATH = re.compile(r"(?<![\w.~$])/(?:root|home|Users|work|srv)/")
SHIPPED = (".json", ".jsonl", ".md", ".toml", ".csv", ".html", ".ini")


def test_the_shipped_results_name_no_directory_of_the_machine_that_made_them():
    files = [
        path
        for folder in (ROOT / "results", ROOT / "docs")
        for path in folder.rglob("*")
        if path.suffix in SHIPPED and path.is_file()
    ]
    assert files
    found = [f"{p.relative_to(ROOT)}" for p in files if MACHINE_PATH.search(p.read_text())]
    assert not found, found
