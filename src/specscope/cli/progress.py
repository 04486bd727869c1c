"""The command line's progress display: a rich progress bar on stderr that observes a run or a
sweep (:class:`specscope.progress.Progress`), and prints the library's notes in colour.

``specscope run`` shows ``measuring ━━━ 3/8 prompts  1200 nodes  40.1 nodes/s  0:00:30 left
0:00:50``; ``specscope sweep`` shows ``sweep ━━━ 2/5 shards  6 prompts  2400 nodes ...``; the
library's other long stages (``bench``, ``tune``'s timing, ``analyze``, ``certify``, ``ingest``)
show ``bench ━━━ 4/80 prompts  0:01:10 left 0:22:00``. With ``--quiet``, or where stderr is not a
terminal, the bar is off and the notes are still printed.
"""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichBar

from ..console import make_console, terminal_safe
from ..progress import Level, Tally

STYLES: dict[str, str | None] = {"info": None, "warning": "yellow", "error": "red"}


# the units whose work records nodes: their bar shows the nodes and the rate
MEASURED_UNITS = ("prompts", "shards")


class ProgressBar:
    """A :class:`~specscope.progress.Progress` drawn as a rich bar with the time elapsed and
    remaining, on a terminal only (``bar=False``, or stderr not a terminal: notes only). Work
    that starts inside other work gets a bar of its own below it."""

    def __init__(self, bar: bool = True):
        self.console = make_console(stderr=True)
        self.bar = bar
        self.rich: RichBar | None = None
        self.tasks: list[tuple[object, str]] = []  # (rich task, unit), innermost last

    def start(self, what: str, unit: str, tally: Tally) -> None:
        if self.rich is None:
            self.rich = RichBar(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
                console=self.console,
                disable=not (self.bar and self.console.is_terminal),
            )
            self.rich.__enter__()
        task = self.rich.add_task(what, total=tally.total, completed=tally.done, detail=unit)
        self.tasks.append((task, unit))

    def update(self, tally: Tally) -> None:
        if self.rich is None or not self.tasks:
            return
        task, unit = self.tasks[-1]
        detail = unit
        if unit in MEASURED_UNITS:
            prompts = "" if unit == "prompts" else f"{tally.prompts} prompts  "
            detail += f"  {prompts}{tally.nodes} nodes  {tally.nodes_per_s:.1f} nodes/s"
        self.rich.update(task, completed=tally.done, detail=detail)

    def note(self, message: str, level: Level = "info") -> None:
        self.console.print(
            terminal_safe(message), style=STYLES[level], markup=False, highlight=False
        )

    def stop(self) -> None:
        """An inner stage's bar goes when it ends; the outermost stays, drawn at its end."""
        if self.rich is None:
            return
        task, _ = self.tasks.pop() if self.tasks else (None, "")
        if self.tasks:
            self.rich.remove_task(task)
            return
        self.rich.__exit__(None, None, None)
        self.rich = None
