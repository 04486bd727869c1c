"""What this machine's CPU is: its name, its instruction-set flags (``/proc/cpuinfo``), and how
many CPUs this process may use (its affinity mask and its cgroup's CPU quota).

A ground-floor module (standard library only): models/config.py chooses a dtype from the flags,
the command line sets torch's threads from :func:`usable_cpus`, and ``specscope doctor`` reports
all of it. It does not ask torch about devices (doctor.py does).
"""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


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


# the instruction sets that decide which dtype runs a pass fastest here (BENCHMARKS.md, "Defaults
# per machine"): flag in /proc/cpuinfo -> name
SPEED_FLAGS = {"avx2": "AVX2", "avx512f": "AVX512", "avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX"}


def cpu_features() -> list[str]:
    """The instruction sets of :data:`SPEED_FLAGS` this CPU has, by name (``["AVX2", "AVX512"]``)."""
    flags = cpu_flags()
    return [name for flag, name in SPEED_FLAGS.items() if flag in flags]


def machine_line() -> str:
    """The CPU, the instruction sets that decide its matmul speed, and the CPUs this process may
    use: how a timing names the machine it was taken on."""
    features = ", ".join(cpu_features())
    return f"{cpu_name()}{f' ({features})' if features else ''}, {usable_cpus()} CPUs"


def cpu_quota(cgroup: Path = CGROUP) -> float | None:
    """The CPUs' worth of time this process's cgroup may use (``docker --cpus 2``: 2.0), from
    cgroup v2's ``cpu.max`` or v1's ``cpu.cfs_quota_us``/``cpu.cfs_period_us``; None where no
    quota is set or none can be read."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cpus(cgroup: Path = CGROUP) -> int:
    """The CPUs this process can keep busy at once: those its affinity mask allows, capped by its
    cgroup's CPU quota rounded up. A container limited to 2 CPUs' time on a 64-core host sees 64
    CPUs; threads beyond its quota wait at every parallel region while the quota is spent (int8
    measurement on 2 cores ran 2.2x slower with 4 threads, 3.1x with 16; BENCHMARKS.md)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = cpu_quota(cgroup)
    return max(1, min(cpus, math.ceil(quota))) if quota else max(1, cpus)
