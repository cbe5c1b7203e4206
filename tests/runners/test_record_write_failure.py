"""A run record that cannot be written (disk full, file-size limit) still ends as a failed
record that says why, or, when not even that fits, as one sentence naming the case; a native log
that cannot be written fails the run naming the log. Every such sentence is the path, what it
was, and the reason in words; no partial record is left under its name."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lockstep.runners.base as base
from lockstep.cases.spec import CaseSpec
from lockstep.errors import RunError
from lockstep.formats.run_record import read_run_record
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs
from lockstep.runners.pytorch import PyTorchRunner

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

SRC = Path(__file__).resolve().parents[2] / "src"
TINY = SHAPES["gpt2-tiny"].config
CASE = CaseSpec(name="c", model="gpt2", dtype="float32", micro_batch=1, seq_len=16, total_batch=16, steps=2, lr=1e-4)

# Runs PyTorchRunner.run on 20 tiny steps under RLIMIT_FSIZE, as a full disk or a quota would.
UNDER_FILE_SIZE_LIMIT = """
import json, resource, sys
from pathlib import Path
from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs
from lockstep.runners.pytorch import PyTorchRunner
import torch  # imported before the limit: nothing of the library is written later
case = CaseSpec(name="big", model="gpt2", dtype="float32", micro_batch=1, seq_len=16, total_batch=16,
                steps=int(sys.argv[5]), lr=1e-4)
inputs = RunInputs(checkpoint=Path(sys.argv[1]), tokens=Path(sys.argv[2]), model=SHAPES["gpt2-tiny"].config,
                   device="cpu")
limit = int(sys.argv[4])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    rec = PyTorchRunner().run(case, inputs, Path(sys.argv[3]))
    print(json.dumps({"status": rec.status, "error": rec.error}))
except LockstepError as e:
    print(json.dumps({"raised": str(e)}))
"""


def run_under_limit(tmp_path, checkpoint, tokens, limit: int, steps: int = 20) -> dict:
    out = subprocess.run([sys.executable, "-c", UNDER_FILE_SIZE_LIMIT, str(checkpoint), str(tokens),
                          str(tmp_path / "out"), str(limit), str(steps)], capture_output=True, text=True, timeout=300,
                         # LOCKSTEP_COMMIT: no `git status` under the limit (it would leave a cut index.lock)
                         env={**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1",
                              "LOCKSTEP_COMMIT": "test"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def inputs(tiny_checkpoint, tiny_shakespeare_train) -> RunInputs:
    return RunInputs(checkpoint=tiny_checkpoint, tokens=tiny_shakespeare_train, model=TINY, device="cpu")


def test_record_too_large_for_the_limit_leaves_a_small_failed_record(tmp_path, tiny_checkpoint,
                                                                      tiny_shakespeare_train):
    # 3,000 bytes: the log (about 1.9 KB) fits, the 20-step record (about 4 KB) does not.
    result = run_under_limit(tmp_path, tiny_checkpoint, tiny_shakespeare_train, 3000)
    record_path = tmp_path / "out" / "pytorch" / "big.jsonl"
    assert result["status"] == "failed"
    assert result["error"] == f"{record_path}: cannot write the run record: file too large; 20 step(s) were lost"
    rec = read_run_record(record_path)
    assert not rec.ok and rec.error == result["error"] and rec.steps == []
    assert sorted(p.name for p in record_path.parent.iterdir()) == ["big.jsonl", "big.log"]  # no temporary left


def test_nothing_fits_is_one_sentence_naming_the_case(tmp_path, tiny_checkpoint, tiny_shakespeare_train):
    result = run_under_limit(tmp_path, tiny_checkpoint, tiny_shakespeare_train, 600)
    record_path = tmp_path / "out" / "pytorch" / "big.jsonl"
    # 600 bytes: the log stops first (and fails the run), then not even the failed record fits.
    assert result["raised"] == (f"{record_path}: cannot write the run record: file too large after the run had "
                                f"failed: {record_path.with_suffix('.log')}: cannot write the native log: file too "
                                "large; pytorch/big has no record")
    assert not record_path.exists() and not list(record_path.parent.glob(".big.jsonl*"))  # nothing partial, anywhere


def test_a_log_that_cannot_be_written_fails_the_run_naming_the_log(tmp_path, tiny_checkpoint, tiny_shakespeare_train):
    # 3,000 bytes: 40 steps of log lines (about 3.8 KB) do not fit; the failed record (no steps) does.
    result = run_under_limit(tmp_path, tiny_checkpoint, tiny_shakespeare_train, 3000, steps=40)
    log_path = tmp_path / "out" / "pytorch" / "big.log"
    assert result == {"status": "failed", "error": f"{log_path}: cannot write the native log: file too large"}
    assert read_run_record(log_path.with_suffix(".jsonl")).error == result["error"]


def test_disk_full_on_the_record_write_leaves_a_failed_record(monkeypatch, tmp_path, inputs):
    real, calls = base.write_run_record, []

    def full_once(path, record):
        calls.append(record.status)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, record)

    monkeypatch.setattr(base, "write_run_record", full_once)
    rec = PyTorchRunner().run(CASE, inputs, tmp_path)
    path = tmp_path / "pytorch" / "c.jsonl"
    assert calls == ["ok", "failed"]
    assert rec.error == f"{path}: cannot write the run record: no space left on device; 2 step(s) were lost"
    assert read_run_record(path).status == "failed"


def test_disk_full_on_every_write_names_the_case(monkeypatch, tmp_path, inputs):
    def full(path, record):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(base, "write_run_record", full)
    with pytest.raises(RunError, match=r"c.jsonl: cannot write the run record: no space left on device; "
                                       r"2 step\(s\) were lost; pytorch/c has no record$"):
        PyTorchRunner().run(CASE, inputs, tmp_path)
