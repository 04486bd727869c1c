"""What this machine's CPU is: its name and instruction-set flags, read from ``/proc/cpuinfo``.

A ground-floor module (standard library only): models/config.py chooses a dtype from the flags,
and ``specscope doctor`` reports them. It does not ask torch about devices (doctor.py does).
"""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``flags`` on x86, ``Features`` on ARM); empty where unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_name() -> str:
    """The CPU's model name, else what ``platform`` knows of it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
