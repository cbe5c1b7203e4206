"""Whether a record trained at the contract's lr at every step (cases/lr_schedule.py's `lr_at`).

One rule: a record's lr of step n must equal the contract's lr of step n, exactly as FP32 for a
record that holds the full value (lockstep's own runners), and to the significant digits a log
prints for a record read from one (its meta's `lr_significant_digits`; InfiniTrain's "lr %.2e":
3). A record that states no case (a foreign log) or no lr is not checked.
"""

from __future__ import annotations

import numpy as np

from lockstep.cases.lr_schedule import lrs_of
from lockstep.cases.spec import CaseSpec
from lockstep.errors import CaseError
from lockstep.formats.run_record import RunRecord


def _rounded(value: float, digits: int | None) -> float:
    if digits is None:
        return float(np.float32(value))
    return float(f"{value:.{digits - 1}e}")


def lr_mismatch(record: RunRecord) -> str | None:
    """None when every step's lr is the contract's, else one sentence naming the first step that is not."""
    spec = record.meta.get("case_spec")
    if not isinstance(spec, dict):
        return None
    try:
        case = CaseSpec.from_dict(spec)
    except (CaseError, TypeError, ValueError):
        return None  # a spec this version cannot read: the inputs check speaks for it
    # Outside the guard: a fault in the schedule itself must not quietly turn every lr check off.
    contract = lrs_of(case)
    digits = record.meta.get("lr_significant_digits")
    digits = digits if isinstance(digits, int) and not isinstance(digits, bool) and digits > 0 else None
    for s in sorted(record.steps, key=lambda s: s.step):
        if s.lr is None or not 1 <= s.step <= len(contract):
            continue
        want = contract[s.step - 1]
        if _rounded(s.lr, digits) != _rounded(want, digits):
            how = f"to {digits} significant digits" if digits else "as FP32"
            return (f"{record.framework} trained step {s.step} at lr {s.lr!r}, but the contract's lr of step {s.step} "
                    f"is {want!r} (compared {how}; {case.lr_schedule.label if case.lr_schedule else 'constant lr'})")
    return None
