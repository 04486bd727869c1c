"""Issue 36, the library silent: a run and a sweep report to the observer their caller passes in
and write nothing to the terminal themselves; what the speculating commands decide is library
code that returns tables, not printed ones."""

from __future__ import annotations

import json

import pytest

from specscope.progress import SILENT, Tally, observer
from specscope.sweep.driver import SweepBoard
from specscope.sweep.executors import ShardResult


class Recorder:
    """A Progress that keeps every call."""

    def __init__(self):
        self.calls = []

    def start(self, what, unit, tally):
        self.calls.append(("start", what, unit, tally))

    def update(self, tally):
        self.calls.append(("update", tally))

    def note(self, message, level="info"):
        self.calls.append(("note", message, level))

    def stop(self):
        self.calls.append(("stop",))


def _shard(label: str, prompts: int, nodes: int, error: str | None = None) -> ShardResult:
    return ShardResult(f"{label}-0", label, prompts, nodes, 2.0, {}, "host:1", error)


def test_a_sweep_board_tells_its_observer_every_shard_and_failure():
    recorder = Recorder()
    with SweepBoard(4, 1, recorder) as board:
        board.prompt_done(10)
        board.shard_done(_shard("a", 2, 30))
        board.shard_done(_shard("b", 0, 0, "worker died"))
    kinds = [call[0] for call in recorder.calls]
    assert kinds == ["start", "update", "update", "note", "update", "stop"]
    start = recorder.calls[0]
    assert start[1:3] == ("sweep", "shards") and (start[3].done, start[3].total) == (1, 4)
    first, last = recorder.calls[2][1], recorder.calls[4][1]
    assert (first.done, first.prompts, first.nodes) == (2, 2, 30)  # the live prompt replaced
    assert (last.done, last.prompts, last.nodes) == (3, 2, 30)
    assert recorder.calls[3][1:] == ("shard b-0 failed: worker died", "error")
    assert board.seconds == {"a": 2.0, "b": 2.0} and len(board.failures) == 1


def test_no_observer_is_silent():
    assert observer(None) is SILENT and observer(False) is SILENT
    recorder = Recorder()
    assert observer(recorder) is recorder
    assert Tally(1, 2, 1, 50, 2.0).nodes_per_s == 25.0 and Tally(0, 2, 0, 0, 0.0).nodes_per_s == 0


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    items = [{"id": f"p{i}", "domain": "chat", "prompt": f"Question {i}?"} for i in range(2)]
    path.write_text("".join(json.dumps(x) + "\n" for x in items))
    return path


def test_a_run_reports_each_prompt_to_its_observer_and_prints_nothing(
    tiny_dirs, prompt_file, tmp_path, capfd
):
    from specscope.run.config import RunConfig, load_config

    config: RunConfig = load_config(None).replace(
        **{
            "pair.draft": str(tiny_dirs["qwen2", "draft"]),
            "pair.target": str(tiny_dirs["qwen2", "target"]),
            "pair.dtype": "float32",
            "prompts.file": str(prompt_file),
            "prompts.domains": (),
            "prompts.per_domain": None,
            "tree.policy": "chain",
            "tree.depth": 2,
            "max_new_tokens": 3,
        }
    )
    from specscope.run.study import run_study

    recorder = Recorder()
    summary = run_study(config, tmp_path / "run", progress=recorder)
    assert summary.prompts_measured == 2
    updates = [c[1] for c in recorder.calls if c[0] == "update"]
    assert recorder.calls[0][:3] == ("start", "measuring", "prompts")
    assert [(t.done, t.total) for t in updates] == [(1, 2), (2, 2)]
    assert updates[-1].nodes == summary.nodes and recorder.calls[-1] == ("stop",)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    again = run_study(config, tmp_path / "run")  # complete: nothing to observe
    assert again.already_complete


def test_a_decode_choice_is_made_without_the_command_line():
    from specscope.drafters import DrafterConfig
    from specscope.tune.acceptance import PolicyError
    from specscope.tune.choose import TreeRequest, choose_speculation

    choice = choose_speculation(TreeRequest("chain", depth=3), "hello")
    assert choice.speculation.is_chain and choice.speculation.max_depth == 3
    assert choice.drafter == DrafterConfig() and choice.domain is None
    assert choose_speculation(TreeRequest("none"), "hi").speculation is None
    with pytest.raises(PolicyError, match="unknown policy 'bushy'"):
        choose_speculation(TreeRequest("bushy"), "hi")


def test_work_deep_under_a_call_tells_the_current_observer_and_nothing_else(capsys):
    """A warning made while a config is read (as model loading's notes) goes to the observer
    made current with ``reporting``; outside one it is dropped, never printed."""
    from specscope.progress import current, reporting
    from specscope.run.config import remote_code_from_command_line

    recorder = Recorder()
    with reporting(recorder) as shown:
        assert current() is shown is recorder
        pair = remote_code_from_command_line({"trust_remote_code": True}, False, "a.toml")
    assert pair["trust_remote_code"] is False
    assert current() is SILENT
    assert [c[0] for c in recorder.calls] == ["note"] and recorder.calls[0][2] == "warning"
    assert "a.toml asks for trust_remote_code" in recorder.calls[0][1]
    remote_code_from_command_line({"trust_remote_code": True}, False, "b.toml")
    assert capsys.readouterr() == ("", "")
