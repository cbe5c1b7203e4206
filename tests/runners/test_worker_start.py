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


# ---- megatron-core's torch.compile decorators, deferred at the worker's start (compile_on_call.py) ----

def recording_compile(calls: list):
    """A stand-in for torch.compile that records what it compiled and returns it unchanged."""

    def compile_(model=None, **options):
        if model is None:
            return lambda fn: compile_(fn, **options)
        calls.append((model.__name__, options))
        return model

    return compile_


def compiles_when_decorated(decorator, calls: list) -> bool:
    def fused_bias_gelu(x, bias):
        return x + bias

    before = len(calls)
    fused = decorator(fused_bias_gelu)
    at_decoration = len(calls) > before
    assert fused(2.0, 0.5) == 2.5 and fused(1.0, 1.0) == 2.0  # the same function, called twice
    return at_decoration


def test_a_deferred_compile_compiles_a_function_once_on_its_first_call_not_when_decorated():
    from lockstep.runners.megatron.compile_on_call import deferred_compile

    calls: list = []
    assert not compiles_when_decorated(deferred_compile(recording_compile(calls)), calls)
    assert calls == [("fused_bias_gelu", {})]  # once, at the first of the two calls
    calls.clear()
    assert not compiles_when_decorated(deferred_compile(recording_compile(calls))(mode="max-autotune"), calls)
    assert calls == [("fused_bias_gelu", {"mode": "max-autotune"})]
    # Negative control: torch.compile's own behaviour, compiling (here: recording) when decorated.
    calls.clear()
    assert compiles_when_decorated(recording_compile(calls), calls)
    assert calls == [("fused_bias_gelu", {})]


def test_a_deferred_compile_compiles_a_module_at_once():
    import torch

    from lockstep.runners.megatron.compile_on_call import deferred_compile

    calls: list = []
    compile_ = deferred_compile(lambda model, **options: calls.append(model) or model)
    layer = torch.nn.Linear(2, 2)
    assert compile_(layer) is layer and calls == [layer]


WORKER_START_PROBE = """
import sys, torch
real_compile = torch.compile
from lockstep.runners.megatron.worker import import_megatron
import_megatron()
import megatron.core.jit
from megatron.core.fusions.fused_bias_gelu import bias_gelu
print("after the worker's imports:", "torch._dynamo" in sys.modules, torch.compile is real_compile,
      getattr(bias_gelu, "compiles_on_first_call", False),
      getattr(megatron.core.jit.jit_fuser, "defers", None) is real_compile)
torch.compile(lambda x: x)
print("after one torch.compile:", "torch._dynamo" in sys.modules)
"""


def test_the_megatron_workers_imports_leave_torchs_compiler_unloaded():
    """The worker's megatron-core imports (import_megatron) load no torch compiler (compile_on_call.py:
    0.75 s of CPU per rank start). torch.compile itself is restored; megatron's jit_fuser stays deferred."""
    pytest.importorskip("megatron.core")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", WORKER_START_PROBE], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"}).stdout
    assert "after the worker's imports: False True True True" in out, out
    # Negative control: the probe sees the compiler once one real torch.compile has run.
    assert "after one torch.compile: True" in out, out
