"""The verdict of `lockstep diagnose` on one pair: ranked tensor table, first diverging module,
one line per finding, the loss check and the drift, as one object (terminal, JSON, HTML)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lockstep.cases.spec import CaseSpec
from lockstep.compare.policy import loss_threshold
from lockstep.certify.certificate import Step1Diffs, captured_step, close_call, evaluate_step1
from lockstep.certify.classify import NONE, Finding, LossCheck, add_drift_findings
from lockstep.certify.tensors import TensorDiff
from lockstep.formats.step_capture import StepCapture


@dataclass
class DriftRun:
    """Both frameworks' losses over a few steps at one lr."""

    lr: float
    steps: list  # list[DriftStep]
    note: str = ""

    @property
    def max_abs_diff(self) -> float:
        return max((s.abs_diff for s in self.steps), default=0.0)

    def to_json(self) -> dict:
        return {"lr": self.lr, "max_abs_diff": self.max_abs_diff, "note": self.note,
                "steps": [s.to_json() for s in self.steps]}


@dataclass(frozen=True)
class DriftStep:
    step: int
    ref: float
    test: float

    @property
    def abs_diff(self) -> float:
        return abs(self.test - self.ref)

    def to_json(self) -> dict:
        return {"step": self.step, "reference": self.ref, "test": self.test, "abs_diff": self.abs_diff}


@dataclass
class Verdict:
    case: str
    reference: str
    test: str
    dtype: str
    tolerance: float
    forward: list[TensorDiff]
    grads: list[TensorDiff]
    findings: list[Finding]
    loss: LossCheck
    grad_kind: str
    drift: list[DriftRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    output_grads: list[TensorDiff] = field(default_factory=list)  # backward order
    micro_batches: dict[int, list[TensorDiff]] = field(default_factory=dict)  # micro batches 1.., sketched
    applied: list[TensorDiff] = field(default_factory=list)  # the optimizers' updates of the step (--at-step)
    at_step: int = 0  # 0: step 1 from the same init; N: step N+1, from the reference's state after step N

    @property
    def step(self) -> int:
        """The step compared."""
        return self.at_step + 1

    @property
    def compared_what(self) -> str:
        """Which step was compared, from what, in words."""
        if not self.at_step:
            return "at step 1, from the same initial weights"
        return f"at step {self.step}, from the reference's state after step {self.at_step}"

    def raw_diffs(self) -> Step1Diffs:
        """The tensors' comparison as made, for a second judgement with the FP64 allowance (only
        from a verdict made without one: its diffs carry no allowance yet)."""
        return Step1Diffs(forward=self.forward, micro_batches=self.micro_batches, grads=self.grads,
                          output_grads=self.output_grads, applied=self.applied)

    @property
    def close_call(self) -> bool:
        return close_call(self.findings, self.ranked(), self.tolerance)

    @property
    def headline(self) -> str:
        return self.findings[0].line if self.findings else NONE

    @property
    def first_diverging_module(self) -> str | None:
        return next((d.name for d in self.forward if d.rel > self.tolerance), None)

    @property
    def first_diverging_output_grad(self) -> str | None:
        """In backward order: the first module output whose arriving gradient differs."""
        return next((d.name for d in self.output_grads if d.rel > self.tolerance), None)

    def ranked(self, n: int | None = None) -> list[TensorDiff]:
        """Every tensor, forward and gradient, worst relative error first."""
        later = [d for ds in self.micro_batches.values() for d in ds]
        rows = sorted(self.forward + later + self.output_grads + self.grads + self.applied,
                      key=lambda d: (-d.rel, -(d.max_abs or 0.0)))
        return rows[:n] if n else rows

    def to_json(self) -> dict:
        return {
            "case": self.case, "reference": self.reference, "test": self.test, "dtype": self.dtype,
            "at_step": self.at_step, "step": self.step, "compared": self.compared_what,
            "tensor_tolerance": self.tolerance, "gradient_source": self.grad_kind,
            "verdict": self.headline, "first_diverging_module": self.first_diverging_module,
            "first_diverging_output_gradient": self.first_diverging_output_grad,
            "findings": [f.to_json() for f in self.findings], "loss_step1": self.loss.to_json(),
            "ranked": [d.to_json() for d in self.ranked()],
            "forward": [d.to_json() for d in self.forward], "gradients": [d.to_json() for d in self.grads],
            "output_gradients": [d.to_json() for d in self.output_grads],
            "optimizer_updates": [d.to_json() for d in self.applied],
            "micro_batches": {str(m): [d.to_json() for d in ds] for m, ds in self.micro_batches.items()},
            "drift": [d.to_json() for d in self.drift], "notes": self.notes, "seconds": self.seconds,
        }


def diagnose_captures(ref: StepCapture, test: StepCapture, case: CaseSpec, drift: list[DriftRun] | None = None,
                      structure: StepCapture | None = None, adam_eps: float | None = None,
                      fp64: StepCapture | None = None, diffs: Step1Diffs | None = None) -> Verdict:
    """Compare two step-1 captures (certify.evaluate_step1) and add the drift's findings.
    `structure` (the pytorch reference's capture) supplies the parameter order, module kinds and
    token losses when the baseline is another framework; `diffs`, the same captures already
    compared (`raw_diffs` of a verdict without `fp64`)."""
    ev = evaluate_step1(ref, test, case, adam_eps, structure, fp64, diffs)
    findings = add_drift_findings(list(ev.findings), drift or [], loss_threshold(case.name, case.dtype)[0])
    notes = list(ref.notes) + list(test.notes)
    if fp64 is not None:
        notes.append("each tensor may also differ by 3x what FP32 moves the reference itself from an FP64 run of "
                     "the same step")
    if not test.names("fwd"):
        notes.append(f"{test.framework} exposes no module outputs: its forward is judged from the step-1 loss and "
                     "the gradients")
    return Verdict(case=case.name, reference=ref.framework, test=test.framework, dtype=case.dtype,
                   tolerance=ev.tolerance, forward=ev.forward, grads=ev.grads, findings=findings, loss=ev.loss,
                   grad_kind=test.grad_kind, drift=list(drift or []), notes=notes, output_grads=ev.output_grads,
                   micro_batches=ev.micro_batches, applied=ev.applied, at_step=captured_step(test) - 1)
