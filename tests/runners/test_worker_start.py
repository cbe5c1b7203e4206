"""How a worker group starts (runners/workers.py, execute.start_first_group_early): a single rank
needs no torchrun, and a group started before the plan is stopped, leaving no process, when the
run does not take it."""

from __future__ import annotations

import os
import time

import pytest

from lockstep.execute import close_early_groups, start_first_group_early
from lockstep.plan import RunRequest
from lockstep.runners.launch import one_rank_env
from lockstep.runners.workers import WorkerGroup


def test_a_single_rank_gets_torchruns_environment_without_torchrun():
    env = one_rank_env()
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    assert 0 < int(env["MASTER_PORT"]) < 65536


def test_a_group_without_torchrun_has_one_rank(tmp_path):
    group = WorkerGroup("lockstep.runners.megatron.worker", 2, "cpu", use_torchrun=False)
    with pytest.raises(ValueError, match="one rank"):
        group.prestart({"name": "x"}, tmp_path)
    group.close()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_an_early_group_the_run_does_not_take_is_stopped(tmp_path):
    pytest.importorskip("megatron.core")
    groups = start_first_group_early(RunRequest(device="cpu", model="gpt2-tiny", frameworks=["pytorch", "megatron"],
                                                out=str(tmp_path)))
    [(name, key)] = list(groups)
    group = groups[(name, key)]
    assert name == "megatron" and group.running and not group.use_torchrun  # gpt2_1: one rank, no torchrun
    pid = group.proc.pid
    close_early_groups(groups)
    assert groups == {}
    deadline = time.monotonic() + 10
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(pid)
