"""Faults injected into persistent workers (runners/workers.py) by case name, to prove that a
failing case fails alone: `LOCKSTEP_TEST_FAULTS="case:fault,..."` with LOCKSTEP_TEST_PLUGINS
naming `from_env` (set by `worker_env`). Each fault fires when step 2's first micro batch is
read, through the batch readers of both runners (pytorch's TokenBatches, megatron's
MicroBatches), so no source is edited:

- raise: every rank raises RuntimeError (a failure inside the training code; the group lives on);
- exit_rank1: rank 1 exits with status 3 while rank 0 trains on (the whole group dies);
- hang: every rank sleeps for an hour (only the case's timeout ends it).
"""

from __future__ import annotations

import os
import sys
import time

from support.defects import TESTS_DIR

FAULTS_ENV = "LOCKSTEP_TEST_FAULTS"


def _with_faults(cls, faults: dict[str, str]) -> None:
    original = cls.micro_batch

    def micro_batch(self, step, micro_step):
        fault = faults.get(self.case.name)
        if fault and step == 1 and micro_step == 0:
            if fault == "raise":
                raise RuntimeError(f"injected fault in case {self.case.name}")
            if fault == "exit_rank1" and int(os.environ.get("RANK", 0)) == 1:
                sys.stdout.flush()
                os._exit(3)
            if fault == "hang":
                time.sleep(3600)
        return original(self, step, micro_step)

    cls.micro_batch = micro_batch


def from_env() -> None:
    """The workers' plugin: faults by case name, for this process's life."""
    from lockstep.data.loader import TokenBatches
    from lockstep.runners.megatron.dataset import MicroBatches

    faults = dict(item.split(":", 1) for item in os.environ[FAULTS_ENV].split(",") if item)
    _with_faults(TokenBatches, faults)
    _with_faults(MicroBatches, faults)


def worker_env(faults: dict[str, str], monkeypatch) -> None:
    """Make every worker started from now on (in this test) apply `faults` (case name -> fault)."""
    monkeypatch.setenv("LOCKSTEP_TEST_PLUGINS", f"{__name__}:from_env")
    monkeypatch.setenv(FAULTS_ENV, ",".join(f"{c}:{f}" for c, f in faults.items()))
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(TESTS_DIR), path) if p))
