"""The verdict of `lockstep diagnose` on one pair: ranked tensor table, first diverging module,
one line per finding, the loss check and the drift, as one object (terminal, JSON, HTML)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lockstep.cases.spec import CaseSpec, THRESHOLDS
from lockstep.diagnose.capture import StepCapture
from lockstep.diagnose.classify import (NONE, TENSOR_TOLERANCE, Finding, LossCheck, add_drift_findings,
                                       add_output_grad_findings, classify, loss_check)
from lockstep.diagnose.compare import TensorDiff, compare_forward, compare_grads, compare_output_grads


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
        rows = sorted(self.forward + self.output_grads + self.grads, key=lambda d: (-d.rel, -d.max_abs))
        return rows[:n] if n else rows

    def to_json(self) -> dict:
        return {
            "case": self.case, "reference": self.reference, "test": self.test, "dtype": self.dtype,
            "tensor_tolerance": self.tolerance, "gradient_source": self.grad_kind,
            "verdict": self.headline, "first_diverging_module": self.first_diverging_module,
            "first_diverging_output_gradient": self.first_diverging_output_grad,
            "findings": [f.to_json() for f in self.findings], "loss_step1": self.loss.to_json(),
            "ranked": [d.to_json() for d in self.ranked()],
            "forward": [d.to_json() for d in self.forward], "gradients": [d.to_json() for d in self.grads],
            "output_gradients": [d.to_json() for d in self.output_grads],
            "drift": [d.to_json() for d in self.drift], "notes": self.notes, "seconds": self.seconds,
        }


def diagnose_captures(ref: StepCapture, test: StepCapture, case: CaseSpec, drift: list[DriftRun] | None = None,
                      structure: StepCapture | None = None) -> Verdict:
    """Compare two step-1 captures. `structure` (the pytorch reference's capture) supplies the
    parameter order, module kinds and tie parts when the baseline is another framework."""
    if structure is not None:
        for attr in ("param_order", "module_kind", "tie_parts"):
            if not getattr(ref, attr):
                setattr(ref, attr, getattr(structure, attr))
        if ref.token_losses is None:
            ref.token_losses = structure.token_losses
    tol = TENSOR_TOLERANCE[case.dtype]
    forward = compare_forward(ref, test)
    grads = compare_grads(ref, test)
    output_grads = compare_output_grads(ref, test)
    loss = loss_check(ref, test, THRESHOLDS[case.dtype])
    findings = classify(ref, test, forward, grads, tol, loss)
    findings = add_output_grad_findings(findings, forward, output_grads, tol, test.grad_kind)
    findings = add_drift_findings(findings, drift or [], THRESHOLDS[case.dtype])
    notes = list(ref.notes) + list(test.notes)
    if not test.forward:
        notes.append(f"{test.framework} exposes no module outputs: its forward is judged from the step-1 loss and "
                     "the gradients")
    return Verdict(case=case.name, reference=ref.framework, test=test.framework, dtype=case.dtype, tolerance=tol,
                   forward=forward, grads=grads, findings=findings, loss=loss, grad_kind=test.grad_kind,
                   drift=list(drift or []), notes=notes, output_grads=output_grads)
