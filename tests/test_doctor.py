"""`specscope doctor`: what a bug report needs, as text and as JSON."""

import json

from typer.testing import CliRunner

from specscope.cli import app
from specscope.errors import extras


def test_doctor_json_names_versions_extras_cache_and_hardware(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["versions"]["torch"] and report["versions"]["transformers"]
    assert {e["name"] for e in report["extras"]} == set(extras())  # every extra of pyproject.toml
    assert report["cache_dir"] == str(tmp_path)
    assert {d["role"] for d in report["demo"]} == {"draft", "target"}
    assert all(not d["cache_built"] for d in report["demo"])  # an empty cache
    assert report["hardware"]["cores"] >= 1 and report["recommendations"]


def test_doctor_text():
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0 and "extras" in result.output and "CPU:" in result.output


def test_extras_come_from_the_package_metadata():
    assert "accelerate" in extras()["demo"] and "accelerate" in extras()["gguf"]


def _cgroup(tmp_path, v2: str | None = None, v1: tuple[str, str] | None = None):
    """A fake cgroup directory with a v2 ``cpu.max`` or v1 quota and period files."""
    tmp_path.mkdir(parents=True)
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2)
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(v1[0])
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(v1[1])
    return tmp_path


def test_cpu_quota_reads_cgroup_v2_and_v1(tmp_path):
    from specscope.hardware import cpu_quota

    assert cpu_quota(_cgroup(tmp_path / "a", v2="200000 100000\n")) == 2.0
    assert cpu_quota(_cgroup(tmp_path / "b", v2="max 100000\n")) is None
    assert cpu_quota(_cgroup(tmp_path / "c", v1=("150000\n", "100000\n"))) == 1.5
    assert cpu_quota(_cgroup(tmp_path / "d", v1=("-1\n", "100000\n"))) is None
    assert cpu_quota(_cgroup(tmp_path / "e", v2="garbage")) is None
    assert cpu_quota(tmp_path / "none") is None


def test_usable_cpus_is_the_affinity_capped_by_the_quota_rounded_up(tmp_path, monkeypatch):
    from specscope import hardware

    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: set(range(64)))
    for quota, usable in (("200000 100000", 2), ("150000 100000", 2), ("50000 100000", 1)):
        assert hardware.usable_cpus(_cgroup(tmp_path / quota.split()[0], v2=quota)) == usable
    assert hardware.usable_cpus(_cgroup(tmp_path / "max", v2="max 100000")) == 64
    assert hardware.usable_cpus(_cgroup(tmp_path / "big", v2="12800000 100000")) == 64


def test_model_commands_cap_torch_threads_at_the_usable_cpus(monkeypatch):
    """A container limited to 2 CPUs on a many-core host: torch would start 16 threads; the
    command line's default gives it 2, and --threads still wins."""
    import torch

    from specscope import hardware
    from specscope.cli.app import set_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(16)
        monkeypatch.setattr(hardware, "usable_cpus", lambda: 2)
        set_threads(None)
        assert torch.get_num_threads() == 2
        set_threads(3)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
