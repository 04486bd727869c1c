"""The C heap under a long measurement: glibc's malloc tuned so that freed tensor buffers go back
to the system.

glibc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB), after
which the buffers of a measurement step (KV caches, tree masks, a context's probabilities over a
151,936-token vocabulary) come from the heap, whose free space stays with the process: a
120-prompt run of the demo pair grew by about 0.6 GiB a minute until the kernel killed it at 24
GiB (BENCHMARKS.md). With a fixed threshold of 64 KiB and trimming at every free, the same run
stays at its working set (about 5.4 GiB). A ground-floor module (standard library only); it
changes where buffers live, never a computed value, and does nothing outside glibc or where the
user set ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` themselves.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
MMAP_THRESHOLD = (
    64 * 1024
)  # bytes: blocks this large or larger are mmapped, and unmapped when freed
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@functools.cache
def bound_heap_growth() -> bool:
    """Fix glibc's mmap threshold and trim the heap at every free, once per process; whether it
    did (False: not glibc, or the user's own malloc settings kept)."""
    if any(name in os.environ for name in USER_SETTINGS) or not _is_glibc():
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, 0)
    )


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (ValueError, OSError):
        return False
