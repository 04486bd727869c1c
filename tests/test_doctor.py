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
