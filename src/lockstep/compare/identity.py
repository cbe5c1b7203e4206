"""`--expect identical`: is the test build bit for bit the baseline build? Most changes to a
training framework (a refactor, recompute switched on, a pipeline layout reworked at the same
layout) must not change a single bit. The verdict is IDENTICAL, or NOT IDENTICAL with the first
step whose loss differs and the first tensor of the step-1 captures whose bytes differ (where both
sides captured), and by how much; the usual loss threshold stays beside it in the comparison.

Losses are compared as each side recorded them: a lockstep record's FP64 value of the step's loss,
a native log's printed digits (then "identical" is to the digits the log prints, and said so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lockstep.certify.identity import TensorDifference, first_difference
from lockstep.errors import LockstepError
from lockstep.formats.run_record import RunRecord


@dataclass
class IdentityVerdict:
    loss_step: int | None = None  # the first step whose loss differs (None: every loss bit for bit)
    loss_delta: float | None = None  # by how much, at that step
    tensor: TensorDifference | None = None  # the first differing tensor of the step-1 captures
    captures: str = ""  # how the captures were compared, or why not
    printed: float | None = None  # the coarsest loss digit a side's log prints (None: records' FP64 losses)

    @property
    def identical(self) -> bool:
        return self.loss_step is None and self.tensor is None

    @property
    def first_step(self) -> int | None:
        """The first step that differs: 1 where step 1's tensors do, else the first loss."""
        return 1 if self.tensor is not None else self.loss_step

    def sentence(self) -> str:
        if self.identical:
            return f"IDENTICAL: every step's loss {self._same}; {self.captures}"
        return f"NOT IDENTICAL {self.difference()}"

    def difference(self) -> str:
        """Where the two first differ, without the verdict's word: a NOT IDENTICAL pair's cause."""
        losses = (f"loss first differs at step {self.loss_step} (by {self.loss_delta:.3e})" if self.loss_step
                  else f"every step's loss {self._same}")
        where = (f"step 1's {self.tensor.line} is the first tensor that differs" if self.tensor is not None
                 else self.captures)
        return f"from step {self.first_step}: {where}; {losses}"

    @property
    def _same(self) -> str:
        return "bit for bit" if self.printed is None else f"to the {self.printed:.0e} its log prints"

    def to_json(self) -> dict:
        return {"identical": self.identical, "first_step": self.first_step, "loss_step": self.loss_step,
                "loss_delta": self.loss_delta, "loss_printed_to": self.printed,
                "tensor": self.tensor.to_json() if self.tensor else None, "captures": self.captures,
                "sentence": self.sentence()}


def same_bits(x: float, y: float) -> bool:
    return (x == y and math.copysign(1.0, x) == math.copysign(1.0, y)) or (math.isnan(x) and math.isnan(y))


def judge_identity(baseline: RunRecord, test: RunRecord) -> IdentityVerdict:
    """The losses step by step, then the step-1 captures the two runs recorded (where both did)."""
    b = {s.step: s.loss for s in baseline.steps}
    t = {s.step: s.loss for s in test.steps}
    quanta = [r.meta.get("loss_quantum") for r in (baseline, test) if r.meta.get("loss_quantum")]
    verdict = IdentityVerdict(printed=max(quanta) if quanta else None)
    for step in sorted(set(b) | set(t)):
        if step not in b or step not in t:
            verdict.loss_step, verdict.loss_delta = step, float("nan")
            break
        if not same_bits(b[step], t[step]):
            verdict.loss_step, verdict.loss_delta = step, abs(t[step] - b[step])
            break
    verdict.captures = _compare_captures(baseline, test, verdict)
    return verdict


def _compare_captures(baseline: RunRecord, test: RunRecord, verdict: IdentityVerdict) -> str:
    paths = [r.meta.get("step1_capture") for r in (baseline, test)]
    if not all(p and Path(p).is_file() for p in paths):
        # One framework's two cases (a recompute twin) are told apart by their case.
        label = (lambda r: r.framework) if baseline.framework != test.framework else (lambda r: f"{r.framework}/{r.case}")
        missing = [label(r) for r, p in zip((baseline, test), paths) if not (p and Path(p).is_file())]
        return f"losses only: {', '.join(missing)} recorded no step-1 capture"
    from lockstep.formats.step_capture import StepCapture

    try:
        found = first_difference(StepCapture.load(paths[0]), StepCapture.load(paths[1]))
    except (LockstepError, ValueError, OSError) as e:
        return f"losses only: the step-1 captures cannot be read ({e})"
    if isinstance(found, str):
        return f"losses only: {found}"
    if found is not None:
        verdict.tensor = found
        return "step-1 captures differ"
    return "step 1's module outputs and gradients bit for bit"
