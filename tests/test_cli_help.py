"""Issue 61, ``--help`` keeps the words users need: every help text as written (rich markup swallowed
``[plot]``), options grouped in panels, choices listed, flags shown as flags, and each command's
own default."""

from __future__ import annotations

import functools

import pytest
from typer.testing import CliRunner

from specscope.cli import app
from specscope.cli.reference import commands, param_docs


WIDE = {"COLUMNS": "4000", "TERMINAL_WIDTH": "4000"}  # no help text wrapped


@functools.cache
def _help(name: str) -> str:
    """``specscope NAME --help`` on a wide terminal, its box drawing and line breaks removed."""
    result = CliRunner().invoke(app, [name, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    return " ".join(result.stdout.replace("│", " ").split())


def _flat(text: str) -> str:
    return " ".join(text.split())


COMMANDS = [name for name, _, _ in commands()]


@pytest.mark.parametrize("name", COMMANDS)
def test_help_shows_what_the_reference_says_of_each_option(name):
    shown = _help(name)
    command_help = next(c for n, _, c in commands() if n == name).help or ""
    assert _flat(command_help.split("\n\n")[0]) in shown
    for doc in param_docs():
        if doc.command != name:
            continue
        assert _flat(doc.help) in shown, (doc.name, doc.help)
        if doc.kind == "option":
            for part in (*doc.name.split("/"), *doc.short):
                assert f" {part} " in f" {shown} ", (doc.name, part)


def test_bracketed_words_are_shown_as_written():
    assert "(needs the [plot] extra)" in _help("analyze")
    assert "a sweep file's [execution] batch_size" in _help("sweep")
    assert "engine, [fallback] and [domains.NAME] tables of url and model" in _help("gateway")
    listing = CliRunner().invoke(app, ["--help"], env=WIDE).stdout
    assert "Acceptance dynamics" in listing
