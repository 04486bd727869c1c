"""Tables whole in logs: a console writing to a file or a pipe is not cut to 80 columns."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from rich.table import Table

from specscope.console import LOG_WIDTH, make_console


def test_console_off_a_terminal_is_wide():
    console = make_console()  # pytest captures stdout: not a terminal
    assert not console.is_terminal and console.width == LOG_WIDTH
    assert make_console(stderr=True).width == LOG_WIDTH


def test_a_wide_table_in_a_log_keeps_every_header_and_cell(monkeypatch):
    console = make_console()
    buffer = io.StringIO()
    console.file = buffer
    table = Table(title="certificates")
    for name in ("domain", "criterion", "frac_certified", "statistic", "reasoning_share"):
        table.add_column(name)
    table.add_row("reasoning", "multiplicative", "0.779 [0.764, 0.794]", "median", "0.123456789")
    console.print(table)
    text = buffer.getvalue()
    assert "…" not in text
    for word in ("frac_certified", "multiplicative", "0.779 [0.764, 0.794]", "reasoning_share"):
        assert word in text
    assert max(len(line) for line in text.splitlines()) > 80


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    from lab.synthetic import write_synthetic_run

    return write_synthetic_run(
        tmp_path_factory.mktemp("run") / "run", prompts_per_domain=3, steps=(4, 8)
    )


def test_analyze_redirected_to_a_file_is_not_truncated(small_run, tmp_path):
    """The README's command with its output redirected: every table whole in the file."""
    log = tmp_path / "log.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "COLUMNS": "80"}
    with log.open("w") as f:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "specscope.cli",
                "analyze",
                str(small_run),
                "--boot",
                "20",
                "--no-plots",
                "--show",
                "all",
                "--out",
                str(tmp_path / "a"),
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=300,
            check=False,
        )
    text = log.read_text()
    assert done.returncode == 0, text
    assert "…" not in text
    lines = text.splitlines()
    # each table's header on one line (at 80 columns rich folds or cuts them over several)
    for headers in (
        ("Domain", "Prompts", "Echo share", "Prompts >= 90% copied", "Whole output in prompt"),
        ("Claim", "Figure [95% CI]", "Verdict"),
    ):
        assert any(all(h in line for h in headers) for line in lines), headers
    assert any("Prompt echo: output words copied from the prompt" in line for line in lines)


class Recorder:
    """A Progress that records what it is told."""

    def __init__(self):
        self.events = []

    def start(self, what, unit, tally):
        self.events.append(("start", what, unit, tally.done, tally.total))

    def update(self, tally):
        self.events.append(("update", tally.done, tally.total))

    def note(self, message, level="info"):
        self.events.append(("note", message))

    def stop(self):
        self.events.append(("stop",))


def test_long_stages_report_to_the_current_observer(small_run, tmp_path):
    # analyze, certify, ingest, bench, tune's timing and the llama-server requests report through
    # counting(): start, one update per unit, stop, to whatever observer the caller made current
    from specscope.analysis import analyze
    from specscope.progress import counting, reporting

    recorder = Recorder()
    with reporting(recorder):
        with counting("work", "items", 3, done=1) as advance:
            advance()
            advance()
        analyze(small_run)
    assert recorder.events[:4] == [
        ("start", "work", "items", 1, 3),
        ("update", 2, 3),
        ("update", 3, 3),
        ("stop",),
    ]
    assert recorder.events[4:] == [
        ("start", "analyzing", "stages", 0, 3),
        ("update", 1, 3),
        ("update", 2, 3),
        ("update", 3, 3),
        ("stop",),
    ]


def test_the_bar_shows_time_remaining_and_stacks_inner_stages():
    from rich.console import Console

    from specscope.cli.progress import ProgressBar
    from specscope.progress import counting, reporting

    bar = ProgressBar()
    buffer = io.StringIO()
    bar.console = Console(file=buffer, force_terminal=True, color_system=None, width=150)
    with reporting(bar):
        with counting("outer", "prompts", 2) as outer:
            with counting("inner", "timings", 4) as inner:
                inner(4)
            outer(2)
    text = buffer.getvalue()
    assert "inner" in text and "0/4 timings" in text  # drawn below the outer while it ran
    assert "2/2 prompts" in text and "left" in text  # the outer drawn at its end
    assert bar.rich is None and bar.tasks == []  # every bar closed


def test_off_a_terminal_the_bar_is_quiet():
    from specscope.cli.progress import ProgressBar
    from specscope.progress import counting, reporting

    bar = ProgressBar()
    buffer = io.StringIO()
    bar.console.file = buffer  # not a terminal: notes only
    with reporting(bar), counting("work", "items", 2) as advance:
        advance(2)
        bar.note("a note")
    assert buffer.getvalue() == "a note\n"
