"""megatron-core's checkpoint writer, broken the way a bare install breaks it, must fail the saving
case within seconds with one sentence naming the log: before, a writer that died (no psutil: the
README's megatron extra did not bring it) left the worker waiting forever with nothing on the terminal."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from lockstep.cases.spec import CaseSpec, CheckpointSpec
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs

pytest.importorskip("megatron.core")

from lockstep.runners.megatron import MegatronRunner  # noqa: E402
from support.defects import TESTS_DIR  # noqa: E402

SAVING = CaseSpec(name="saving", model="gpt2-tiny", dtype="float32", micro_batch=2, seq_len=32, total_batch=64, steps=2,
                  lr=0.1, checkpoint=CheckpointSpec(save_interval=2, max_checkpoint_keep=1))


@pytest.mark.integration
@pytest.mark.parametrize("plugin, says", [
    ("no_psutil", "megatron-core's checkpoint writer needs psutil, which is not installed"),
    ("writer_dies", "checkpoint writer process"),
])
def test_a_broken_checkpoint_writer_fails_the_case_in_seconds_naming_the_log(plugin, says, tiny_checkpoint,
                                                                             training_tokens, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_TEST_PLUGINS", f"support.checkpoint_writers:{plugin}")
    mark = f"LOCKSTEP_TEST_MARK={tmp_path}"
    monkeypatch.setenv(*mark.split("=", 1))  # every process the run starts inherits it
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p))
    # A hang is a timeout failure here, not a stuck suite.
    inputs = RunInputs(checkpoint=tiny_checkpoint, tokens=training_tokens, model=SHAPES["gpt2-tiny"].config,
                       device="cpu", timeout_s=240)
    began = time.monotonic()
    rec = MegatronRunner().run(SAVING, inputs, tmp_path)
    assert not rec.ok and "timed out" not in rec.error, rec.error
    log = tmp_path / "megatron" / "saving.log"
    assert rec.error.startswith(f"{log}: "), rec.error
    assert says in rec.error, rec.error
    if plugin == "writer_dies":
        assert "died (exit status 3) before reporting" in rec.error
    assert time.monotonic() - began < 200
    assert not (tmp_path / "megatron" / "saving.checkpoints" / "step_000002").exists()
    assert _left_running(mark) == [], "a process of the failed run is still running"


def _left_running(mark: str, wait_s: float = 10.0) -> list[str]:
    """The command lines of processes (not this one) whose environment holds `mark`: what the run
    left behind. megatron-core's spawned write-results Manager outlived a rank that ended itself."""
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if mark.encode() in (proc / "environ").read_bytes().split(b"\0"):
                    left.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue  # gone meanwhile, or not ours to read
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
