"""The comparison's lr rule on records written here: exact FP32, or a log's printed digits."""

import numpy as np
import torch

from lockstep.capture.request import applied_update
from lockstep.cases.lr_schedule import lrs_of
from lockstep.cases.spec import CaseSpec, LRSchedule
from lockstep.compare.lr_check import lr_mismatch
from lockstep.formats.run_record import RunRecord, StepRecord

CASE = CaseSpec(name="c", model="gpt2-tiny", dtype="float32", micro_batch=1, seq_len=8, total_batch=8, steps=5,
                lr=3e-4, lr_schedule=LRSchedule("cosine", 2, 0.0, 0, 3e-5))


def record(lrs, digits=None, framework="pytorch"):
    meta = {"case_spec": CASE.to_dict(), **({"lr_significant_digits": digits} if digits else {})}
    return RunRecord(framework=framework, case="c", steps=[StepRecord(step=i + 1, loss=1.0, lr=v)
                                                           for i, v in enumerate(lrs)], meta=meta)


def test_the_contracts_lrs_pass_and_an_ulp_off_fails_naming_the_step():
    contract = list(lrs_of(CASE))
    assert lr_mismatch(record(contract)) is None
    off = contract[:3] + [float(np.nextafter(np.float32(contract[3]), np.float32(1)))] + contract[4:]
    assert "trained step 4 at lr" in lr_mismatch(record(off))


def test_a_log_is_checked_to_the_digits_it_prints():
    printed = [float(f"{v:.2e}") for v in lrs_of(CASE)]
    assert lr_mismatch(record(printed, digits=3, framework="infinitrain")) is None
    late = [printed[0]] + printed[:-1]  # the warm-up one step late
    assert "infinitrain trained step 2 at lr 0.0" in lr_mismatch(record(late, digits=3, framework="infinitrain"))


def test_a_step_at_lr_0_checks_the_weights_did_not_move():
    before = torch.tensor([1.0, 2.0], dtype=torch.float64)
    moved, bound = applied_update(before, before.clone(), 0.0)
    assert moved.tolist() == [0.0, 0.0] and bound == 0.0
    moved, _ = applied_update(before, before - torch.tensor([0.0, 1e-3], dtype=torch.float64), 0.0)
    assert moved[0] == 0.0 and abs(moved[1] - 1e-3) < 1e-12  # a weight that moved at lr 0 shows as it is
