"""How long library work (a run, a sweep) reports its progress: to an observer its caller passes in.

The library never writes to the terminal. :func:`specscope.run.study.run_study` and
:func:`specscope.sweep.run_sweep` take a :class:`Progress` and tell it when the work starts, each
time a unit (a prompt, a shard) is done, what the caller should know (a skipped prompt, a failed
shard), and when the work stops; other long stages report to the current observer through
:func:`counting`. The default, :data:`SILENT`, drops everything; the command line
passes a rich progress bar (``specscope.cli.progress``). This module knows nothing of terminals.

Work that happens deep under a call (assembling and converting the demo pair, quantising a model
to int8, a warning about a config file) tells the observer of the current context instead of
taking one as a parameter through every layer: :func:`current` is :data:`SILENT` unless a caller
made one current with ``with reporting(observer): ...`` (the command line does, for every
command).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal, Protocol

Level = Literal["info", "warning", "error"]


@dataclass(frozen=True)
class Tally:
    """Where the work stands: ``done`` of ``total`` units (earlier calls' included), and the
    prompts measured and nodes recorded by this call in ``seconds``."""

    done: int
    total: int
    prompts: int
    nodes: int
    seconds: float

    @property
    def nodes_per_s(self) -> float:
        return self.nodes / self.seconds if self.seconds > 0 else 0.0


class Progress(Protocol):
    """An observer of long work: ``start``, any number of ``update`` and ``note``, then ``stop``."""

    def start(self, what: str, unit: str, tally: Tally) -> None:
        """The work ``what`` (e.g. "measuring") starts, counted in ``unit`` ("prompts")."""

    def update(self, tally: Tally) -> None:
        """The work has moved on."""

    def note(self, message: str, level: Level = "info") -> None:
        """Something the caller should know, in one line."""

    def stop(self) -> None:
        """The work has stopped (finished or failed)."""


class Silent:
    """The :class:`Progress` that drops everything: the library's default."""

    def start(self, what: str, unit: str, tally: Tally) -> None:
        pass

    def update(self, tally: Tally) -> None:
        pass

    def note(self, message: str, level: Level = "info") -> None:
        pass

    def stop(self) -> None:
        pass


SILENT = Silent()


def observer(progress: Progress | None) -> Progress:
    """``progress``, or :data:`SILENT` for none (``None``; ``False`` from callers of the old
    ``progress=False`` flag)."""
    return progress or SILENT


_CURRENT: ContextVar[Progress] = ContextVar("specscope_progress", default=SILENT)


def current() -> Progress:
    """The observer of the current context (:data:`SILENT` outside any :func:`reporting`)."""
    return _CURRENT.get()


@contextmanager
def counting(what: str, unit: str, total: int, done: int = 0) -> Iterator[Callable[[int], None]]:
    """Report long work of ``total`` units (``done`` of them before this call) to the current
    observer: it starts on entering, ``advance(n=1)`` after each unit, and stops on leaving. The
    library's long stages (timing costs, a bench, an analysis, an ingest) report through this, so
    that the command line shows them with the time remaining."""
    observer, started, count = current(), time.perf_counter(), done

    def advance(n: int = 1) -> None:
        nonlocal count
        count += n
        observer.update(Tally(count, total, 0, 0, time.perf_counter() - started))

    observer.start(what, unit, Tally(done, total, 0, 0, 0.0))
    try:
        yield advance
    finally:
        observer.stop()


@contextmanager
def reporting(progress: Progress) -> Iterator[Progress]:
    """Make ``progress`` the current observer inside the ``with`` block, and restore the one
    before on leaving it."""
    token = _CURRENT.set(progress)
    try:
        yield progress
    finally:
        _CURRENT.reset(token)
