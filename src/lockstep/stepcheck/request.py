"""The one builder of capture requests (what a runner records of a step), and the optimizer's
constants a capture needs, derived here only."""

from __future__ import annotations

from pathlib import Path

from lockstep.capture.request import CAPTURE_ROWS, CaptureRequest
from lockstep.models.family import OptimizerSpec
from lockstep.runners.reference import SavedState


def adam_eps(optimizer: OptimizerSpec) -> float | None:
    """Adam's eps where the family trains with Adam (its first update u = g/(|g| + eps) is what a
    framework that only saves weights can show), None for SGD. Every capture records the eps it was
    made with (its request), so that what compares two captures reads it back from them."""
    return optimizer.eps if optimizer.kind == "adam" else None


def capture_request(path: str | Path, optimizer: OptimizerSpec, *, reference: str | Path | None = None,
                    full: bool = False, whole_grads: bool = True, applied: bool = False,
                    start: SavedState | None = None) -> CaptureRequest:
    """What a runner records of the step after `start` (step 1 from the initial weights when None):
    sketches for a certificate, or whole tensors (`full`) for diagnose; `reference` is the
    baseline's capture of the same step (a runner that recovers gradients reads its lr from it)."""
    return CaptureRequest(path=str(path), full=full, adam_eps=adam_eps(optimizer), rows=CAPTURE_ROWS,
                          reference=str(reference) if reference is not None else None, whole_grads=whole_grads,
                          applied=applied, start_step=start.step if start else 0,
                          start_state=str(start.folder) if start else None)


def optimizer_of(case, inputs) -> OptimizerSpec:
    """The optimizer a case trains with: the family's as the reference declares it (its constants:
    Adam's eps), with the case's own settings (CaseSpec.optimizer_of: a build's hard-coded beta2)."""
    from lockstep.runners.reference import reference_services

    return case.optimizer_of(reference_services().optimizer(inputs))


def certificate_request(plan, case, framework: str, start: SavedState | None = None) -> CaptureRequest:
    """What a certificate of `lockstep run` asks `framework` to record of the case's first step (step 1,
    or the step after `start`): sketches into the run's step1/ folder, beside the baseline's."""
    baseline = plan.runners[0].name
    return capture_request(plan.capture_path(framework, case), optimizer_of(case, plan.inputs[case.name]),
                           reference=plan.capture_path(baseline, case) if framework != baseline else None,
                           start=start)
