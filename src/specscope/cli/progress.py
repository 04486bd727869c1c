"""The command line's progress display: a rich progress bar on stderr that observes a run or a
sweep (:class:`specscope.progress.Progress`), and prints the library's notes in colour.

``specscope run`` shows ``measuring ━━━ 3/8 prompts  1200 nodes  40.1 nodes/s``; ``specscope
sweep`` shows ``sweep ━━━ 2/5 shards  6 prompts  2400 nodes  38.0 nodes/s``. With ``--quiet`` the
bar is off and the notes are still printed.
"""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichBar

from ..console import make_console, terminal_safe
from ..progress import Level, Tally

STYLES: dict[str, str | None] = {"info": None, "warning": "yellow", "error": "red"}


class ProgressBar:
    """A :class:`~specscope.progress.Progress` drawn as a rich bar (``bar=False``: notes only)."""

    def __init__(self, bar: bool = True):
        self.console = make_console(stderr=True)
        self.bar = bar
        self.rich: RichBar | None = None
        self.task = None

    def start(self, what: str, unit: str, tally: Tally) -> None:
        prompts = "" if unit == "prompts" else "{task.fields[prompts]} prompts  "
        self.rich = RichBar(
            TextColumn(f"[bold]{what}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                f"{unit}  {prompts}{{task.fields[nodes]}} nodes  {{task.fields[rate]}} nodes/s"
            ),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.bar,
        )
        self.rich.__enter__()
        self.task = self.rich.add_task(
            what, total=tally.total, completed=tally.done, prompts=0, nodes=0, rate="-"
        )

    def update(self, tally: Tally) -> None:
        if self.rich is not None:
            self.rich.update(
                self.task,
                completed=tally.done,
                prompts=tally.prompts,
                nodes=tally.nodes,
                rate=f"{tally.nodes_per_s:.1f}",
            )

    def note(self, message: str, level: Level = "info") -> None:
        self.console.print(
            terminal_safe(message), style=STYLES[level], markup=False, highlight=False
        )

    def stop(self) -> None:
        if self.rich is not None:
            self.rich.__exit__(None, None, None)
            self.rich = None
