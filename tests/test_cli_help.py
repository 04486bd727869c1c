"""Issue 61, ``--help`` keeps the words users need: every help text as written (rich markup swallowed
``[plot]``), options grouped in panels, choices listed, flags shown as flags, and each command's
own default."""

from __future__ import annotations

import enum
import functools
import re
import typing

import pytest
from typer.testing import CliRunner

from specscope.cli import app
from specscope.cli.helptext import OPTION_PANELS
from specscope.cli.options import DEFAULT_WORDS, listed, meaning, one_of
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


def _command(name: str):
    return next(c for n, _, c in commands() if n == name)


def _options(name: str) -> list:
    """The options ``specscope NAME --help`` lists, but --help itself."""
    return [
        p
        for p in _command(name).params
        if p.param_type_name == "option" and p.name != "help" and not p.hidden
    ]


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


# A command of more than a handful of options shows them in panels: typer's own "Options" keeps
# --help and at most one more (run's --config, which the options in the panels override).
HANDFUL = 4


@pytest.mark.parametrize("name", COMMANDS)
def test_a_command_of_many_options_groups_them_in_panels(name):
    result = CliRunner().invoke(app, [name, "--help"], env=WIDE)
    panels = [
        line.split("─ ", 1)[1].split(" ─")[0]
        for line in result.stdout.splitlines()
        if line.startswith("╭─ ") and "Arguments" not in line
    ]
    assert panels[0] == "Options" and panels[1:] == [p for p in OPTION_PANELS if p in panels]
    if len(_options(name)) > HANDFUL:
        loose = [p.opts[0] for p in _options(name) if p.rich_help_panel not in OPTION_PANELS]
        assert len(loose) <= 1, (name, loose)


def _declared(param) -> tuple[str, ...]:
    """The values an option declares it takes: its type's (an Enum or a Literal), or its
    metavar's ``<a|b|c>``."""
    kind = param.type_descriptor.annotation
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return tuple(str(member.value) for member in kind)
    if typing.get_origin(kind) is typing.Literal:
        return tuple(map(str, typing.get_args(kind)))
    return listed(param.metavar)


@functools.cache
def _library_choices() -> dict[str, tuple[str, ...]]:
    """Every fixed set of values the library takes for an option, by what it is."""
    from specscope.analysis.effects import STRATIFIERS
    from specscope.analysis.headline import SHOWS
    from specscope.analysis.tables import AUTO
    from specscope.drafters import DRAFTERS
    from specscope.models.config import DTYPES
    from specscope.prompts.render import RENDERINGS
    from specscope.run.config import ENGINES
    from specscope.serving.export import ENGINES as EXPORT_ENGINES
    from specscope.serving.ingest import JOINS
    from specscope.serving.ingest.formats import FORMATS
    from specscope.sweep.executors import EXECUTORS
    from specscope.tune.bench import BACKENDS, ROUTERS
    from specscope.tune.choose import DRAFT_ATTENTIONS
    from specscope.tune.policy import SPECULATIONS

    return {
        "dtype": (*DTYPES, "auto"),
        "speculation": tuple(SPECULATIONS),
        "drafter": tuple(DRAFTERS),
        "rendering": tuple(RENDERINGS),
        "measurement engine": ENGINES,
        "draft attention": DRAFT_ATTENTIONS,
        "executor": tuple(EXECUTORS),
        "router": ROUTERS,
        "bench backend": BACKENDS,
        "serving engine": tuple(EXPORT_ENGINES),
        "log format": tuple(FORMATS),
        "join": JOINS,
        "show": SHOWS,
        "stratification": (AUTO, *STRATIFIERS, "none"),
    }


def _names_all(text: str, values: tuple[str, ...]) -> bool:
    return all(re.search(rf"(?<![\w.-]){re.escape(v)}(?![\w-])", text) for v in values)


@pytest.mark.parametrize("name", COMMANDS)
def test_an_option_of_fixed_values_lists_them(name):
    """An option whose values are one of the library's fixed sets declares them (--help shows
    ``<a|b|c>``), and only those; one that names a whole set in its help but declares none
    fails here."""
    shown = _help(name)
    for param in _options(name):
        values = _declared(param)
        if values:
            assert one_of(values) in shown, (name, param.opts[0])
            assert any(set(values) <= set(s) for s in _library_choices().values()), values
            assert param.default is None or param.default in values, (name, param.opts[0])
        elif not param.multiple and not param.is_flag:  # (two values are too often prose)
            for kind, fixed in _library_choices().items():
                named = len(fixed) > 2 and _names_all(param.help or "", fixed)
                assert not named, (name, param.opts[0], kind)


def test_choices_are_listed_and_are_the_librarys():
    from specscope.cli import options
    from specscope.trees import POLICIES

    library = _library_choices()
    assert set(options.DTYPES) == set(library["dtype"])
    assert options.MEASURED_POLICIES == POLICIES
    assert set(options.DECODE_POLICIES) == set(library["speculation"])
    assert options.DRAFTER_KINDS == library["drafter"]
    assert options.RENDERINGS == library["rendering"]
    assert options.MEASURE_ENGINES == library["measurement engine"]
    assert options.DRAFT_ATTENTIONS == library["draft attention"]
    assert options.EXECUTORS == library["executor"] and options.ROUTERS == library["router"]
    assert options.BENCH_BACKENDS == library["bench backend"]
    assert options.EXPORT_ENGINES == library["serving engine"]
    assert options.INGEST_FORMATS == library["log format"] and options.JOINS == library["join"]
    assert options.SHOWS == library["show"] and options.STRATIFY == library["stratification"]
    assert "<local|ray>" in _help("sweep") and "<rules|learned>" in _help("bench")
    assert "<vllm|sglang|llama.cpp|trtllm|transformers>" in _help("export")
    assert "<vllm|sglang|llama.cpp|spec-bench|aiperf>" in _help("ingest")
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
    for param in _options(name):
        if param.type_descriptor.annotation is bool:
            assert param.is_flag, (name, param.opts[0])


def test_a_help_that_commands_share_names_no_default():
    """A shared option's help is its one meaning; each command's default follows it in that
    command's own words (options.own_defaults), so no command's help describes another's default,
    nor says its own twice."""
    by_name: dict[str, list] = {}
    for doc in param_docs():
        if doc.kind == "option":
            by_name.setdefault(doc.name, []).append(doc)
    for name, uses in by_name.items():
        meanings = {meaning(u.help) for u in uses}
        if len(uses) > 1 and len(meanings) == 1:
            assert "default" not in meanings.pop().lower(), name
    for name in COMMANDS:
        for param in _options(name):
            if DEFAULT_WORDS in (param.help or "") and param.default is not None:
                assert not param.show_default, (name, param.opts[0])


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
