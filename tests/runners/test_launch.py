"""Workers die with lockstep: a SIGKILLed lockstep runs no clean-up, so the kernel must end what it
started (PR_SET_PDEATHSIG), and a rank must end when its launcher (torchrun) is killed. Before this
a megatron rank trained on for seconds after lockstep was killed and wrote checkpoint folders into --out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lockstep

SRC = str(Path(lockstep.__file__).resolve().parents[1])
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

# A stand-in for lockstep: starts a worker the way the runners do, prints its pid, then waits.
PARENT_SPAWNS = """
import sys, time
from lockstep.runners.launch import spawn_group
child = spawn_group([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""

# A stand-in for torchrun: a plain child (no pre-exec hook) that calls end_with_parent itself, as
# the workers' main() does first thing.
PARENT_OF_WORKER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "from lockstep.runners.launch import end_with_parent; end_with_parent(); print('ready', flush=True); "
    "import time; time.sleep(120)"], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
print(child.pid, flush=True)
time.sleep(120)
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


@pytest.mark.parametrize("script", [PARENT_SPAWNS, PARENT_OF_WORKER], ids=["spawn_group", "end_with_parent"])
def test_a_worker_dies_within_a_second_of_its_killed_parent(script):
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": SRC})
    child = int(parent.stdout.readline())
    try:
        assert alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 2.0
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the worker outlived its SIGKILLed parent"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


# A rank that ends normally but leaves a helper of its own in its session (megatron-core's checkpoint
# writer once left a spawned process running for hours after its rank had exited).
LEAVES_A_HELPER = """
import subprocess, sys
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(helper.pid, flush=True)
"""


def test_what_a_finished_worker_left_in_its_session_is_ended(tmp_path):
    from lockstep.runners.launch import spawn_group, supervise

    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        proc = spawn_group([sys.executable, "-c", LEAVES_A_HELPER], stdout=f)
        status, timed_out = supervise(proc, lambda: None, timeout_s=60, interval_s=0.1)
    helper = int(out.read_text())
    try:
        assert (status, timed_out) == (0, False)
        deadline = time.monotonic() + 2.0
        while alive(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(helper), "the worker's helper outlived it"
    finally:
        if alive(helper):
            os.kill(helper, signal.SIGKILL)
