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
    assert "the sweep file's [execution] batch_size" in _help("sweep")
    assert "engine, [fallback] and [domains.NAME] tables of url and model" in _help("gateway")
    listing = CliRunner().invoke(app, ["--help"], env=WIDE).stdout
    assert "Acceptance dynamics" in listing


@pytest.mark.parametrize("name", ["run", "decode", "bench"])
def test_the_big_commands_group_their_options_in_panels(name):
    from specscope.cli.helptext import OPTION_PANELS

    result = CliRunner().invoke(app, [name, "--help"], env=WIDE)
    panels = [
        line.split("─ ", 1)[1].split(" ─")[0]
        for line in result.stdout.splitlines()
        if line.startswith("╭─ ") and "Arguments" not in line
    ]
    assert panels[0] == "Options" and panels[1:] == [p for p in OPTION_PANELS if p in panels]
    assert {"models", "tree", "prompts", "execution"} <= set(panels)


def test_choices_are_listed_and_are_the_librarys():
    from specscope.cli import options
    from specscope.drafters import DRAFTERS
    from specscope.models.config import DTYPES
    from specscope.prompts.render import RENDERINGS
    from specscope.run.config import ENGINES
    from specscope.sweep.executors import EXECUTORS
    from specscope.trees import POLICIES
    from specscope.tune.bench import ROUTERS
    from specscope.tune.choose import DRAFT_ATTENTIONS
    from specscope.tune.policy import SPECULATIONS

    assert set(options.DTYPES) == {*DTYPES, "auto"}
    assert options.MEASURED_POLICIES == POLICIES
    assert set(options.DECODE_POLICIES) == set(SPECULATIONS)
    assert options.DRAFTER_KINDS == tuple(DRAFTERS)
    assert options.RENDERINGS == tuple(RENDERINGS)
    assert options.MEASURE_ENGINES == ENGINES
    assert options.DRAFT_ATTENTIONS == DRAFT_ATTENTIONS
    assert "<local|ray>" in _help("sweep") and tuple(EXECUTORS) == ("local", "ray")
    assert "<rules|learned>" in _help("bench") and ROUTERS == ("rules", "learned")
    assert "<bfloat16|float16|float32|auto>" in _help("decode")
    assert "<paper|paper-text|chain|static>" in _help("run")
    assert "<paper|paper-text|chain|static|dynamic|optimal|none>" in _help("decode")
    assert "<cached|naive>" in _help("run") and "<sdpa|rowwise>" in _help("bench")
    assert "<draft-model|ngram|llama-ngram-simple|early-exit>" in _help("decode")


def test_a_value_not_among_the_choices_is_one_line_naming_them():
    result = CliRunner().invoke(app, ["decode", "hi", "--rendering", "html"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "allowed: task, chat, raw" in result.stderr


@pytest.mark.parametrize("name", COMMANDS)
def test_flags_show_no_type(name):
    assert "<bool>" not in _help(name)


def test_each_command_shows_its_own_default():
    tune, decode, run = _help("tune"), _help("decode"), _help("run")
    assert (
        "1 to 4096" not in tune
        and "[1<=x<=256]" in tune
        and "Default: 32, at most 256: the largest tree tune considers." in tune
    )
    assert "Default: paper 8, dynamic 16, optimal 16." in decode and "256" not in decode
    assert "Default: chain." in decode and "Default: chain" not in run
    assert "Default: the config's, else auto." in run and "bfloat16 (passes" not in run


def test_run_measure_engine_and_its_old_name():
    assert " --measure-engine " in _help("run") and " --engine " not in _help("run")
    result = CliRunner().invoke(app, ["run", "--engine", "naive", "--help"])
    assert result.exit_code == 0 and "note: --engine is now --measure-engine" in result.stderr


def test_version():
    from specscope import __version__

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"specscope {__version__}\n"
