"""specscope.files: outputs written whole, never through planted links, with the umask's modes;
JSON read strictly; and the command decorator's one-line errors for failures of the machine."""

import errno
import json
import os
import stat
import threading

import pytest

from specscope.cli.app import describe
from specscope.errors import SpecscopeError
from specscope.files import (
    OutputError,
    check_output,
    json_text,
    local_location,
    read_json_object,
    temporary_name,
    write_json,
    write_output,
)


class _Error(SpecscopeError):
    pass


def test_a_link_planted_at_the_target_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    (run / "analysis").mkdir(parents=True)
    (run / "analysis" / "tables.md").symlink_to(victim)
    write_output(run / "analysis" / "tables.md", "tables\n")
    assert victim.read_text() == "precious\n"
    assert not (run / "analysis" / "tables.md").is_symlink()
    assert (run / "analysis" / "tables.md").read_text() == "tables\n"


def test_a_linked_directory_inside_a_run_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "analysis").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OutputError, match="symbolic link"):
        write_output(run / "analysis" / "tables.md", "x", inside=run)
    assert list(elsewhere.iterdir()) == []


def test_a_fifo_named_as_output_stays_a_fifo_and_gets_the_bytes(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_output(fifo, b"hello\n")
    reader.join(timeout=10)
    assert got == [b"hello\n"]
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_modes_follow_the_umask_and_a_replaced_file_keeps_its_mode(tmp_path):
    old = os.umask(0o027)
    try:
        new = write_output(tmp_path / "new.json", "{}")
        assert stat.S_IMODE(new.stat().st_mode) == 0o640
        kept = tmp_path / "kept.json"
        kept.write_text("{}")
        kept.chmod(0o644)
        write_output(kept, "[]")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_temporary_names_are_unique_and_hidden(tmp_path):
    names = {temporary_name(tmp_path / "nodes.parquet") for _ in range(100)}
    assert len(names) == 100
    assert all(os.path.basename(n).startswith(".nodes.parquet.") for n in names)


def test_strict_json_has_no_nan(tmp_path):
    path = write_json(tmp_path / "a.json", {"x": float("nan"), "y": [float("inf"), 1.5]})
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(c)) == {
        "x": None,
        "y": [None, 1.5],
    }
    assert "NaN" not in json_text({"x": float("nan")})


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[1, 2]", "must hold a JSON object, got a list"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"{", "not valid JSON"),
    ],
)
def test_unusable_json_files_are_named(tmp_path, content, message):
    path = tmp_path / "manifest.json"
    path.write_bytes(content)
    with pytest.raises(_Error, match=message) as e:
        read_json_object(path, _Error, "manifest")
    assert str(path) in str(e.value)
    with pytest.raises(_Error, match="does not exist"):
        read_json_object(tmp_path / "absent.json", _Error)
    with pytest.raises(_Error, match="is a directory"):
        read_json_object(tmp_path, _Error)


def test_an_output_equal_to_an_input_or_a_runs_own_file_is_refused(tmp_path):
    policy = tmp_path / "policy.json"
    policy.write_text("{}")
    with pytest.raises(OutputError, match="also this command's input"):
        check_output(policy, inputs=(policy,))
    run = tmp_path / "run"
    (run / "parts" / "nodes").mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    for owned in ("manifest.json", "nodes.parquet", "parts/nodes/000000-a.parquet"):
        with pytest.raises(OutputError, match="owns in the run directory"):
            check_output(run / owned)
    assert check_output(run / "my-policy.json") == run / "my-policy.json"
    with pytest.raises(OutputError, match="URI"):
        check_output("s3://bucket/x.json")
    assert str(local_location("file:///tmp/x", "--out")) == "/tmp/x"
    with pytest.raises(OutputError, match="s3://"):
        local_location("s3://bucket/x", "--out")


def test_failures_of_the_machine_are_one_line():
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/runs/a/parts/x.parquet")
    assert describe(full) == (
        "/runs/a/parts/x.parquet: No space left on device (free space, or write elsewhere)"
    )
    assert "not UTF-8" in describe(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"))
    assert describe(RecursionError()) == "input is nested too deeply to be read"


def test_dev_stdout_redirected_to_a_file_is_written_into_not_replaced(tmp_path):
    # before: -o /dev/stdout went through a temporary in /dev and replaced the link (as root)
    import subprocess
    import sys

    captured = tmp_path / "captured.json"
    code = "from specscope.files import write_output; write_output('/dev/stdout', '{}\\n')"
    with open(captured, "wb") as sink:
        subprocess.run([sys.executable, "-c", code], stdout=sink, check=True)
    assert captured.read_text() == "{}\n"
    assert os.path.islink("/dev/stdout")


@pytest.mark.parametrize(
    "content, message",
    [
        (b'name = "caf\xe9"', "not UTF-8"),
        (b"name = ", "not valid TOML"),
        (b"a = " + b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_unusable_toml_files_are_named(tmp_path, content, message):
    from specscope.files import read_toml_table

    path = tmp_path / "sweep.toml"
    path.write_bytes(content)
    with pytest.raises(_Error, match=message) as e:
        read_toml_table(path, _Error, "sweep file")
    assert str(path) in str(e.value)
    (tmp_path / "ok.toml").write_text('name = "x"')
    assert read_toml_table(tmp_path / "ok.toml", _Error) == {"name": "x"}
