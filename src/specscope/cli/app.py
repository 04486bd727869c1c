"""The ``specscope`` application, and how every command fails: a thin layer over the library.

Every command turns specscope's expected failures (:class:`specscope.errors.SpecscopeError`) into
one line on stderr and exit status 2; exit status 1 is a finding the command reports (certify's
soundness violation); anything else with a traceback is a bug.
"""

from __future__ import annotations

import functools

import typer

from ..errors import SpecscopeError


app = typer.Typer(
    name="specscope",
    help="Acceptance dynamics of tree-based speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """Acceptance dynamics of tree-based speculative decoding: measure, analyse, certify, speculate."""


def fail(message: str) -> None:
    """Print a one-line error and exit with status 2."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def command(*args, **kwargs):
    """``app.command`` whose function turns any SpecscopeError into :func:`fail`."""
    def register(function):
        @functools.wraps(function)
        def guarded(*a, **k):
            try:
                return function(*a, **k)
            except SpecscopeError as e:
                fail(str(e))
        return app.command(*args, **kwargs)(guarded)
    return register
