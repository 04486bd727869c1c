"""Sweeps and the commands that read them, under abuse (issue 25, the "sweeps" cases).

What is covered: ``sweep --overwrite`` removes only its own grid points' runs and follows no
planted link (case 2); a crafted ``sweep.json`` cannot make ``report``/``compare`` read runs outside
the sweep, and ``tables.md`` escapes hostile domain names and ids (case 8); ``file://`` URIs work
and other URIs are refused by ``run``, ``analyze``, ``report``, ``compare`` and ``sweep`` (case 9);
a huge grid is refused before it is expanded and an unreachable Ray head is refused before
anything is written (case 15); a 300-character label and a ``sweep.json`` that is a list, not
UTF-8 or nested too deep (tracebacks). Each test's comment says what happened before. Tiny random
pair (tests/conftest.py), one or two prompts, seconds each.
"""

import hashlib
import json
import socket
import sys
import time
import types

import pytest
from typer.testing import CliRunner

from conftest import tiny_pair_args
from lab.synthetic import DomainProfile, write_synthetic_run
from specscope.analysis import Settings, analyze
from specscope.analysis.report import write_outputs
from specscope.cli import app
from specscope.run.config import RunConfig
from specscope.sweep import SweepError, parse_sweep, run_sweep, sweep_run_dirs

cli = CliRunner()
HOSTILE = "<img src=x onerror=alert(1)>"


def _one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    for needle in needles:
        assert needle in result.output, result.output


def _prompts(folder, n=1):
    path = folder / "p.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "domain": "code", "prompt": f"Say {i}."}) + "\n"
            for i in range(n)
        )
    )
    return path


def _sweep_data(tiny_dirs, folder, trees=None):
    """One grid point per tree (default: chain depth 1) on the tiny llama pair, one prompt."""
    return {
        "name": "abuse",
        "defaults": {
            "max_new_tokens": 2,
            "prompts": {"file": str(_prompts(folder))},
            "pair": {
                "draft": str(tiny_dirs["llama", "draft"]),
                "target": str(tiny_dirs["llama", "target"]),
                "dtype": "float32",
            },
        },
        "trees": trees or [{"name": "one", "policy": "chain", "depth": 1}],
        "execution": {"threads": 1},
    }


def _toml(tiny_dirs, folder, name="one"):
    path = folder / "sweep.toml"
    path.write_text(f'''name = "abuse"
[defaults]
max_new_tokens = 2
prompts = {{ file = "{_prompts(folder)}" }}
[defaults.pair]
draft = "{tiny_dirs["llama", "draft"]}"
target = "{tiny_dirs["llama", "target"]}"
dtype = "float32"
[[trees]]
name = "{name}"
policy = "chain"
depth = 1
''')
    return path


def _snapshot(folder):
    """Every file under ``folder`` (links not followed) and its bytes' digest."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def victim(tmp_path):
    """A run directory outside any sweep, with an analysis/ of its own."""
    run = write_synthetic_run(
        tmp_path / "victim", prompts_per_domain=3, steps=4, run_id="victim-run"
    )
    (run / "analysis").mkdir()
    (run / "analysis" / "notes.md").write_text("my notes\n")
    return run


# --- case 2: sweep --overwrite --------------------------------------------------------------------


def test_overwrite_follows_no_link_and_keeps_what_is_not_a_grid_point(tiny_dirs, tmp_path, victim):
    # before: --overwrite ran remove_run in every directory under OUT/runs/, links followed: a
    # link planted there deleted the victim's manifest.json, records and analysis/, and a
    # directory that is not a grid point lost its analysis/
    spec = parse_sweep(_sweep_data(tiny_dirs, tmp_path))
    out = tmp_path / "sweep"
    run_sweep(spec, out, progress=False)
    # the attacker: a link under runs/, listed in sweep.json as a grid point, whose target's
    # manifest even claims to be that grid point of this sweep
    manifest = json.loads((victim / "manifest.json").read_text())
    manifest["sweep"] = {"sweep_id": spec.sweep_id, "label": "evil"}
    (victim / "manifest.json").write_text(json.dumps(manifest))
    (out / "runs" / "evil").symlink_to(victim, target_is_directory=True)
    sweep_json = json.loads((out / "sweep.json").read_text())
    sweep_json["points"].append({"label": "evil", "run_id": "x", "run_dir": "runs/evil"})
    (out / "sweep.json").write_text(json.dumps(sweep_json))
    (out / "runs" / "mine" / "analysis").mkdir(parents=True)  # not a grid point: the user's
    (out / "runs" / "mine" / "analysis" / "plot.txt").write_text("keep me\n")
    before = _snapshot(victim)

    run_sweep(spec, out, overwrite=True, progress=False)

    assert _snapshot(victim) == before
    assert (out / "runs" / "evil").is_symlink()
    assert (out / "runs" / "mine" / "analysis" / "plot.txt").read_text() == "keep me\n"
    assert json.loads((out / "runs" / "one" / "manifest.json").read_text())["status"] == "complete"


def test_overwrite_refuses_a_link_at_a_grid_point_and_removes_nothing(tiny_dirs, tmp_path, victim):
    # before: the link at runs/one was followed: the victim's run was removed, then the new
    # sweep's records were written into it
    spec = parse_sweep(_sweep_data(tiny_dirs, tmp_path))
    out = tmp_path / "sweep"
    run_sweep(spec, out, progress=False)
    (out / "runs" / "one").rename(tmp_path / "moved")
    (out / "runs" / "one").symlink_to(victim, target_is_directory=True)
    before, sweep_before = _snapshot(victim), (out / "sweep.json").read_bytes()
    with pytest.raises(SweepError, match="runs/one is a symbolic link"):
        run_sweep(spec, out, overwrite=True, progress=False)
    assert _snapshot(victim) == before and (out / "sweep.json").read_bytes() == sweep_before


def test_overwrite_keeps_a_run_the_sweep_did_not_write(tiny_dirs, tmp_path, victim):
    # before: any run at a grid point's place was removed by --overwrite, whoever wrote it
    spec = parse_sweep(_sweep_data(tiny_dirs, tmp_path))
    out = tmp_path / "sweep"
    run_sweep(spec, out, progress=False)
    other = out / "runs" / "one"
    for path in sorted(other.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    write_synthetic_run(other, prompts_per_domain=2, steps=3, run_id="not-the-sweeps")
    before = _snapshot(other)
    with pytest.raises(SweepError, match="not grid point one of the sweep being overwritten"):
        run_sweep(spec, out, overwrite=True, progress=False)
    assert _snapshot(other) == before


# --- case 8: sweep.json confined; tables.md escaped -----------------------------------------------


@pytest.mark.parametrize("run_dir", ["ABSOLUTE", "../victim", "runs/../../victim", "runs/x/../.."])
def test_report_and_compare_read_no_run_outside_the_sweep(tmp_path, victim, run_dir):
    # before: report and compare read the run sweep.json pointed at, anywhere, and embedded its
    # prompts in their output
    sweep = tmp_path / "sweep"
    write_synthetic_run(sweep / "runs" / "a", prompts_per_domain=3, steps=4, run_id="a")
    run_dir = str(victim) if run_dir == "ABSOLUTE" else run_dir
    (sweep / "sweep.json").write_text(
        json.dumps(
            {
                "kind": "specscope-sweep",
                "points": [{"label": "a", "run_dir": "runs/a"}, {"label": "b", "run_dir": run_dir}],
            }
        )
    )
    for args in (["compare", str(sweep)], ["report", str(sweep), "--no-plots"]):
        result = cli.invoke(app, [*args, "--boot", "0"])
        _one_line_error(result, "is not a directory runs/NAME inside the sweep")
        assert "victim-run" not in result.output
    assert not (sweep / "report.html").exists()


def test_a_link_in_the_sweep_that_leads_outside_is_refused(tmp_path, victim):
    # before: runs/b, a link to a run elsewhere, was read like a grid point
    sweep = tmp_path / "sweep"
    (sweep / "runs").mkdir(parents=True)
    (sweep / "runs" / "b").symlink_to(victim, target_is_directory=True)
    (sweep / "sweep.json").write_text(
        json.dumps({"kind": "specscope-sweep", "points": [{"label": "b", "run_dir": "runs/b"}]})
    )
    result = cli.invoke(app, ["compare", str(sweep), "--boot", "0"])
    _one_line_error(result, "outside the sweep")
    assert "victim-run" not in result.output


def test_tables_md_escapes_domain_names_and_ids(tmp_path):
    # before: tables.md held the domain name's raw HTML (<img src=x onerror=...>) and the run id's
    profiles = {HOSTILE: DomainProfile(0.6, 0.3, 1.2), "chat": DomainProfile(0.5, 0.2, 1.0)}
    run = write_synthetic_run(
        tmp_path / "run", prompts_per_domain=4, steps=6, profiles=profiles, run_id="<b>id</b>|x"
    )
    outputs = write_outputs(analyze(run, Settings(n_boot=10)), tmp_path / "out", plots=False)
    text = outputs.markdown.read_text()
    assert "<img" not in text and "<b>" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and "&lt;b&gt;id&lt;/b&gt;\\|x" in text


# --- case 9: URIs ----------------------------------------------------------------------------------


def test_file_uris_work_end_to_end(tiny_dirs, tmp_path, monkeypatch):
    # before: `run --out file:///...` wrote into ./file:/..., analyze and compare looked for
    # ./file:/..., and the `specscope compare file:///...` that sweep printed failed
    monkeypatch.chdir(tmp_path)
    run_uri = f"file://{tmp_path}/run"
    result = cli.invoke(
        app,
        [
            "run",
            "--out",
            run_uri,
            *tiny_pair_args(tiny_dirs, "llama"),
            "--prompts",
            str(_prompts(tmp_path, 2)),
            "--max-new-tokens",
            "2",
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "manifest.json").is_file() and not (tmp_path / "file:").exists()
    result = cli.invoke(app, ["analyze", run_uri, "--boot", "5", "--no-plots", "--show", "none"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "analysis" / "tables.md").is_file()
    result = cli.invoke(app, ["compare", run_uri, run_uri, "--boot", "5"])
    assert result.exit_code == 0, result.output
    sweep_uri = f"file://{tmp_path}/sweep"
    result = cli.invoke(app, ["sweep", str(_toml(tiny_dirs, tmp_path)), "--out", sweep_uri, "-q"])
    assert result.exit_code == 0, result.output
    printed = result.output.strip().splitlines()[-1].partition("specscope ")[2].split()
    assert printed == ["compare", sweep_uri]
    result = cli.invoke(app, [*printed, "--boot", "5"])
    assert result.exit_code == 0, result.output
    result = cli.invoke(app, ["report", sweep_uri, "--boot", "5", "--no-plots"])
    assert result.exit_code == 0 and (tmp_path / "sweep" / "report.html").is_file(), result.output
    assert not (tmp_path / "file:").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--out", "s3://bucket/x"],
        ["run", "--out", "hdfs://node/x"],
        ["analyze", "s3://bucket/x"],
        ["report", "s3://bucket/x"],
        ["compare", "s3://bucket/x"],
        ["compare", "runs/a", "hdfs://node/x"],
        ["analyze", "runs/a", "--out", "s3://bucket/y"],
        ["certify", "s3://bucket/x"],
        ["sweep", "s3://bucket/sweep.toml"],
    ],
)
def test_other_uris_are_refused_and_no_local_directory_is_made(
    tiny_dirs, tmp_path, monkeypatch, args
):
    # before: `run --out s3://bucket/x` wrote a local directory s3:/bucket/x; analyze, report and
    # compare looked for one
    if args[0] == "run":
        args = [
            *args,
            "--draft",
            str(tiny_dirs["llama", "draft"]),
            "--target",
            str(tiny_dirs["llama", "target"]),
            "--prompts",
            str(_prompts(tmp_path)),
            "--max-new-tokens",
            "2",
            "--quiet",
        ]
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    _one_line_error(cli.invoke(app, args), "://", "URI")
    assert list((tmp_path / "cwd").iterdir()) == []


# --- case 15: bounded work -------------------------------------------------------------------------


@pytest.fixture
def expansions(monkeypatch):
    """Counts run configs built (one per grid point expanded); refuses to build a 1001st."""
    calls = {"n": 0}
    real = RunConfig.from_dict.__func__

    def counted(cls, data, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 1000:
            raise AssertionError("the grid is being expanded")
        return real(cls, data, *args, **kwargs)

    monkeypatch.setattr(RunConfig, "from_dict", classmethod(counted))
    return calls


def test_a_huge_grid_is_refused_before_it_is_expanded(tmp_path, expansions):
    # before: a grid of 10^6 points was expanded 3 to 4 times (--dry-run printed nothing in 150 s
    # while memory grew 15 MB/s)
    toml = tmp_path / "huge.toml"
    toml.write_text(
        '[[trees]]\npolicy = "static"\npaths = "[(0,)]"\n'
        f"depth = {list(range(1, 1001))}\nmax_nodes = {list(range(1, 1001))}\n"
    )
    t0 = time.perf_counter()
    result = cli.invoke(app, ["sweep", str(toml), "--dry-run"])
    _one_line_error(result, "1,000,000 points", "limit of 10,000")
    assert time.perf_counter() - t0 < 10 and expansions["n"] <= 2  # the base config only


def test_the_grid_limit_can_be_raised_and_the_grid_is_expanded_once(tmp_path, expansions):
    # before: no limit; the grid was expanded by parse_sweep, sweep_id and twice by --dry-run
    toml = tmp_path / "grid.toml"
    toml.write_text(
        '[[trees]]\npolicy = "chain"\ndepth = [1, 2, 3, 4, 5, 6]\n[execution]\nmax_points = 6\n'
    )
    base = expansions["n"]
    result = cli.invoke(app, ["sweep", str(toml), "--dry-run"])
    assert result.exit_code == 0 and "6 grid point(s)" in result.output, result.output
    assert expansions["n"] - base <= 6 + 2  # six points and the base config
    _one_line_error(
        cli.invoke(app, ["sweep", str(toml), "--dry-run", "--max-points", "5"]),
        "the grid has 6 points, more than the limit of 5",
    )


def test_an_unreachable_ray_head_is_refused_in_seconds_before_anything_is_written(
    tiny_dirs, tmp_path, monkeypatch
):
    # before: sweep.json and the runs' manifests were written, then ray.init retried the head
    # for 600 s with no error
    inits = []

    def init(**kwargs):  # the real one retries an unreachable head for 600 s
        inits.append(kwargs)
        raise ConnectionError("ray.init was reached")

    fake_ray = types.SimpleNamespace(is_initialized=lambda: False, init=init, shutdown=lambda: None)
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    with socket.socket() as probe:  # a local port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "out"
    t0 = time.perf_counter()
    result = cli.invoke(
        app,
        [
            "sweep",
            str(_toml(tiny_dirs, tmp_path)),
            "--out",
            str(out),
            "--executor",
            "ray",
            "--address",
            f"127.0.0.1:{port}",
            "-q",
        ],
    )
    _one_line_error(result, f"cannot reach the Ray head at 127.0.0.1:{port}")
    assert time.perf_counter() - t0 < 10 and not inits and not out.exists()


# --- tracebacks ------------------------------------------------------------------------------------


def test_a_300_character_label_gets_a_hashed_directory_name(tiny_dirs, tmp_path):
    # before: OSError ENAMETOOLONG (a traceback) when the run directory was made
    label = "t" * 300
    spec = parse_sweep(
        _sweep_data(tiny_dirs, tmp_path, trees=[{"name": label, "policy": "chain", "depth": 1}])
    )
    summary = run_sweep(spec, tmp_path / "sweep", progress=False)
    assert summary.complete
    (run_dir,) = sweep_run_dirs(tmp_path / "sweep")
    assert run_dir.name.startswith("t" * 64 + "-") and len(run_dir.name) < 100
    assert json.loads((run_dir / "manifest.json").read_text())["sweep"]["label"] == label


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[]", "must hold a JSON object, got a list"),
        (b'{"kind": "specscope-sweep", "points": "\xff\xfe"}', "not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_a_damaged_sweep_json_is_one_line(tiny_dirs, tmp_path, content, message):
    # before: AttributeError ('list' object has no attribute 'get'), UnicodeDecodeError and
    # RecursionError tracebacks from compare, report and sweep
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_bytes(content)
    toml = _toml(tiny_dirs, tmp_path)
    for args in (
        ["compare", str(sweep)],
        ["report", str(sweep), "--no-plots"],
        ["sweep", str(toml), "--out", str(sweep), "-q"],
    ):
        _one_line_error(cli.invoke(app, args), "sweep.json", message)
    assert (sweep / "sweep.json").read_bytes() == content


def test_a_second_sweep_on_a_live_sweep_directory_is_refused(tiny_dirs, tmp_path):
    # before: two sweeps on one OUT wrote the same grid points' manifests and parts at once
    from specscope.records import run_lock

    spec = parse_sweep(_sweep_data(tiny_dirs, tmp_path))
    out = tmp_path / "sweep"
    with run_lock(out):  # a live first sweep holds the directory (deterministic: no timing)
        with pytest.raises(Exception, match="being written by another specscope process") as e:
            run_sweep(spec, out, progress=False)
        assert "Traceback" not in str(e.value)
        assert not (out / "sweep.json").exists()
    summary = run_sweep(spec, out, progress=False)  # the owner is gone: the sweep runs
    assert summary.prompts_measured == 1


def test_a_sweep_file_asking_for_remote_code_gets_none(tiny_dirs, tmp_path):
    # before: a sweep file's [pair] trust_remote_code = true reached every shard's model loading
    from specscope.progress import SILENT, reporting

    class Notes(type(SILENT)):
        def __init__(self):
            self.said = []

        def note(self, message, level="info"):
            self.said.append((message, level))

    data = _sweep_data(tiny_dirs, tmp_path)
    data["defaults"]["pair"]["trust_remote_code"] = True
    with reporting(Notes()) as notes:  # the warning goes to the observer (the CLI prints it)
        spec = parse_sweep(data)
    assert all(not p.config.pair.trust_remote_code for p in spec.points())
    assert any("--trust-remote-code" in m and lv == "warning" for m, lv in notes.said)
    allowed = parse_sweep(data, trust_remote_code=True)
    assert all(p.config.pair.trust_remote_code for p in allowed.points())
