"""runners/host_memory.py: memory a long-lived process freed goes back to the system when asked."""

from __future__ import annotations

import os

import numpy as np
import pytest

from lockstep.runners.host_memory import glibc, release_freed_memory

MB = 1 << 20


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB


def test_freed_heap_memory_is_held_until_released():
    if glibc() is None:
        pytest.skip("the C library is not glibc: nothing to release")
    libc = glibc()
    M_MMAP_THRESHOLD, M_TRIM_THRESHOLD = -3, -1
    # The suite's policy (conftest.py: 512 MiB, 1 GiB), set again here (a GLIBC_TUNABLES of the
    # user's leaves it unset) so that the block lives in the heap.
    assert libc.mallopt(M_MMAP_THRESHOLD, 512 * MB) and libc.mallopt(M_TRIM_THRESHOLD, 1024 * MB)
    release_freed_memory()
    before = resident_mb()
    block = np.ones(256 * MB // 8)  # 256 MB, every page written
    assert resident_mb() - before > 250
    del block
    # Negative control: freed, but the process still holds it (below the trim threshold).
    held = resident_mb()
    assert held - before > 250, (before, held)
    assert release_freed_memory()
    assert resident_mb() - before < 20, (before, resident_mb())
