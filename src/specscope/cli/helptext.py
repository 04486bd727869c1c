"""How ``--help`` shows the command line: every help text as written, flags as flags.

typer renders help with rich markup, where ``[plot]`` or ``[domains.NAME]`` is a style tag and
vanishes; specscope's help texts hold no markup, so each is escaped as it is shown (the click
objects, and the reference pages read off them, keep the words as written). Options are shown
panel by panel (:data:`OPTION_PANELS`). A flag (``--quiet``, ``--plots/--no-plots``) shows no
``<bool>`` type: it takes no value. Nothing here parses.
"""

from __future__ import annotations

import copy

from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

# The help panels of a command's options, in the order --help shows them (after typer's own
# "Options", which holds --help and any option of no panel): what is decoded (models, tree,
# drafter, prompts), what is chosen or analysed (tuning, analysis), what is served (engine: the
# serving engine and its backends; server: the gateway's own listening side), then how the command
# runs and what it writes.
MODELS, TREE, DRAFTER, PROMPTS = "models", "tree", "drafter", "prompts"
TUNING, ANALYSIS, ENGINE, SERVER = "tuning", "analysis", "engine", "server"
EXECUTION, OUTPUT = "execution", "output"
OPTION_PANELS = (
    MODELS,
    TREE,
    DRAFTER,
    PROMPTS,
    TUNING,
    ANALYSIS,
    ENGINE,
    SERVER,
    EXECUTION,
    OUTPUT,
)


def _panel_order(param) -> int:
    panel = getattr(param, "rich_help_panel", None)
    return OPTION_PANELS.index(panel) if panel in OPTION_PANELS else -1


def _shown_param(param):
    shown = copy.copy(param)
    if getattr(shown, "help", None):
        shown.help = escape(shown.help)
    if getattr(shown, "is_flag", False) and not getattr(shown, "count", False):
        shown.metavar = ""  # typer shows the metavar in place of the type: none for a flag
    return shown


def as_shown(command, ctx):
    """A copy of ``command`` whose help texts are escaped for rich and whose flags show no type;
    a group's commands too."""
    shown = copy.copy(command)
    if shown.help:
        shown.help = escape(shown.help)
    if shown.short_help:
        shown.short_help = escape(shown.short_help)
    params = sorted((_shown_param(p) for p in command.get_params(ctx)), key=_panel_order)
    shown.params = params
    shown.get_params = lambda _ctx: params
    if isinstance(command, TyperGroup):
        commands = {name: as_shown(c, ctx) for name, c in command.commands.items()}
        shown.commands = commands
        shown.get_command = lambda _ctx, name: commands.get(name)
    return shown


def _format_help(command, cls, ctx, formatter) -> None:
    if command.rich_markup_mode != "rich":
        return super(cls, command).format_help(ctx, formatter)
    from typer import rich_utils

    return rich_utils.rich_format_help(obj=as_shown(command, ctx), ctx=ctx, markup_mode="rich")


class AsWrittenCommand(TyperCommand):
    """A typer command whose ``--help`` shows its help texts as written."""

    def format_help(self, ctx, formatter) -> None:
        _format_help(self, AsWrittenCommand, ctx, formatter)


class AsWrittenGroup(TyperGroup):
    """The ``specscope`` group, whose ``--help`` shows its commands' help texts as written."""

    def format_help(self, ctx, formatter) -> None:
        _format_help(self, AsWrittenGroup, ctx, formatter)
