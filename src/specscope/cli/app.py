"""The ``specscope`` application, and how every command fails: a thin layer over the library.

Every command turns specscope's expected failures (:class:`specscope.errors.SpecscopeError`) into
one line on stderr and exit status 2, and so too the failures of the machine and of files that
the library did not name itself (a full disk, a read-only or missing path, bytes that are not
UTF-8, JSON nested too deeply): :func:`describe` words them. Exit status 1 is a finding the
command reports (certify's soundness violation); anything else with a traceback is a bug.
"""

from __future__ import annotations

import functools
import inspect
import re
from pathlib import Path

import typer

from ..errors import SpecscopeError
from ..files import os_error_reason
from ..progress import reporting
from .helptext import AsWrittenGroup
from .options import RenamingCommand, for_command
from .progress import ProgressBar

app = typer.Typer(
    name="specscope",
    cls=AsWrittenGroup,
    help="Acceptance dynamics of tree-based speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(asked: bool) -> None:
    if asked:
        from .. import __version__

        typer.echo(f"specscope {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print specscope's version and exit.",
    ),
) -> None:
    """Acceptance dynamics of tree-based speculative decoding: measure, analyse, certify, speculate."""


def fail(message: str) -> None:
    """Print a one-line error and exit with status 2."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def print_grids(grids, blank: bool = True) -> None:
    """Each of the library's tables (:class:`~specscope.analysis.render.Grid`) as a rich table on
    stdout, with (``blank``) an empty line after each."""
    from ..analysis.render import to_rich
    from ..console import make_console

    console = make_console()
    for grid in grids:
        console.print(to_rich(grid))
        if blank:
            console.print()


def describe(error: BaseException) -> str:
    """One line for an expected failure that escaped the library without a specscope message."""
    if isinstance(error, OSError):
        where = " -> ".join(str(f) for f in (error.filename, error.filename2) if f is not None)
        return f"{where}: {os_error_reason(error)}" if where else os_error_reason(error)
    if isinstance(error, UnicodeDecodeError):
        return f"input is not UTF-8 text ({error.reason} at byte {error.start})"
    if isinstance(error, RecursionError):
        return "input is nested too deeply to be read"
    return str(error)


# Failures of the machine or of a file that are not bugs in specscope.
EXPECTED = (SpecscopeError, OSError, UnicodeDecodeError, RecursionError)


# What a URI becomes once click has made it a Path: "s3://b/x" -> "s3:/b/x".
_URI_AS_PATH = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")


def refuse_uris(options: dict) -> None:
    """Fail on a URI given to an option that takes a local path (a ``Path`` parameter): click
    folds ``s3://b/x`` into the local relative path ``s3:/b/x``, which must not be written to or
    read from. Options that take URIs are ``str`` parameters and are not checked here."""
    for name, value in options.items():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, Path) and _URI_AS_PATH.match(str(item)):
                uri = _URI_AS_PATH.sub(lambda m: m.group(0) + "/", str(item), count=1)
                fail(
                    f"--{name.replace('_', '-')} {uri}: takes a local path, not a URI "
                    "(copy the file here first)"
                )


# The help panels of ``specscope --help``, in order: what each group of commands is for.
MEASURE, ANALYZE, SPECULATE, SERVE, MACHINE = "measure", "analyze", "speculate", "serve", "machine"
PANELS = (MEASURE, ANALYZE, SPECULATE, SERVE, MACHINE)


def command(*args, panel: str, **kwargs):
    """``app.command`` in help panel ``panel`` (one of :data:`PANELS`) whose function refuses URIs
    given for local paths (:func:`refuse_uris`), shows each shared option's help with this command's
    own default (:func:`~specscope.cli.options.for_command`), turns any expected failure (:data:`EXPECTED`)
    into :func:`fail`, and still takes its options' old names
    (:class:`~specscope.cli.options.RenamingCommand`)."""
    assert panel in PANELS, f"help panel {panel!r} is not one of {', '.join(PANELS)}"

    def register(function):
        name = args[0] if args else function.__name__.replace("_", "-")
        signature = inspect.signature(function)
        own = [
            p.replace(default=for_command(p.default, name)) for p in signature.parameters.values()
        ]

        @functools.wraps(function)
        def guarded(*a, **k):
            refuse_uris(k)
            try:
                with reporting(ProgressBar()):  # the library's notes and long stages, on stderr
                    return function(*a, **k)
            except EXPECTED as e:
                fail(describe(e))

        guarded.__signature__ = signature.replace(parameters=own)  # each option's own default
        return app.command(*args, cls=RenamingCommand, rich_help_panel=panel, **kwargs)(guarded)

    return register


def set_threads(threads: int | None) -> None:
    """Give torch ``threads`` CPU threads; by default its own count, capped at
    :func:`~specscope.hardware.usable_cpus` (threads beyond a container's quota slow int8 most)."""
    import torch

    from ..hardware import usable_cpus

    torch.set_num_threads(threads or min(torch.get_num_threads(), usable_cpus()))
