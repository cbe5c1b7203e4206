"""The process's C library, where it is glibc, for its allocator's switches (mallopt, malloc_trim)."""

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
