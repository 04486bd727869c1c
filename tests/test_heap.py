"""specscope.heap: the heap's free pages handed back after each finished prompt. Its effect on a
long run (memory flat instead of growing until the kernel kills the run) and its cost are measured
in BENCHMARKS.md; here, that it returns memory where glibc can and that measurement calls it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

IS_GLIBC = sys.platform == "linux" and os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")

# 200 buffers of 1 MiB from the heap (glibc's threshold raised past them by a 16 MiB block freed
# first), each followed by a 4 KiB block that stays; the buffers freed: their pages stay resident
# until the heap is trimmed
PROBE = """
import ctypes, ctypes.util, sys
from specscope.heap import release_free_memory
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
big = libc.malloc(16 << 20); ctypes.memset(big, 1, 16 << 20); libc.free(big)
blocks, keep = [], []
for _ in range(200):
    b = libc.malloc(1 << 20); ctypes.memset(b, 1, 1 << 20); blocks.append(b)
    keep.append(libc.malloc(4096))
before = rss()
for b in blocks:
    libc.free(b)
freed = rss()
print(release_free_memory(), round(before - freed), round(freed - rss()))
"""


@pytest.mark.skipif(not IS_GLIBC, reason="glibc only: elsewhere the function does nothing")
def test_free_heap_pages_go_back_to_the_system():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    returned, on_free, on_release = done.stdout.split()
    assert returned == "True"
    assert int(on_free) < 50  # freeing alone keeps the pages (the heap below the kept blocks)
    assert int(on_release) > 150  # the release hands most of the 200 MiB back


def test_measurement_releases_memory_after_each_finished_prompt():
    import importlib
    import inspect

    study = importlib.import_module("specscope.measure.study")
    assert "release_free_memory()" in inspect.getsource(study.measure_rows)
