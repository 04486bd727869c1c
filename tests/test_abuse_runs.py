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

from conftest import small_run_config, tiny_pair_args
from specscope.cli import app
from specscope.run.config import RunConfig, load_config

cli = CliRunner()
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _run_args(tiny_dirs, prompt_file, out, *extra) -> list[str]:
    return [
        "run",
        "--out",
        str(out),
        "--quiet",
        *tiny_pair_args(tiny_dirs),
        "--prompts",
        str(prompt_file),
        "--policy",
        "chain",
        "--depth",
        "2",
        "--max-new-tokens",
        "3",
        "--batch-size",
        "1",
        *extra,
    ]


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
        "from transformers import Qwen2Config as EvilConfig, Qwen2ForCausalLM as EvilModel\n"
    )
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (model / "config.json").write_text(json.dumps(config))
    return model, marker


def test_a_shared_run_manifest_runs_no_model_code_in_tune(
    evil_model, tiny_dirs, prompt_file, tmp_path
):
    # Before: `tune RUN_DIR` took trust_remote_code from the run's manifest and imported evil.py.
    from specscope.run.study import run_study

    model, marker = evil_model
    run = tmp_path / "shared-run"
    run_study(small_run_config(tiny_dirs, prompt_file), run, progress=False)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["pair"].update(
        draft=str(tiny_dirs["qwen2", "draft"]), target=str(model), trust_remote_code=True
    )
    (run / "manifest.json").write_text(json.dumps(manifest))
    result = cli.invoke(
        app,
        [
            "tune",
            str(run),
            "--context-len",
            "8",
            "--repeats",
            "1",
            "--max-nodes",
            "2",
            "-o",
            str(tmp_path / "policy.json"),
        ],
    )
    assert not marker.exists()
    assert result.exit_code == 0, result.output
    assert result.stderr.count("--trust-remote-code") == 1


def test_a_config_file_asking_for_remote_code_runs_none(
    evil_model, tiny_dirs, prompt_file, tmp_path
):
    # Before: `run --config OTHER/manifest.json` (the README's "measure more like it") took
    # trust_remote_code from the file and imported evil.py.
    model, marker = evil_model
    other = tmp_path / "other.json"
    config = small_run_config(tiny_dirs, prompt_file).to_dict()
    config["pair"].update(target=str(model), trust_remote_code=True)
    other.write_text(json.dumps({"config": config}))
    result = cli.invoke(
        app,
        [
            "run",
            "--config",
            str(other),
            "--out",
            str(tmp_path / "o"),
            "--quiet",
            "--batch-size",
            "1",
        ],
    )
    assert not marker.exists()
    assert result.exit_code == 0, result.output
    assert result.stderr.count("--trust-remote-code") == 1
    assert (
        json.loads((tmp_path / "o" / "manifest.json").read_text())["config"]["pair"][
            "trust_remote_code"
        ]
        is False
    )


def test_remote_code_still_comes_from_the_command_line(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("[pair]\ntrust_remote_code = true\n")
    assert load_config(str(toml)).pair.trust_remote_code is False
    assert load_config(str(toml)).replace(**{"pair.trust_remote_code": True}).pair.trust_remote_code
    kept = RunConfig().replace(**{"pair.trust_remote_code": True}).replace(seed=1)
    assert kept.pair.trust_remote_code is True


# --- case 3: one writer per run -------------------------------------------------------------------

PAUSED_RUN = textwrap.dedent("""
    import sys
    import specscope.run.study as study
    measure = study.measure_prompts

    def paused(*args, **kwargs):  # the manifest is written, no prompt is committed yet
        print("measuring", flush=True)
        sys.stdin.readline()
        return measure(*args, **kwargs)

    study.measure_prompts = paused
    from specscope.cli import app
    app(sys.argv[1:])
""")


@pytest.mark.slow
def test_a_second_run_on_a_live_run_dir_is_refused(tiny_dirs, prompt_file, tmp_path):
    # Before: a second `run` with another config, started while the first had written its
    # manifest but committed no prompt, took the live run for a failed start and replaced it;
    # both exited 0 and only one's records remained (or a mix of both).
    out = tmp_path / "live"
    first = subprocess.Popen(
        [sys.executable, "-c", PAUSED_RUN, *_run_args(tiny_dirs, prompt_file, out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": SRC},
    )
    try:
        assert first.stdout.readline() == "measuring\n", first.stderr.read()
        manifest = (out / "manifest.json").read_bytes()
        second = cli.invoke(app, _run_args(tiny_dirs, prompt_file, out, "--seed", "7"))
        assert second.exit_code == 2
        assert second.output.count("\n") == 1 and second.output.startswith("error: ")
        assert f"pid {first.pid}" in second.output and str(out) in second.output
        assert (out / "manifest.json").read_bytes() == manifest
        assert not (out / "parts").exists()
        first.stdin.write("\n")
        first.stdin.flush()
        assert first.wait(timeout=300) == 0, first.stderr.read()
    finally:
        first.kill()
        first.wait()
    from specscope.records import load_run

    run = load_run(out)
    assert len(run.prompts) == 3 and set(run.nodes.run_id) == {run.manifest["run_id"]}
    assert not list(out.glob(".specscope*.lock"))  # released with the run


def test_a_failed_start_whose_owner_is_gone_is_still_replaced(tiny_dirs, prompt_file, tmp_path):
    # A `running` run with no committed prompt and no live lock holder (its process was killed:
    # the lock file names a dead pid) is a failed start, replaced as before.
    out = tmp_path / "stale"
    out.mkdir()
    (out / "manifest.json").write_text(
        json.dumps({"schema_version": 1, "run_id": "older", "status": "running", "config": {}})
    )
    (out / ".specscope.lock").write_text(
        json.dumps({"pid": 999999, "host": "gone", "started": "2020-01-01T00:00:00+00:00"})
    )
    result = cli.invoke(app, _run_args(tiny_dirs, prompt_file, out))
    assert result.exit_code == 0, result.output
    from specscope.records import load_run

    assert len(load_run(out).prompts) == 3


def test_a_sweep_shard_takes_the_run_lock(tiny_dirs, prompt_file, tmp_path):
    # Before: nothing stopped Ray from running a retried shard beside its still-live first
    # attempt, nor a `run` and a sweep shard from writing one run directory together.
    from specscope.records import RunDirError, run_lock
    from specscope.sweep.executors import Shard, run_shard

    config = small_run_config(tiny_dirs, prompt_file)
    items = tuple(enumerate(config.prompts.select(config.seed)))
    run_dir = tmp_path / "point"
    shard = Shard(
        "point/0",
        "point",
        str(run_dir),
        str(tmp_path / "shards" / "point.0000.json"),
        config,
        items,
        batch_size=1,
    )
    with run_lock(run_dir, shard="point/0"):  # the first attempt, still alive
        with pytest.raises(RunDirError, match=r"shard point/0 .*pid \d+"):
            run_shard(shard)
    with run_lock(run_dir):  # a `run` writing the directory
        with pytest.raises(RunDirError, match="being written by another specscope process"):
            run_shard(shard)
    with run_lock(run_dir, shard="point/1"):  # shards of one run measure side by side
        result = run_shard(shard)
        with pytest.raises(RunDirError, match="a sweep's shards"):
            with run_lock(run_dir):
                pass
    assert result.prompts == 3 and result.error is None


def test_records_of_another_run_are_refused(tiny_dirs, prompt_file, tmp_path):
    # Before: a directory with the manifest of one run and the records of another was analysed.
    from specscope.run.study import run_study

    a, b = tmp_path / "a", tmp_path / "b"
    run_study(small_run_config(tiny_dirs, prompt_file), a, progress=False)
    run_study(small_run_config(tiny_dirs, prompt_file, seed=7), b, progress=False)
    shutil.copy(b / "prompts.parquet", a / "prompts.parquet")
    ids = [json.loads((d / "manifest.json").read_text())["run_id"] for d in (a, b)]
    result = cli.invoke(app, ["analyze", str(a), "--boot", "0"])
    assert result.exit_code == 2 and result.output.startswith("error: ")
    assert ids[0] in result.output and ids[1] in result.output


# --- case 4: two writers of one record file -------------------------------------------------------


def test_two_writers_of_one_part_never_tear_it(tmp_path, monkeypatch):
    # Before: both writers used the temporary `.NAME.tmp`: the second overwrote the first's
    # temporary while it was being written, and one rename failed (the file was gone).
    import threading

    import pyarrow as pa
    import pyarrow.parquet as pq

    from specscope.records import rundir

    write = pq.write_table
    both_written = threading.Barrier(2, timeout=30)

    def write_then_wait(table, where, **kwargs):  # both temporaries exist before either rename
        write(table, where, **kwargs)
        both_written.wait()

    monkeypatch.setattr(rundir.pq, "write_table", write_then_wait)
    fs, path = rundir.open_location(tmp_path / "part.parquet")
    tables = [pa.table({"x": list(range(i * 1000, i * 1000 + 5000))}) for i in range(2)]
    errors = []

    def writer(table):
        try:
            rundir.write_file(fs, path, table)
        except Exception as e:  # noqa: BLE001 - recorded for the assertion
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in tables]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pq.read_table(path) in tables
    assert [p.name for p in tmp_path.iterdir()] == ["part.parquet"]  # no temporaries left


# --- case 11: a run that grew after it was consolidated ----------------------------------------


@pytest.mark.slow
def test_analyze_reads_the_newest_parts_of_a_grown_interrupted_run(
    tiny_dirs, prompt_file, tmp_path, monkeypatch
):
    # Before: the consolidated files of the first, complete run were read and the prompts
    # committed after it grew (appended, resumed, killed) were ignored.
    from specscope.measure import study as measure_study
    from specscope.records import load_run
    from specscope.run.study import run_study

    out = tmp_path / "grown"
    run_study(small_run_config(tiny_dirs, prompt_file), out, progress=False)
    with prompt_file.open("a") as f:
        for i in (3, 4):
            f.write(json.dumps({"id": f"p{i}", "domain": "code", "prompt": f"More {i}?"}) + "\n")
    measure = measure_study.finish_prompt
    calls = []

    def killed_on_second(*args, **kwargs):  # as the second prompt finishes
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return measure(*args, **kwargs)

    monkeypatch.setattr(measure_study, "finish_prompt", killed_on_second)
    with pytest.raises(KeyboardInterrupt):
        run_study(small_run_config(tiny_dirs, prompt_file), out, progress=False)
    run = load_run(out)
    assert sorted(run.prompts.prompt_id) == ["p0", "p1", "p2", "p3"]
    assert set(run.nodes.prompt_id) == set(run.steps.prompt_id) == set(run.prompts.prompt_id)
    result = cli.invoke(app, ["analyze", str(out), "--boot", "0"])
    assert result.exit_code == 0, result.output


# --- tracebacks that became one-line errors -----------------------------------------------------


def _one_error_line(result, *names):
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    for name in names:
        assert str(name) in result.output, result.output


@pytest.mark.parametrize("code", ["ENOSPC", "EROFS", "EACCES"])
def test_a_failed_write_mid_run_is_one_line_and_loses_nothing(
    code, tiny_dirs, prompt_file, tmp_path, monkeypatch
):
    # Before: a full disk (or read-only parts/, or no permission) mid-run gave an error without
    # the file, or a traceback. (As root, chmod does not stop writes: the write fails here.)
    import errno

    import pyarrow.parquet as pq

    from specscope.records import load_run, rundir

    out = tmp_path / "full"
    write, calls = pq.write_table, []

    def fails_on_the_second_prompt(table, where, **kwargs):
        calls.append(where)
        if len(calls) == 4:  # the first prompt's three parts are committed
            raise OSError(getattr(errno, code), f"simulated {code}")
        return write(table, where, **kwargs)

    monkeypatch.setattr(rundir.pq, "write_table", fails_on_the_second_prompt)
    result = cli.invoke(app, _run_args(tiny_dirs, prompt_file, out))
    _one_error_line(result, out / "parts" / "nodes", f"simulated {code}")
    assert len(load_run(out).prompts) == 1
    assert not [p for p in out.rglob(".*") if not p.name.startswith(".specscope")]
    monkeypatch.setattr(rundir.pq, "write_table", write)
    again = cli.invoke(app, _run_args(tiny_dirs, prompt_file, out))
    assert again.exit_code == 0 and "measured 2 prompt(s)" in again.output, again.output


def test_any_prompt_id_is_stored(tiny_dirs, tmp_path):
    # Before: an id of 256 bytes or more failed with ENAMETOOLONG after every prompt was measured.
    from specscope.records import load_run

    ids = ["x" * 300, "é" * 200, "../../a/b", ".hidden", "p"]
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": i, "domain": "chat", "prompt": f"Hi {n}"}) + "\n"
            for n, i in enumerate(ids)
        )
    )
    out = tmp_path / "long"
    result = cli.invoke(app, _run_args(tiny_dirs, prompts, out))
    assert result.exit_code == 0, result.output
    assert sorted(load_run(out).prompts.prompt_id) == sorted(ids)
    assert all(len(p.name.encode()) < 128 for p in (out / "parts" / "prompts").iterdir())
    assert {p.parent for p in out.rglob("*.parquet")} <= {out, *(out / "parts").iterdir()}


def test_a_prompt_id_records_cannot_hold_is_refused_up_front(tiny_dirs, tmp_path):
    prompts = tmp_path / "surrogate.jsonl"
    prompts.write_text('{"id": "a\\ud800", "domain": "chat", "prompt": "Hi"}\n')
    out = tmp_path / "s"
    result = cli.invoke(app, _run_args(tiny_dirs, prompts, out))
    _one_error_line(result, "not valid Unicode")
    assert not out.exists()  # nothing written, not even the directory


@pytest.mark.parametrize(
    "content", [b"[1, 2]", b'{"run_id": "\xff\xfe"}', b"[" * 100_000 + b"]" * 100_000]
)
def test_an_unusable_manifest_is_one_line(content, tiny_dirs, prompt_file, tmp_path):
    # Before: a manifest.json that is a list, not UTF-8 or nested 100,000 deep gave a traceback
    # (or an error that did not name the file).
    from lab.synthetic import write_synthetic_run

    run = write_synthetic_run(tmp_path / "run", prompts_per_domain=2, steps=2)
    (run / "manifest.json").write_bytes(content)
    _one_error_line(cli.invoke(app, ["certify", str(run)]), run / "manifest.json")
    _one_error_line(cli.invoke(app, _run_args(tiny_dirs, prompt_file, run)), run / "manifest.json")


@pytest.mark.parametrize("content", [b"[]", b"\xff\xfe not utf-8", b'{"x": 5, "y": [1]}'])
def test_an_unusable_fingerprint_cache_costs_only_rehashing(
    content, tiny_dirs, prompt_file, tmp_path, monkeypatch
):
    # Before: a fingerprints.json holding [] or non-UTF-8 bytes failed every run with a local model.
    from specscope.models.load import model_identity

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("SPECSCOPE_CACHE", str(cache))
    (cache / "fingerprints.json").write_bytes(content)
    result = cli.invoke(app, _run_args(tiny_dirs, prompt_file, tmp_path / "o"))
    assert result.exit_code == 0, result.output
    assert isinstance(json.loads((cache / "fingerprints.json").read_text()), dict)
    source = tiny_dirs["qwen2", "draft"]
    key = str(next(p for p in source.iterdir() if p.suffix == ".json").resolve())
    (cache / "fingerprints.json").write_text(json.dumps({key: "not an entry"}))
    assert model_identity(str(source))["fingerprint"]


def test_a_pickle_checkpoint_weights_only_refuses_is_a_model_error(
    tiny_dirs, prompt_file, tmp_path, capfd
):
    # Before: torch's UnpicklingError escaped as a traceback instead of the model-loading error.
    import torch
    from safetensors.torch import load_file

    model = tmp_path / "pickled"
    shutil.copytree(tiny_dirs["qwen2", "draft"], model)
    weights = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    weights["extra"] = Exploit()
    torch.save(weights, model / "pytorch_model.bin")
    args = _run_args(tiny_dirs, prompt_file, tmp_path / "o")
    args[args.index("--draft") + 1] = str(model)
    result = cli.invoke(app, args)
    _one_error_line(result, model / "pytorch_model.bin", "safetensors")
    assert "pickle code ran" not in capfd.readouterr().out


class Exploit:
    """A pickled object that would run code when unpickled without weights_only."""

    def __reduce__(self):
        return print, ("pickle code ran",)


def test_records_of_the_wrong_type_are_refused_on_read_with_the_column_named(tmp_path):
    # Before: greedy_accept held as the strings "true"/"false" (a CSV round trip leaves it so) was
    # read as truthy strings: analyze exited 0 with greedy acceptance 1.0 in every domain.
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lab.synthetic import write_synthetic_run

    run = write_synthetic_run(tmp_path / "run", prompts_per_domain=2, steps=2)
    nodes = pd.read_parquet(run / "nodes.parquet")
    nodes["greedy_accept"] = nodes["greedy_accept"].map({True: "true", False: "false"})
    pq.write_table(pa.Table.from_pandas(nodes, preserve_index=False), run / "nodes.parquet")
    result = cli.invoke(app, ["analyze", str(run), "--out", str(tmp_path / "a")])
    _one_error_line(result, run / "nodes.parquet", "'greedy_accept'", "bool")


def test_records_are_cast_to_their_schema_where_no_value_changes():
    import pyarrow as pa

    from specscope.records.rundir import RunDirError, typed_records
    from specscope.records.schema import STEP_SCHEMA

    # pandas writes int64 and large strings: cast to the schema's narrower types, values kept
    columns = {
        f.name: pa.array([1], pa.int64()) for f in STEP_SCHEMA if pa.types.is_integer(f.type)
    }
    columns |= {f.name: pa.array([0.5]) for f in STEP_SCHEMA if pa.types.is_floating(f.type)}
    columns |= {
        f.name: pa.array(["x"], pa.large_string()) for f in STEP_SCHEMA if f.type == "string"
    }
    table = typed_records(pa.table(columns), "steps", "steps.parquet")
    assert table.select(STEP_SCHEMA.names).schema == STEP_SCHEMA
    # a value that does not fit its width, and a float where an integer belongs, are refused
    too_big = pa.table({**columns, "tree_size": pa.array([1 << 20], pa.int64())})
    with pytest.raises(RunDirError, match=r"steps.parquet: column 'tree_size' does not fit int16"):
        typed_records(too_big, "steps", "steps.parquet")
    fractional = pa.table({**columns, "tau": pa.array([1.5])})
    with pytest.raises(RunDirError, match=r"column 'tau' holds double, .* says int16"):
        typed_records(fractional, "steps", "steps.parquet")


@pytest.mark.slow
def test_a_50_mb_prompt_is_measured_in_bounded_time_and_memory(tiny_dirs, tmp_path):
    # Before: run tokenised a prompt's whole text and then kept its last 512 tokens: a 50 MB line
    # took 230 s and 9.9 GB (the byte tokenizer here: 138 s, 9.4 GB for the rendering alone).
    import os
    import threading

    words = "the quick brown fox jumps over 12345 lazy dogs; "
    text = (words * (50_000_000 // len(words) + 1))[:50_000_000]
    prompts = tmp_path / "huge.jsonl"
    prompts.write_text(json.dumps({"id": "huge", "domain": "chat", "prompt": text}) + "\n")
    del text
    out = tmp_path / "huge-run"
    command = [sys.executable, "-m", "specscope.cli", *_run_args(tiny_dirs, prompts, out)]
    log = tmp_path / "run.log"
    with log.open("w") as sink:
        run = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        watchdog = threading.Timer(120, run.kill)
        watchdog.start()
        _, status, usage = os.wait4(run.pid, 0)  # this child's own peak, not the session's
        watchdog.cancel()
    assert os.waitstatus_to_exitcode(status) == 0, log.read_text()
    peak_gb = usage.ru_maxrss / 2**20
    assert peak_gb < 2.5, f"the run peaked at {peak_gb:.1f} GB"
    import pyarrow.parquet as pq

    row = pq.read_table(out / "prompts.parquet").to_pylist()[0]
    assert row["truncated"] and row["prompt_tokens"] == 512
    assert len(row["prompt_text"]) < 1_000_000  # the text tokenised: the cut, not the 50 MB


def test_a_domain_name_cannot_drive_the_terminal(tmp_path):
    # Before: a domain named "code\x1b[2J" cleared the terminal from analyze's tables.
    from lab.synthetic import PROFILES, write_synthetic_run

    hostile = "code\x1b[2J\u202e"
    profiles = {hostile if d == "code" else d: p for d, p in PROFILES.items()}
    run = write_synthetic_run(tmp_path / "run", prompts_per_domain=4, steps=4, profiles=profiles)
    result = cli.invoke(app, ["analyze", str(run), "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\u202e" not in result.output
    assert "code\\x1b[2J\\u202e" in result.output  # shown, escaped


def test_a_full_disk_or_file_size_limit_names_the_file(tmp_path):
    # Before: analyze under a file size limit said "File too large" and no file.
    import resource
    import signal

    from lab.synthetic import write_synthetic_run

    run = write_synthetic_run(tmp_path / "run", prompts_per_domain=4, steps=4)

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    out = tmp_path / "a"
    done = subprocess.run(
        [sys.executable, "-m", "specscope.cli", "analyze", str(run), "--out", str(out)],
        capture_output=True,
        text=True,
        preexec_fn=limited,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "File too large" in done.stderr and str(out) in done.stderr, done.stderr
