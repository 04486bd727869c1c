"""Sweeps on tiny saved models: grid expansion, local and Ray executors, retries, resume, CLI."""

import json
import os
import signal
import sys
import threading
import time

import pandas as pd
import pyarrow.fs as pafs
import pytest
from typer.testing import CliRunner

from conftest import read_records
from specscope.cli import app
from specscope.measure import study as measure_study
from specscope.models import PairConfig
from specscope.records import RunDir, load_run, to_table
from specscope.run.config import RunConfig
from specscope.run.manifest import this_machine
from specscope.run.study import run_study
from specscope.sweep import (
    Execution,
    SweepError,
    executors,
    parse_sweep,
    run_sweep,
    sweep_run_dirs,
)
from specscope.sweep.executors import gpus_needed, visible_devices

cli = CliRunner()
ONE_THREAD = Execution(prompts_per_shard=2, threads=1)  # same torch threads: identical floats


def _prompts(folder, domain: str, n: int):
    path = folder / f"{domain}.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"{domain}{i}",
                    "domain": domain,
                    "prompt": f"A {domain} question, number {i}?",
                }
            )
            + "\n"
            for i in range(n)
        )
    )
    return path


def _spec(tiny_dirs, folder, domains=("code", "chat"), prompts=3, max_new_tokens=8, trees=None):
    """2 trees x 2 domains (JSONL files with domains) on the tiny qwen2 pair."""
    return parse_sweep(
        {
            "name": "tiny",
            "defaults": {
                "max_new_tokens": max_new_tokens,
                "pair": {
                    "draft": str(tiny_dirs["qwen2", "draft"]),
                    "target": str(tiny_dirs["qwen2", "target"]),
                    "dtype": "float32",
                },
            },
            "trees": trees
            or [{"name": "paper", "policy": "paper"}, {"policy": "chain", "depth": 3}],
            "domains": [{"name": d, "file": str(_prompts(folder, d, prompts))} for d in domains],
        }
    )


def _assert_same_sweeps(a, b):
    runs_a, runs_b = sweep_run_dirs(a), sweep_run_dirs(b)
    assert [d.name for d in runs_a] == [d.name for d in runs_b]
    for x_dir, y_dir in zip(runs_a, runs_b):
        assert load_run(y_dir).manifest["status"] == "complete"
        for x, y in zip(read_records(x_dir), read_records(y_dir)):
            pd.testing.assert_frame_equal(x, y)


@pytest.fixture(scope="module")
def local_sweep(tiny_dirs, tmp_path_factory):
    """The reference: the 2 x 2 sweep run with the local executor."""
    folder = tmp_path_factory.mktemp("local-sweep")
    spec = _spec(tiny_dirs, folder)
    summary = run_sweep(spec, folder / "out", execution=ONE_THREAD, progress=False)
    return spec, folder / "out", summary


# --- the grid ------------------------------------------------------------------------------------


def test_grid_expansion(tmp_path):
    spec = parse_sweep(
        {
            "defaults": {"max_new_tokens": 4, "prompts": {"per_domain": 3}},
            "pairs": [
                {"name": "small", "draft": "a", "target": "b"},
                {"name": "big", "draft": "a", "target": "c", "dtype": "float32"},
            ],
            "trees": ["paper", {"policy": "chain", "depth": [2, 4]}],
            "domains": ["code", {"name": "mine", "file": "my.jsonl"}],
            "decode": {"rendering": ["task", "raw"], "max_prompt_tokens": 256},
        }
    )
    points = spec.points()
    assert len(points) == 2 * 3 * 2 * 2
    assert points[0].label == "small.paper.code.rendering=task"
    assert [p.label for p in points if p.label.startswith("big.chain-depth4.mine")] == [
        "big.chain-depth4.mine.rendering=task",
        "big.chain-depth4.mine.rendering=raw",
    ]
    last = points[-1].config
    assert (last.pair.target, last.pair.dtype, last.tree.policy, last.tree.depth) == (
        "c",
        "float32",
        "chain",
        4,
    )
    # a prompt set replaces the base's prompts but keeps per_domain; decode settings apply to all
    assert (last.prompts.file, last.prompts.domains, last.prompts.per_domain) == ("my.jsonl", (), 3)
    assert points[0].config.prompts.domains == ("code",) and points[0].config.prompts.file is None
    assert (last.rendering, last.max_prompt_tokens, last.max_new_tokens) == ("raw", 256, 4)
    assert dict(points[0].axes) == {
        "pair": "small",
        "tree": "paper",
        "domain": "code",
        "decode": "rendering=task",
    }
    assert len({p.config.run_id for p in points}) == len(points)
    assert spec.sweep_id == parse_sweep(spec.source).sweep_id


@pytest.mark.parametrize(
    "data, message",
    [
        ({"trees": [{"policy": "beam"}]}, "unknown tree policy 'beam'"),
        ({"trees": [{"policy": "paper", "width": 2}]}, "trees[0]: unknown keys ['width']"),
        ({"trees": ["paper", {"policy": "paper"}]}, "two entries are both named 'paper'"),
        ({"decode": {"speed": [1, 2]}}, "[decode]: unknown setting 'speed'"),
        ({"defaults": {"max_new_token": 3}}, "unknown key 'max_new_token'"),
        ({"execution": {"prompts_per_shard": 0}}, "prompts_per_shard must be >= 1"),
        ({"execution": {"batch_size": 0}}, "batch_size must be >= 1, got 0"),
        ({"execution": {"batch_size": "8"}}, "execution.batch_size must be an integer or none"),
        ({"grid": {}}, "unknown key 'grid'; allowed: base, decode, defaults, domains, drafters"),
        ({"trees": "paper"}, "trees must be a list or none, got 'paper'"),
        ({"trees": [3]}, "trees[0] must be a string or a table (an object), got 3"),
    ],
)
def test_bad_sweep_files_get_clear_errors(data, message):
    with pytest.raises(SweepError) as e:
        parse_sweep(data)
    assert message in str(e.value)


def test_run_and_sweep_measure_one_config_through_the_same_code(tiny_dirs, tmp_path):
    """A grid point measured by ``sweep`` at batch size 3 and by ``run`` at batch size 3 (same
    torch threads): the same records, bit for bit; a naive grid point cannot batch."""
    spec = _spec(
        tiny_dirs, tmp_path, domains=("code",), trees=[{"name": "paper", "policy": "paper"}]
    )
    execution = Execution(prompts_per_shard=8, threads=1, batch_size=3)
    run_sweep(spec, tmp_path / "sweep", execution=execution, progress=False)
    with executors.torch_threads(1):
        run_study(spec.points()[0].config, tmp_path / "run", progress=False, batch_size=3)
    for x, y in zip(
        read_records(sweep_run_dirs(tmp_path / "sweep")[0]), read_records(tmp_path / "run")
    ):
        pd.testing.assert_frame_equal(x, y)
    naive = parse_sweep({**spec.source, "defaults": {**spec.source["defaults"], "engine": "naive"}})
    with pytest.raises(
        SweepError, match="grid point paper.code: --batch-size 3 needs the cached engine"
    ):
        run_sweep(naive, tmp_path / "naive", execution=execution, progress=False)


def test_gpu_resources_and_device_renumbering():
    assert gpus_needed(PairConfig(device="cpu")) == 0
    assert gpus_needed(PairConfig(device="cuda")) == 1
    assert gpus_needed(PairConfig(device="cuda:1", draft_device="cuda:3")) == 2
    seen = visible_devices(PairConfig(device="cuda:1", draft_device="cuda:3"))
    assert (seen.device, seen.draft_device) == ("cuda:0", "cuda:1")
    assert visible_devices(PairConfig(device="cpu")) == PairConfig(device="cpu")


# --- records through a pyarrow filesystem --------------------------------------------------------


def test_run_writer_on_an_object_store():
    """On a store without atomic renames the files are written in place, the prompt shard last."""
    fs, _ = pafs.FileSystem.from_uri("mock:///")
    writer = RunDir("bucket/run", filesystem=fs)
    assert not writer.done_prompt_ids()
    for order, pid in enumerate(["a", "b"]):
        writer.commit_prompt(
            order,
            pid,
            to_table([], "nodes"),
            to_table([], "steps"),
            to_table(
                {
                    "run_id": ["r"],
                    "prompt_id": [pid],
                    "domain": ["code"],
                    "order": [order],
                    "source": ["s"],
                    "source_index": [0],
                    "dataset": [""],
                    "split": [""],
                    "messages_json": ["[]"],
                    "prompt_text": ["x"],
                    "prompt_tokens": [1],
                    "truncated": [False],
                    "generated_tokens": [0],
                    "output_token_ids": [[]],
                    "output_text": [""],
                    "stop_reason": ["eos"],
                    "time_s": [0.0],
                },
                "prompts",
            ),
        )
    assert writer.done_prompt_ids() == {"a", "b"}
    names = [i.base_name for i in fs.get_file_info(pafs.FileSelector("bucket", recursive=True))]
    assert not any(n.endswith(".tmp") for n in names)
    writer.write_manifest({"run_id": "r"})
    assert writer.read_manifest() == {"run_id": "r"}
    assert writer.consolidate()["prompts"] == 2


# --- local executor ------------------------------------------------------------------------------


def test_local_sweep_writes_a_run_per_grid_point(local_sweep):
    _, out, summary = local_sweep
    assert summary.complete and summary.points == 4 and summary.shards_total == 8
    assert summary.prompts_measured == 12
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["status"] == "complete" and len(manifest["points"]) == 4
    runs = sweep_run_dirs(out)
    assert [d.name for d in runs] == ["paper.code", "paper.chat", "chain.code", "chain.chat"]
    run = load_run(runs[3])
    assert run.manifest["sweep"]["axes"] == {"tree": "chain", "domain": "chat"}
    assert run.manifest["models"]["target"]["architecture"] == "Qwen2ForCausalLM"
    assert run.manifest["machines"] == [this_machine()]  # the worker's, reported with its shard
    assert set(run.prompts.domain) == {"chat"} and set(run.nodes.depth) == {1, 2, 3}


def test_a_sweep_over_drafters_measures_each_on_the_same_prompts(tiny_dirs, tmp_path):
    spec = parse_sweep(
        {
            **_spec(tiny_dirs, tmp_path, domains=("code",), prompts=2, max_new_tokens=4).source,
            "trees": [{"policy": "chain", "depth": 2}],
            "drafters": [
                "draft-model",
                {"name": "lookup", "kind": "ngram", "prompt_lookup_min": [1, 2]},
                {"kind": "early-exit", "exit_layer": 1},
            ],
        }
    )
    assert [p.label for p in spec.points()] == [
        "draft-model.chain.code",
        "lookup-prompt_lookup_min1.chain.code",
        "lookup-prompt_lookup_min2.chain.code",
        "early-exit.chain.code",
    ]
    run_sweep(spec, tmp_path / "out", execution=ONE_THREAD, progress=False)
    runs = sweep_run_dirs(tmp_path / "out")
    labels = [set(load_run(d).nodes.drafter) | set(load_run(d).steps.drafter) for d in runs]
    assert labels == [
        {"draft-model"},
        {"ngram(prompt_lookup_min=1, prompt_lookup_max=1)"},
        {"ngram(prompt_lookup_min=2, prompt_lookup_max=2)"},
        {"early-exit(exit_layer=1)"},
    ]
    prompts = [sorted(load_run(d).prompts.prompt_id) for d in runs]
    assert all(p == prompts[0] for p in prompts)
    with pytest.raises(SweepError, match="prompt_lookup_max is a parameter of the ngram"):
        parse_sweep({"drafters": [{"kind": "draft-model", "prompt_lookup_max": 3}]})


def test_interrupted_sweep_resumes_without_redoing_finished_shards(
    local_sweep, tiny_dirs, tmp_path, monkeypatch
):
    spec, reference, _ = local_sweep
    real = measure_study.finish_prompt
    calls = {"n": 0}

    def dies_on_sixth(*args, **kwargs):  # as the sixth prompt finishes
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(measure_study, "finish_prompt", dies_on_sixth)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path / "cut", execution=ONE_THREAD, progress=False)
    assert json.loads((tmp_path / "cut" / "sweep.json").read_text())["status"] == "running"
    # 5 prompts committed: paper.code (2 shards, 3 prompts) and paper.chat's first shard
    calls["n"] = 100
    summary = run_sweep(spec, tmp_path / "cut", execution=ONE_THREAD, progress=False)
    assert calls["n"] - 100 == 7 and summary.prompts_measured == 7
    assert (summary.shards_skipped, summary.shards_run) == (3, 5) and summary.complete
    _assert_same_sweeps(reference, tmp_path / "cut")
    again = run_sweep(spec, tmp_path / "cut", execution=ONE_THREAD, progress=False)
    assert again.shards_run == 0 and again.prompts_measured == 0 and calls["n"] - 100 == 7


def test_a_sweep_dir_with_another_grid_is_refused(local_sweep, tiny_dirs, tmp_path):
    _, out, _ = local_sweep
    other = _spec(tiny_dirs, tmp_path, max_new_tokens=3)
    with pytest.raises(SweepError, match="had another config"):
        run_sweep(other, out, progress=False)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("x")
    with pytest.raises(SweepError, match="not a specscope sweep"):
        run_sweep(other, tmp_path / "junk", progress=False)


# --- CLI -----------------------------------------------------------------------------------------


def test_cli_sweep_compare_and_report(tiny_dirs, tmp_path):
    code = _prompts(tmp_path, "code", 2)
    chat = _prompts(tmp_path, "chat", 2)
    toml = tmp_path / "SWEEP.toml"
    toml.write_text(f'''name = "cli"
[defaults]
max_new_tokens = 4
[defaults.pair]
draft = "{tiny_dirs["llama", "draft"]}"
target = "{tiny_dirs["llama", "target"]}"
dtype = "float32"
[[trees]]
policy = "chain"
depth = [1, 2]
[[domains]]
name = "code"
file = "{code}"
[[domains]]
name = "chat"
file = "{chat}"
[execution]
prompts_per_shard = 1
''')
    out = tmp_path / "sweep"
    plan = cli.invoke(app, ["sweep", str(toml), "--dry-run"])
    assert plan.exit_code == 0 and "4 grid point(s)" in plan.output
    assert "chain-depth2.chat" in plan.output
    result = cli.invoke(app, ["sweep", str(toml), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "4/4 runs complete; ran 8 of 8 shard(s)" in result.output
    again = cli.invoke(app, ["sweep", str(toml), "--out", str(out), "--quiet"])
    assert again.exit_code == 0 and "already complete" in again.output
    compared = cli.invoke(app, ["compare", str(out), "--boot", "10", "--out", str(tmp_path / "c")])
    assert compared.exit_code == 0, compared.output
    assert "Runs side by side" in compared.output
    summary = (tmp_path / "c" / "csv" / "summary.csv").read_text().splitlines()
    assert len(summary) == 1 + 4 and summary[0].startswith("tree,domain,Run id")
    assert summary[1].startswith("chain-depth1,code,")
    reported = cli.invoke(app, ["report", str(out), "--boot", "10", "--no-plots"])
    assert reported.exit_code == 0, reported.output
    page = (out / "report.html").read_text()
    assert 'id="c0-summary"' in page and page.count('<section id="run-') == 4


def test_cli_sweep_errors(tiny_dirs, tmp_path, monkeypatch):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[trees]]\npolicy = "beam"\n')
    result = cli.invoke(app, ["sweep", str(bad)])
    assert result.exit_code == 2 and "unknown tree policy 'beam'" in result.output
    assert "Traceback" not in result.output
    good = tmp_path / "good.toml"
    good.write_text('[[trees]]\npolicy = "paper"\n')
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    result = cli.invoke(
        app, ["sweep", str(good), "--executor", "ray", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "pip install 'specscope[ray]'" in result.output
    result = cli.invoke(
        app, ["sweep", str(good), "--executor", "slurm", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "unknown executor 'slurm'" in result.output


# --- Ray executor --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_sweep_gives_the_localread_records(ray_cluster, local_sweep, tmp_path):
    spec, reference, _ = local_sweep
    out = tmp_path / "ray"
    summary = run_sweep(
        spec, f"file://{out}", executor="ray", execution=ONE_THREAD, progress=False
    )  # through a URI, as workers on other machines would
    assert summary.complete and summary.shards_run == 8 and summary.prompts_measured == 12
    _assert_same_sweeps(reference, out)
    workers = {json.loads(f.read_text())["pid"] for f in (out / "shards").glob("*.json")}
    assert os.getpid() not in workers


def test_ray_shard_resources(ray_cluster):
    executor = executors.RayExecutor(Execution(gpus_per_shard=0.5))
    cpu = executors.Shard("a/0", "a", "/x", "/y", RunConfig(), (), 1)
    gpu = executors.Shard(
        "a/0", "a", "/x", "/y", RunConfig().replace(**{"pair.device": "cuda:0"}), (), 1
    )
    assert executor.resources(cpu) == {"num_cpus": 1.0}
    assert executor.resources(gpu) == {"num_cpus": 1.0, "num_gpus": 0.5}


@pytest.mark.slow
def test_killed_worker_is_retried_without_duplicates(ray_cluster, tiny_dirs, tmp_path):
    """SIGKILL the worker of a shard after its first committed prompt: Ray reruns the shard."""
    # Long prompts (96 tokens each) leave time to kill the worker before it finishes, even under load.
    spec = _spec(
        tiny_dirs,
        tmp_path,
        domains=("code",),
        prompts=8,
        max_new_tokens=96,
        trees=[{"policy": "paper"}],
    )
    execution = Execution(prompts_per_shard=8, threads=1, max_retries=2)
    out = tmp_path / "ray"
    done: dict = {}

    def drive():
        try:
            done["summary"] = run_sweep(
                spec, out, executor="ray", execution=execution, progress=False
            )
        except BaseException as e:  # reported by the assertions below
            done["error"] = e

    driver = threading.Thread(target=drive)
    driver.start()
    status = out / "shards" / "paper.code.0000.json"
    committed = out / "runs" / "paper.code" / "parts" / "prompts"
    deadline = time.time() + 180
    while time.time() < deadline and not (committed.is_dir() and any(committed.glob("*.parquet"))):
        time.sleep(0.01)
    first = json.loads(status.read_text())
    os.kill(first["pid"], signal.SIGKILL)
    at_kill = len(list(committed.glob("*.parquet")))
    driver.join(timeout=300)
    assert not driver.is_alive() and "error" not in done, done.get("error")
    assert 1 <= at_kill < 8 and first["status"] == "running"
    summary = done["summary"]
    assert summary.complete and summary.prompts_measured < 8  # the retry skipped committed ones
    retried = json.loads(status.read_text())
    assert retried["status"] == "done" and retried["pid"] != first["pid"]
    run = load_run(out / "runs" / "paper.code")
    assert len(run.prompts) == 8 and run.prompts.prompt_id.is_unique
    assert not run.nodes.duplicated(["prompt_id", "step", "node_id"]).any()
    assert not run.steps.duplicated(["prompt_id", "step"]).any()
    run_sweep(spec, tmp_path / "local", execution=execution, progress=False)
    _assert_same_sweeps(tmp_path / "local", out)


def test_ray_shard_errors_are_reported_and_the_rest_completes(ray_cluster, tiny_dirs, tmp_path):
    code = _prompts(tmp_path, "code", 2)
    broken = tmp_path / "broken"  # passes the driver's checks, fails to load in the worker
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    spec = parse_sweep(
        {
            "defaults": {"max_new_tokens": 3, "prompts": {"file": str(code)}},
            "pairs": [
                {
                    "name": "good",
                    "draft": str(tiny_dirs["llama", "draft"]),
                    "target": str(tiny_dirs["llama", "target"]),
                    "dtype": "float32",
                },
                {
                    "name": "missing",
                    "draft": str(broken),
                    "target": str(broken),
                    "dtype": "float32",
                },
            ],
        }
    )
    out = tmp_path / "out"
    with pytest.raises(SweepError, match=r"1 shard\(s\) failed \(missing/0\): ModelLoadError"):
        run_sweep(spec, out, executor="ray", execution=ONE_THREAD, progress=False)
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["status"] == "incomplete"
    assert {p["label"]: p["status"] for p in manifest["points"]} == {
        "good": "complete",
        "missing": "running",
    }
    assert len(load_run(out / "runs" / "good").prompts) == 2
