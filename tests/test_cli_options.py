"""Issue 36, one command line: every command has help text and a help panel, every old option name
still works and says its new name, and lists read the same way everywhere."""

from __future__ import annotations

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from specscope.cli import app
from specscope.cli.app import PANELS
from specscope.cli.options import RENAMED, names, rename_args, renamed_for

# An old name's value that parses (the command stops at --help before doing any work).
VALUES = {
    "--boot": ["5"],
    "--repetitions": ["5"],
    "--costs": ["grid.json"],
    "--threads": ["2"],
    "--draft-threads": ["2"],
    "--poll": ["0"],
    "--policy": ["policy.json"],
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
    assert rename_args("analyze", ["r", "--boot", "7"]) == ["r", "--n-boot", "7"]
    assert rename_args("analyze", ["r", "--boot=7"]) == ["r", "--n-boot=7"]
    assert rename_args("decode", ["hi", "--no-chat-template"]) == ["hi", "--rendering", "raw"]
    assert rename_args("decode", ["hi", "--chat-template"]) == ["hi", "--rendering", "chat"]
    assert rename_args("llamacpp", ["r", "--costs", "g.json"]) == ["r", "--cost-grid", "g.json"]
    assert rename_args("certify", ["r", "--no-plot"]) == ["r", "--no-plots"]
    # a rename belongs to its commands: tune's --costs is a cost model, and stays
    assert rename_args("tune", ["r", "--costs", "c.json"]) == ["r", "--costs", "c.json"]
    # nothing after -- is an option
    assert rename_args("analyze", ["--", "--boot"]) == ["--", "--boot"]
    notes = []
    rename_args("gateway", ["d.toml", "--policy", "p.json"], notes.append)
    assert notes == ["note: --policy is now --policy-file"]
    assert set(renamed_for("llamacpp")) >= {"--costs", "--threads", "--poll", "--boot"}


def test_decode_takes_the_renderings_that_run_takes():
    decode = {p.name: p for p in _commands()["decode"].params}
    run = {p.name: p for p in _commands()["run"].params}
    assert decode["rendering"].help == run["rendering"].help
    assert "chat_template" not in decode


def test_a_list_is_repeated_or_comma_separated():
    assert names(["code,math", "chat"]) == ("code", "math", "chat")
    assert names(["code", " math ,"]) == ("code", "math")
    assert names([]) is None and names(None) is None and names([","]) is None
