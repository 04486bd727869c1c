"""The C heap under a long measurement: the free memory glibc's malloc keeps, handed back to the
system as each prompt finishes.

glibc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB), after
which the buffers of a measurement step (KV caches, tree masks, a context's probabilities over a
151,936-token vocabulary) come from the heap, whose free pages stay with the process: a 120-prompt
run of the demo pair grew by about 0.6 GiB a minute until the kernel killed it at 24 GiB
(BENCHMARKS.md). :func:`release_free_memory` (``malloc_trim(0)``: every free page of the heap
returned, not only its top) runs after each finished prompt, a few milliseconds a prompt; it
leaves malloc's thresholds alone (a fixed 64 KiB mmap threshold bounded the memory too, but made
every activation buffer a fresh mapping and int8 measurement 43% slower). A ground-floor module
(standard library only); it changes where freed memory goes, never a computed value, and does
nothing outside glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None elsewhere (musl, macOS, Windows)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return None
    except (ValueError, OSError):
        return None
    return getattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim", None)


def release_free_memory() -> bool:
    """Hand the heap's free pages back to the system; whether it could (False outside glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
