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
    from specscope.analysis.synthetic import write_synthetic_run

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
