"""Where specscope keeps files between runs: the demo pair, prompt sources, MT-Bench's wheel, file
fingerprints; and how a file that leaves this machine names a path in it. Imports nothing heavy,
so that listing prompt sources needs no torch."""

from __future__ import annotations

import os
from pathlib import Path

# How a written file names specscope's cache, wherever it is on the machine that reads it.
CACHE_VARIABLE = "$SPECSCOPE_CACHE"


def cache_dir() -> Path:
    """``$SPECSCOPE_CACHE``, else ``$XDG_CACHE_HOME/specscope``, else ``~/.cache/specscope``."""
    if os.environ.get("SPECSCOPE_CACHE"):
        return Path(os.environ["SPECSCOPE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specscope"


def recorded_path(path: str | Path) -> str:
    """``path`` as a written file (a manifest, a policy, a cost grid) records it: a file in the
    cache as ``$SPECSCOPE_CACHE/...``, one in the home directory as ``~/...``, any other path as
    given; :func:`local_path` reads it back on any machine."""
    given = Path(path)
    if not given.is_absolute():
        return str(path)
    for root, name in ((cache_dir(), CACHE_VARIABLE), (Path.home(), "~")):
        if given.is_relative_to(root.absolute()):
            inside = given.relative_to(root.absolute()).as_posix()
            return name if inside == "." else f"{name}/{inside}"
    return str(path)


def local_path(recorded: str | Path) -> Path:
    """A path as :func:`recorded_path` wrote it, on this machine: ``$SPECSCOPE_CACHE`` this
    machine's cache, ``~`` its home directory."""
    name, _, inside = str(recorded).partition("/")
    if name == CACHE_VARIABLE:
        return cache_dir() / inside
    return Path(recorded).expanduser()
