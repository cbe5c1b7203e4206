"""Freed host memory handed back to the system by processes that live on (glibc's malloc_trim).

glibc keeps memory a process freed for its next allocations: the top of the heap up to
M_TRIM_THRESHOLD, and freed chunks inside the heap always. A persistent worker rank (workers.py)
that trained a large case keeps that peak while it waits, idle, for the next one, and so does
every other long-lived process beside it: their idle peaks add up. `malloc_trim(0)` returns every
free page of every arena. No-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def glibc() -> ctypes.CDLL | None:
    """This process's glibc, or None where the C library is another one."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # only glibc has it
        libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return libc


def release_freed_memory() -> bool:
    """Give the system back every free page of this process's heap; True when glibc released some."""
    libc = glibc()
    return bool(libc is not None and libc.malloc_trim(0))
