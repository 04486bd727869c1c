"""Issue 36, one command line: every command has help text and a help panel, every old option name
still works and says its new name, and lists read the same way everywhere."""

from __future__ import annotations

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from specscope.cli import app
from specscope.cli.app import PANELS
from specscope.cli.options import RENAMED, meaning, names, rename_args, renamed_for

# An old name's value that parses (the command stops at --help before doing any work).
VALUES = {
    "--n-boot": ["5"],
    "--repetitions": ["5"],
    "--costs": ["grid.json"],
    "--threads": ["2"],
    "--draft-threads": ["2"],
    "--poll": ["0"],
    "--policy": ["policy.json"],
    "--engine": ["cached"],
    "--backend": ["http://127.0.0.1:8000"],
}


def _commands():
    return get_command(app).commands


def _takes(command: str, option: str) -> bool:
    return any(option in (*p.opts, *p.secondary_opts) for p in _commands()[command].params)


def _uses():
    """(command, renamed) for every command an old name applies to: those it names, or (a rename
    of every command) each command that takes the new name."""
    for rename in RENAMED:
        for name in rename.commands or sorted(_commands()):
            if rename.commands or _takes(name, rename.new[0]):
                yield name, rename


def test_every_command_has_help_text_and_a_panel():
    for name, command in _commands().items():
        assert (command.help or "").strip(), f"{name} has no help text"
        assert command.rich_help_panel in PANELS, f"{name} is in no help panel"
        for param in command.params:
            if param.param_type_name == "option" and not param.hidden:
                assert (param.help or "").strip(), f"{name} {param.opts[0]} has no help text"


def test_every_old_name_names_a_new_option_of_its_commands():
    uses = list(_uses())
    assert {rename.old for _, rename in uses} == {rename.old for rename in RENAMED}
    for name, rename in uses:
        assert _takes(name, rename.new[0]), (name, rename)


@pytest.mark.parametrize("name, rename", list(_uses()), ids=lambda x: getattr(x, "old", x))
def test_an_old_name_still_works_and_says_its_new_name(name, rename):
    result = CliRunner().invoke(app, [name, rename.old, *VALUES.get(rename.old, []), "--help"])
    assert result.exit_code == 0, result.output
    assert f"note: {rename.old} is now {' '.join(rename.new)}" in result.stderr
    assert result.stderr.count("note:") == 1


@pytest.mark.parametrize("name, rename", list(_uses()), ids=lambda x: getattr(x, "old", x))
def test_an_old_name_is_not_in_the_help(name, rename):
    help_text = CliRunner().invoke(app, [name, "--help"], terminal_width=200).stdout
    assert f" {rename.old} " not in help_text.replace("│", " ").replace(",", " ")


def test_old_names_become_the_new_form_with_their_values():
    assert rename_args("analyze", ["r", "--n-boot", "7"]) == ["r", "--boot", "7"]
    assert rename_args("llamacpp", ["r", "--n-boot=7"]) == ["r", "--boot=7"]
    assert rename_args("decode", ["hi", "--no-chat-template"]) == ["hi", "--rendering", "raw"]
    assert rename_args("decode", ["hi", "--chat-template"]) == ["hi", "--rendering", "chat"]
    assert rename_args("llamacpp", ["r", "--repetitions", "5"]) == ["r", "--repeats", "5"]
    assert rename_args("certify", ["r", "--no-plot"]) == ["r", "--no-plots"]
    # a rename belongs to its commands: tune's --costs is a cost model, and stays
    assert rename_args("tune", ["r", "--costs", "c.json"]) == ["r", "--costs", "c.json"]
    # nothing after -- is an option
    assert rename_args("analyze", ["--", "--n-boot"]) == ["--", "--n-boot"]
    notes = []
    rename_args("gateway", ["d.toml", "--policy", "p.json"], notes.append)
    assert notes == ["note: --policy is now --policy-file"]
    assert set(renamed_for("llamacpp")) >= {"--repetitions", "--n-boot"}


def test_decode_takes_the_renderings_that_run_takes():
    decode = {p.name: p for p in _commands()["decode"].params}
    run = {p.name: p for p in _commands()["run"].params}
    assert meaning(decode["rendering"].help) == meaning(run["rendering"].help)
    assert "chat_template" not in decode


def test_a_list_is_repeated_or_comma_separated():
    assert names(["code,math", "chat"]) == ("code", "math", "chat")
    assert names(["code", " math ,"]) == ("code", "math")
    assert names([]) is None and names(None) is None and names([","]) is None


# --- the reference pages, and one meaning per name ------------------------------------------------

# Option names whose meaning (help) genuinely differs between commands, each with the reason.
HELP_MAY_DIFFER = {
    # where a command writes: a run directory, a policy file, an HTML page, tables ... each
    # command's help says what it writes there
    "--out": "each command's own output",
    # export names the models as the serving engine loads them (a path it reads, a GGUF file for
    # llama.cpp); specscope loads nothing there
    "--draft": "export: the engine's model, not one specscope loads",
    "--target": "export: the engine's model, not one specscope loads",
    # a running server's URL, NAME=URL: bench names a setting by it, the gateway a domain
    "--url": "bench: a setting's server; gateway: a domain's",
    # the engine: tune's policy is for it, bench times it (bench also times servers at URLs)
    "--backend": "tune: the engine a policy is for; bench: the engine timed",
}
# (option, command) whose default genuinely differs from the option's own (None: the config's).
DEFAULT_MAY_DIFFER = {
    **{("--out", c): "each command's own output" for c in ("run", "ingest")},
    ("--policy", "decode"): "decode has no config: it decodes with a chain by default",
    ("--max-nodes", "tune"): "tune's search bound, not one tree's budget",
    ("--prompts", "ingest"): "ingest joins a log to its prompts: they are required",
    ("--per-domain", "bench"): "bench times every method on each prompt: 2 keeps it to minutes",
    ("--per-domain", "llamacpp"): "10 held-out prompts a domain: llama-server is fast enough",
    ("--max-new-tokens", "decode"): "decode has no config",
    ("--max-new-tokens", "llamacpp"): "llamacpp has no config",
    ("--max-new-tokens", "tune"): "tune --backend llama-server has no config (llamacpp's 64)",
    ("--max-prompt-tokens", "decode"): "decode has no config",
}


def _options_by_name():
    from specscope.cli.reference import param_docs

    by_name = {}
    for doc in param_docs():
        if doc.kind == "option":
            by_name.setdefault(doc.name, []).append(doc)
    return by_name


def test_no_option_name_carries_two_meanings():
    """One meaning: the help before each command's own default (options.own_defaults)."""
    for name, uses in _options_by_name().items():
        if name not in HELP_MAY_DIFFER:
            assert len({meaning(u.help) for u in uses}) == 1, (
                f"{name} means different things in " + ", ".join(u.command for u in uses)
            )


def test_no_option_name_carries_two_defaults():
    differ = set()
    for name, uses in _options_by_name().items():
        counts = {}
        for use in uses:
            counts.setdefault(use.default, []).append(use.command)
        # the option's own default: none (the config's, or the command's own choice) where any
        # command has none, else the most common
        usual = "-" if "-" in counts else max(counts, key=lambda d: len(counts[d]))
        differ |= {(name, c) for d, cs in counts.items() if d != usual for c in cs}
    assert differ == set(DEFAULT_MAY_DIFFER)


def test_a_short_name_is_one_option_everywhere():
    seen = {}
    for name, uses in _options_by_name().items():
        for use in uses:
            for short in use.short:
                assert seen.setdefault(short, name) == name, (short, name, seen[short])


def test_the_reference_pages_are_current():
    from pathlib import Path

    from specscope.cli.reference import commands_markdown, options_markdown

    reference = Path(__file__).resolve().parent.parent / "docs" / "reference"
    fix = "run python scripts/cli_reference.py"
    assert (reference / "cli.md").read_text() == commands_markdown(), fix
    assert (reference / "options.md").read_text() == options_markdown(), fix
    for name in _options_by_name():
        assert f"`{name}`" in (reference / "options.md").read_text()


# --- merged commands ----------------------------------------------------------------------------------


def test_drafters_is_compare_by_drafter_and_still_works(tmp_path):
    commands = _commands()
    assert commands["drafters"].hidden and _takes("compare", "--by-drafter")
    listing = CliRunner().invoke(app, ["--help"], terminal_width=200).stdout
    assert "│ drafters " not in listing and "│ compare " in listing
    result = CliRunner().invoke(app, ["drafters", str(tmp_path / "missing")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(
        "note: specscope drafters is now specscope compare --by-drafter"
    )
    assert "error:" in result.stderr and "missing" in result.stderr
    by_drafter = CliRunner().invoke(app, ["compare", "--by-drafter", str(tmp_path / "missing")])
    assert by_drafter.exit_code == 2 and by_drafter.stderr == result.stderr.split("\n", 1)[1]


def test_compare_of_three_runs_asks_for_by_drafter_or_a_sweep(tmp_path):
    result = CliRunner().invoke(app, ["compare", "a", "b", "c"])
    assert result.exit_code == 2
    assert "compare takes one run or two, got 3" in result.stderr
    assert "--by-drafter" in result.stderr
