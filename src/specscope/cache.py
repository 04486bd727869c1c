"""Where specscope keeps files between runs: the demo pair, prompt sources, MT-Bench's wheel, file
fingerprints. Imports nothing heavy, so that listing prompt sources needs no torch."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SPECSCOPE_CACHE``, else ``$XDG_CACHE_HOME/specscope``, else ``~/.cache/specscope``."""
    if os.environ.get("SPECSCOPE_CACHE"):
        return Path(os.environ["SPECSCOPE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specscope"
