"""The one place specscope makes a rich ``Console``: tables whole in terminals, files and pipes.

rich sizes its output to the terminal; when stdout is a file or a pipe it has no terminal to ask
and falls back to 80 columns, folding or cutting every wider table ("certi…", "stati…"). A console
made here keeps rich's behaviour on a terminal and, anywhere else, is :data:`LOG_WIDTH` columns
wide, so that ``specscope analyze RUN > log.txt`` keeps every header and cell whole (tables take
their natural width; nothing is padded to the full width). It does not decide what is printed.
"""

from __future__ import annotations

import re

from rich.console import Console

# what a terminal would act on rather than show: C0 and C1 controls (ESC, BEL, CR...) and the
# format characters that reorder or hide text (bidirectional overrides, zero-width joiners)
_UNSHOWABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")

LOG_WIDTH = 1000  # columns of a console that writes to a file or a pipe


def terminal_safe(text: str) -> str:
    """``text`` (a name read from a user's file: a domain, a prompt id) with every character a
    terminal would act on written as its escape (``\\x1b``), so that printing it cannot move the
    cursor, clear the screen or reorder what follows."""
    return _UNSHOWABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def make_console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr): the terminal's width, or :data:`LOG_WIDTH` when the
    stream is not a terminal."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=LOG_WIDTH)
