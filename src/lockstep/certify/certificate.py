"""The step-1 certificate of one (baseline, test) pair of a case: whether their first steps agree
from inside (every module output, every gradient), and if not, what the first difference is.

`evaluate_step1` is the one comparison of two captures (diagnose builds its verdict on it too);
a `Certificate` is what `lockstep run` keeps of it, as `<out>/<test>/<case>.certificate.json`
beside the test's record, for the comparison to read: it *holds* when no finding points at a
defect (the loss printed with less precision is not one). A pair whose step 1 could not be
captured has a certificate with `problem` set, which holds nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.cases.lr_schedule import lrs_of
from lockstep.cases.spec import CaseSpec
from lockstep.compare.policy import loss_threshold
from lockstep.certify.classify import (ADAM_SIGN_SHARE, BACKWARD_INPUT, DOWNSTREAM, FORWARD, GRADIENT_ONLY,
                                       LR_SCHEDULE, MICRO_BATCH, OPTIMIZER, TENSOR_TOLERANCE, TIE, Finding, LossCheck,
                                       add_applied_findings, add_micro_batch_findings, add_output_grad_findings,
                                       classify, differs, loss_check)
from lockstep.certify.lora import LORA_KINDS, add_lora_findings
from lockstep.certify.routing import (ROUTING_KINDS, LayerRouting, add_routing_findings, compare_routing,
                                     group_expert_findings)
from lockstep.certify.tensors import (ADAM_UPDATE, TensorDiff, compare_applied, compare_forward,
                                      compare_grads, compare_micro_batches, compare_output_grads, diff)
from lockstep.errors import FormatError
from lockstep.formats.step_capture import GRAD_ADAM_UPDATE, StepCapture
from lockstep.fsutil import atomic_write, read_text

CERTIFICATE_SUFFIX = ".certificate.json"
# Findings that say the two frameworks compute differently; the others (logging precision) do not.
DEFECT_KINDS = (FORWARD, TIE, BACKWARD_INPUT, GRADIENT_ONLY, DOWNSTREAM, MICRO_BATCH, OPTIMIZER, LR_SCHEDULE,
                *ROUTING_KINDS, *LORA_KINDS)


@dataclass
class Step1Evaluation:
    tolerance: float
    forward: list[TensorDiff]
    micro_batches: dict[int, list[TensorDiff]]
    output_grads: list[TensorDiff]
    grads: list[TensorDiff]
    loss: LossCheck
    findings: list[Finding]
    routing: list[LayerRouting] = field(default_factory=list)  # MoE layers: the routers compared
    applied: list[TensorDiff] = field(default_factory=list)  # the optimizers' applied updates (--at-step)
    raw: "Step1Diffs | None" = None  # the comparison before any FP64 allowance (a second judgement reuses it)


@dataclass
class Step1Diffs:
    """Every tensor two step-1 captures share, compared (before any FP64 rounding allowance)."""

    forward: list[TensorDiff]
    micro_batches: dict[int, list[TensorDiff]]
    grads: list[TensorDiff]
    output_grads: list[TensorDiff]
    applied: list[TensorDiff] = field(default_factory=list)


def compare_step1(ref: StepCapture, test: StepCapture, adam_eps: float | None = None) -> Step1Diffs:
    return Step1Diffs(forward=compare_forward(ref, test), micro_batches=compare_micro_batches(ref, test),
                      grads=compare_grads(ref, test, adam_eps), output_grads=compare_output_grads(ref, test),
                      applied=compare_applied(ref, test))


def evaluate_step1(ref: StepCapture, test: StepCapture, case: CaseSpec, adam_eps: float | None = None,
                   structure: StepCapture | None = None, fp64: StepCapture | None = None,
                   diffs: Step1Diffs | None = None) -> Step1Evaluation:
    """Compare two step-1 captures. `structure` (the reference runner's capture) supplies the
    parameter order, module kinds and token losses when the baseline is another framework.
    `fp64`, the reference's step 1 in FP64, gives each tensor what FP32 arithmetic itself moves it
    by (ROUNDING_FACTOR x the reference's own distance from it): a deep, wide model's outputs part
    by more than the flat tolerance with nothing wrong. `diffs`: the same two captures already
    compared (`compare_step1`), when only the allowance is new: a 1B model's whole tensors are
    then not read and compared a second time."""
    if structure is not None and structure is not ref:
        for attr in ("param_order", "module_kind"):
            if not getattr(ref, attr):
                setattr(ref, attr, getattr(structure, attr))
        if ref.token_losses is None:
            ref.token_losses = structure.token_losses
        if not ref.names("tie"):  # the embedding use's part of a tied gradient, which only the reference knows
            ref.tie_parts = structure.tie_parts
            ref.sketches.update({k: v for k, v in structure.sketches.items() if k.startswith("tie/")})
    tol = TENSOR_TOLERANCE[case.dtype]
    diffs = diffs or compare_step1(ref, test, adam_eps)
    forward, micro, grads, output_grads = diffs.forward, diffs.micro_batches, diffs.grads, diffs.output_grads
    if fp64 is not None:
        forward, grads, output_grads = (with_rounding(ds, ref, fp64, kind)
                                        for ds, kind in ((forward, "fwd"), (grads, "grad"), (output_grads, "outgrad")))
        micro = {m: with_rounding(ds, ref, fp64, "fwd") for m, ds in micro.items()}
    loss = loss_check(ref, test, loss_threshold(case.name, case.dtype)[0])
    paired_wrong = add_micro_batch_findings([], forward, micro, tol)
    if paired_wrong:
        # A micro batch handed the wrong data explains every gradient that differs: it is the finding.
        wrong = [d for d in grads if differs(d, tol)]
        findings = paired_wrong + ([Finding(DOWNSTREAM, paired_wrong[0].where,
                                            f"{len(wrong)} of {len(grads)} gradients differ, as micro batches "
                                            "handed the wrong data make them; fix the pairing first")] if wrong else [])
    else:
        findings = classify(ref, test, forward, grads, tol, loss)
        findings = add_output_grad_findings(findings, forward, output_grads, tol, test.grad_kind)
    findings = group_expert_findings(findings, grads, tol)
    findings = add_lora_findings(findings, ref, test, case, grads, tol)  # a LoRA case's own, first
    # MoE routers (from the captures themselves: a few KB, never part of reused diffs)
    routing = compare_routing(ref, test)
    if routing:
        findings = add_routing_findings(findings, routing, forward, tol)
    findings = add_applied_findings(findings, diffs.applied, tol, captured_step(test), lrs_of(case))
    return Step1Evaluation(tol, forward, micro, output_grads, grads, loss, findings, routing, diffs.applied, diffs)


def captured_step(capture: StepCapture) -> int:
    """The step a capture is of: 1, or the one after the saved state it started from (--at-step)."""
    return int((capture.meta.get("request") or {}).get("start_step", 0)) + 1


ROUNDING_FACTOR = 3.0  # a framework may differ from the reference by 3x what FP32 moves the reference itself


def with_rounding(diffs: list[TensorDiff], ref: StepCapture, fp64: StepCapture, kind: str) -> list[TensorDiff]:
    """Each tensor's FP32 rounding allowance: ROUNDING_FACTOR x |ref_fp32 - ref_fp64| / |ref_fp64|."""
    out = []
    for d in diffs:
        if d.kind == ADAM_UPDATE:
            out.append(d)
            continue
        env = diff(fp64, ref, kind, d.name, d.kind)
        out.append(dataclasses.replace(d, rounding=ROUNDING_FACTOR * env.rel) if env is not None else d)
    return out


CLOSE_CALL = 100.0  # findings whose tensors are all within this many tolerances of it


def close_call(findings: list[Finding], diffs, tolerance: float) -> bool:
    """Findings that part by only a little (every tensor within CLOSE_CALL tolerances, no micro batch
    paired wrong): FP32 rounding of a deep, wide model can do that, and an FP64 step 1 of the
    reference (`fp64=`) says how much."""
    rels = [d.rel for d in diffs if d is not None and d.kind != ADAM_UPDATE]
    # A drift's optimizer finding is of losses, not tensors: FP32 rounding of the step's tensors cannot explain it.
    return (any(f.kind in DEFECT_KINDS and (f.kind != OPTIMIZER or f.tensors) for f in findings)
            and not any(f.kind == MICRO_BATCH for f in findings)
            and bool(rels) and max(rels) < CLOSE_CALL * tolerance)


def _worst(diffs: list[TensorDiff]) -> TensorDiff | None:
    return max(diffs, key=lambda d: d.rel, default=None)


@dataclass
class Certificate:
    case: str
    baseline: str
    test: str
    dtype: str = "float32"
    tolerance: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    loss: LossCheck | None = None
    grad_kind: str = ""
    worst: dict[str, TensorDiff | None] = field(default_factory=dict)  # "forward", "gradient", ... -> worst
    compared: dict[str, int] = field(default_factory=dict)  # tensors compared, by kind
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    problem: str | None = None  # why there is no certificate (a side could not be captured)
    # The step certified: 1, or a resumed case's first step after its resume point (captured by
    # both sides from the reference's saved state after the step before, as diagnose --at-step).
    step: int = 1
    # The tensors' comparison before any FP64 allowance, in memory only (a close call's second judgement).
    diffs: Step1Diffs | None = field(default=None, repr=False, compare=False)

    def raw_diffs(self) -> Step1Diffs | None:
        return self.diffs

    @property
    def available(self) -> bool:
        return self.problem is None

    @property
    def holds(self) -> bool:
        """Step 1 agrees from inside: no finding that says the frameworks compute differently."""
        return self.available and not any(f.kind in DEFECT_KINDS for f in self.findings)

    @property
    def close_call(self) -> bool:
        return self.available and close_call(self.findings, self.worst.values(), self.tolerance)

    @property
    def cause(self) -> Finding | None:
        return next((f for f in self.findings if f.kind in DEFECT_KINDS), None)

    @property
    def cause_line(self) -> str | None:
        """The first finding that points at a defect, naming the others' places after it."""
        defects = [f for f in self.findings if f.kind in DEFECT_KINDS]
        if not defects:
            return None
        more = [f.where for f in defects[1:] if f.kind != DOWNSTREAM]
        return defects[0].line + (f"; also {', '.join(more)}" if more else "")

    def summary_line(self) -> str:
        if not self.available:
            return f"no certificate: {self.problem}"
        if self.cause is not None:
            return self.cause_line
        parts = [f"{n} {what}" for what, n in self.compared.items() if n]
        worst = [f"{what} ≤ {d.rel:.1e}" for what, d in self.worst.items() if d is not None]
        adam = (f"; the gradients are the signs of Adam's first update, which may differ in "
                f"{ADAM_SIGN_SHARE:.0e} of a tensor's elements" if self.grad_kind == GRAD_ADAM_UPDATE else "")
        return (f"step {self.step} agrees from inside ({', '.join(parts)}; relative error {', '.join(worst)}, "
                f"tolerance {self.tolerance:.0e}{adam})")

    def to_json(self) -> dict:
        return {"case": self.case, "baseline": self.baseline, "test": self.test, "dtype": self.dtype,
                "tensor_tolerance": self.tolerance, "holds": self.holds, "available": self.available,
                "problem": self.problem, "summary": self.summary_line(),
                "cause": self.cause.to_json() if self.cause else None,
                "findings": [f.to_json() for f in self.findings],
                "loss_step1": self.loss.to_json() if self.loss else None, "gradient_source": self.grad_kind,
                "worst": {k: (d.to_json() if d else None) for k, d in self.worst.items()},
                "compared": self.compared, "notes": self.notes, "seconds": self.seconds, "step": self.step}

    @classmethod
    def from_json(cls, d: dict) -> "Certificate":
        loss = d.get("loss_step1")
        return cls(case=d["case"], baseline=d["baseline"], test=d["test"], dtype=d.get("dtype", "float32"),
                   tolerance=d.get("tensor_tolerance", 0.0),
                   findings=[Finding(f["kind"], f["where"], f["classification"], tuple(f.get("tensors", ())))
                             for f in d.get("findings", [])],
                   loss=LossCheck(loss["reference"], loss["test"], loss["threshold"],
                                  loss.get("fp32_sequential_sum_shift")) if loss else None,
                   grad_kind=d.get("gradient_source", ""),
                   worst={k: (TensorDiff.from_json(v) if v else None) for k, v in d.get("worst", {}).items()},
                   compared=d.get("compared", {}), notes=d.get("notes", []), seconds=d.get("seconds", 0.0),
                   problem=d.get("problem"), step=int(d.get("step", 1)))


def certify(ref: StepCapture, test: StepCapture, case: CaseSpec, adam_eps: float | None = None,
            structure: StepCapture | None = None, fp64: StepCapture | None = None,
            diffs: Step1Diffs | None = None) -> Certificate:
    start = time.perf_counter()
    if captured_step(ref) != captured_step(test):
        # Tensors of two different steps part by training, not by a defect: no certificate.
        raise ValueError(f"the {ref.framework} capture is of step {captured_step(ref)}, the {test.framework} "
                         f"capture of step {captured_step(test)}")
    ev = evaluate_step1(ref, test, case, adam_eps, structure, fp64, diffs)
    micro = [d for ds in ev.micro_batches.values() for d in ds]
    cert = Certificate(
        case=case.name, baseline=ref.framework, test=test.framework, dtype=case.dtype, tolerance=ev.tolerance,
        step=captured_step(test),
        findings=ev.findings, loss=ev.loss, grad_kind=test.grad_kind,
        worst={"module outputs": _worst(ev.forward), "later micro batches": _worst(micro),
               "output gradients": _worst(ev.output_grads), "gradients": _worst(ev.grads),
               **({"routing weights": _worst([r.weights for r in ev.routing if r.weights]),
                   "aux losses": _worst([r.aux for r in ev.routing if r.aux])} if ev.routing else {}),
               **({"optimizer updates": _worst(ev.applied)} if ev.applied else {})},
        compared={"module outputs": len(ev.forward), "later micro batches": len(micro),
                  "output gradients": len(ev.output_grads), "gradients": len(ev.grads),
                  **({"routed tokens": sum(r.tokens for r in ev.routing),
                      "aux losses": sum(r.aux is not None for r in ev.routing)} if ev.routing else {}),
                  **({"optimizer updates": len(ev.applied)} if ev.applied else {})},
        notes=list(ref.notes) + list(test.notes) + (
            [f"each tensor may also differ by {ROUNDING_FACTOR:g}x what FP32 moves the reference itself from an FP64 "
             f"run of the same step ({fp64.source})"] if fp64 is not None else []), diffs=ev.raw)
    cert.seconds = round(time.perf_counter() - start, 3)
    return cert


def certificate_path(framework_dir: str | os.PathLike, case: str) -> Path:
    return Path(framework_dir) / f"{case}{CERTIFICATE_SUFFIX}"


def write_certificate(path: str | os.PathLike, cert: Certificate) -> Path:
    with atomic_write(path, "w", what="step-1 certificate") as f:
        json.dump(cert.to_json(), f, indent=2, allow_nan=True)
        f.write("\n")
    return Path(path)


def read_certificate(path: str | os.PathLike) -> Certificate:
    text = read_text(path, "step-1 certificate")
    try:
        return Certificate.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError) as e:
        raise FormatError(path, f"is not a lockstep step-1 certificate ({type(e).__name__}: {e})") from None
