"""A worker rank that ends (os._exit, after "stop") leaves no multiprocessing child behind: megatron-core's
checkpoint save starts a spawned Manager process for its write-results queue and keeps it for the life of
the process; before this, every rank that had saved left it running, orphaned (28 such processes were found
on the 2-core machine after an afternoon of resume tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lockstep

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

SRC = Path(lockstep.__file__).resolve().parents[1]

RANK = """
import sys
from megatron.core.dist_checkpointing.strategies import filesystem_async
import multiprocessing
filesystem_async._get_write_results_queue()  # what a save does on its first write
[manager] = multiprocessing.active_children()
print(manager.pid, flush=True)
from lockstep.runners.workers import _leave
_leave()
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its (gone) parent's reaping counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_rank_that_leaves_takes_megatron_s_results_queue_manager_with_it():
    pytest.importorskip("megatron.core")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", RANK], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), f"megatron-core's results-queue Manager (pid {pid}) outlived its rank"
