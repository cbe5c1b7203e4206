"""Two captures of one step compared, and the close-call rule, once.

A deep, wide model's FP32 outputs can part from another framework's by a little more than the flat
tolerance with nothing wrong. When every finding parts by only a little (`close_call`), the
reference's step 1 in FP64 says how far FP32 moves the reference itself, and the pair is judged
again with that allowance, reusing the tensor differences already computed (a 1B model's whole
tensors are not read and compared twice). The FP64 step is made at most once per case, for every
test framework, and only where it means something: the baseline is the reference and the step
judged is step 1 (the FP64 run is of step 1).
"""

from __future__ import annotations

from typing import Callable, Protocol, TypeVar

from lockstep.certify.certificate import Step1Diffs
from lockstep.formats.step_capture import StepCapture


class Judged(Protocol):
    """What a judgement of two captures offers the rule: a certificate, or diagnose's verdict."""

    notes: list[str]

    @property
    def close_call(self) -> bool: ...

    def raw_diffs(self) -> Step1Diffs: ...


J = TypeVar("J", bound=Judged)


class Fp64Step:
    """The reference's step 1 of one case in FP64, made by `make` on the first close call that asks
    for it; `unavailable` says why a close call gets no allowance (then `make` is None)."""

    def __init__(self, make: Callable[[], StepCapture] | None, unavailable: str | None = None):
        self._make = make
        self.unavailable = unavailable
        self.capture: StepCapture | None = None
        self.used = False  # a judgement asked for it (one made in advance and unused can go)

    @classmethod
    def for_pair(cls, baseline: str, reference: str, step: int, make: Callable[[], StepCapture]) -> "Fp64Step":
        if step != 1:
            return cls(None, f"at step {step} (the reference's FP64 run is of step 1)")
        if baseline != reference:
            return cls(None, f"the baseline {baseline} is not the {reference} reference, whose FP64 step 1 it is")
        return cls(make)

    @classmethod
    def ready(cls, capture: StepCapture) -> "Fp64Step":
        """One made already (diagnose makes it beside the others where the device holds both)."""
        step = cls(lambda: capture)
        step.capture = capture
        return step

    def get(self) -> StepCapture:
        self.used = True
        if self.capture is None:
            self.capture = self._make()
        return self.capture


def judge(evaluate: Callable[[StepCapture | None, Step1Diffs | None], J], fp64: Fp64Step,
          say: Callable[[str], None] = lambda text: None, pair: str = "") -> J:
    """`evaluate(fp64_capture, diffs)` once; on a close call, again with the reference's FP64 step 1
    and the first judgement's differences."""
    first = evaluate(None, None)
    if not first.close_call:
        return first
    if fp64.unavailable:
        first.notes.append(f"a close call: no FP64 allowance {fp64.unavailable}")
        return first
    say(f"{pair + ': ' if pair else ''}a close call; measuring what FP32 moves the reference itself "
        "(its step 1 in FP64)")
    return evaluate(fp64.get(), first.raw_diffs())
