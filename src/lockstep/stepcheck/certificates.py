"""`lockstep run`'s certificate stage: each certified pair's first step compared from inside, the
certificate written beside the test's record for the comparison to read.

A case trained from its initial weights is certified at step 1, from the captures its runs recorded
(or captured after the run). A resumed case is certified at the first step it trains, which every
framework records after all runs from the reference's saved state (the folder its saving case left,
as `diagnose --at-step` starts from a state), so both sides start that step alike; each framework's
own resume is judged by the resume verdict. A pair whose loss FAILs with nothing to explain it and
that had no certificate (BF16 pairs are not certified unless asked) gets one after the comparison.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from lockstep.certify.certificate import Certificate, certificate_path, certify, write_certificate
from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.formats.step_capture import StepCapture
from lockstep.runners.base import at_step_problem, capture_problem, first_step
from lockstep.runners.reference import ReferenceServices, SavedState, reference_services
from lockstep.stepcheck.judge import Fp64Step, judge
from lockstep.stepcheck.request import certificate_request
from lockstep.stepcheck.state import resumed_start_state

UNEXPLAINED = "FAIL unexplained"  # compare/policy.VerdictClass.FAIL_UNEXPLAINED's value in summary.json


def certify_outcomes(plan, outcomes, say=lambda text: None) -> list[Certificate]:
    """Every certified pair of the run (plan.certifies), its certificate written and returned."""
    by_pair = {(o.case.name, o.framework): o for o in outcomes}
    reference = reference_services()
    made: list[Certificate] = []
    for case in plan.cases:
        if plan.certifies(case):
            made += certify_case(plan, case, by_pair, reference, [r.name for r in plan.runners[1:]], say)
    return made


def certify_unexplained(plan, outcomes, summary: dict, say=lambda text: None) -> list[Certificate]:
    """Pairs whose loss FAILs unexplained without a certificate (BF16 unless asked): certified now,
    their first step captured after the run; the caller compares again."""
    if not plan.certify or len(plan.runners) < 2 or plan.nodes.multi_node:
        return []
    wanted: dict[str, list[str]] = {}
    for comp in summary.get("comparisons", []):
        for c in comp.get("cases", []):
            if c.get("verdict") == UNEXPLAINED and not c.get("certificate"):
                wanted.setdefault(c["case"], []).append(comp["test_framework"])
    by_pair = {(o.case.name, o.framework): o for o in outcomes}
    reference = reference_services()
    made: list[Certificate] = []
    for case in plan.cases:
        if case.name in wanted and not plan.certifies(case):
            say(f"{case.name} FAILs with nothing to explain it: certifying its first step now")
            made += certify_case(plan, case, by_pair, reference, wanted[case.name], say, after_run=True)
    return made


def certify_case(plan, case: CaseSpec, by_pair: dict, reference: ReferenceServices, tests: list[str],
                 say=lambda text: None, after_run: bool = False) -> list[Certificate]:
    """The certificates of `case`'s pairs (baseline, each of `tests` that trained it)."""
    baseline_runner = plan.runners[0]
    base = by_pair.get((case.name, baseline_runner.name))
    if base is None or base.record is None or not base.record.ok:
        return []
    start, start_problem = start_of(plan, case, reference)
    capture = (lambda runner, outcome: recorded_after(plan, case, runner, start, start_problem)) if (
        after_run or first_step(case) > 1) else (lambda runner, outcome: recorded_capture(outcome))
    ref, ref_problem = capture(baseline_runner, base)
    fp64 = Fp64Step.for_pair(baseline_runner.name, reference.name, first_step(case), lambda: reference.fp64_step1(
        case, plan.inputs[case.name], plan.capture_path(f"{reference.name}-fp64", case)))
    made = []
    for runner in plan.runners[1:]:
        test = by_pair.get((case.name, runner.name))
        if runner.name not in tests or test is None or test.record is None or not test.record.ok:
            continue
        other, other_problem = capture(runner, test)
        cert = certificate_of(case, baseline_runner.name, runner.name, (ref, ref_problem), (other, other_problem),
                              fp64, say)
        write_certificate(certificate_path(plan.out_dir / runner.name, case.name), cert)
        say(f"step-{cert.step} certificate {runner.name} vs {baseline_runner.name} on {case.name}: "
            f"{cert.summary_line()}")
        made.append(cert)
    return made


def certificate_of(case: CaseSpec, baseline: str, test: str, ref: tuple, other: tuple, fp64: Fp64Step,
                   say) -> Certificate:
    """The pair's certificate from (capture path, why none) of each side."""
    (ref_path, ref_problem), (other_path, other_problem) = ref, other
    if ref_path is None or other_path is None:
        return Certificate(case=case.name, baseline=baseline, test=test, dtype=case.dtype, step=first_step(case),
                           problem="; ".join(p for p in (ref_problem, other_problem) if p))
    try:
        ref_capture, test_capture = StepCapture.load(ref_path), StepCapture.load(other_path)
        return judge(lambda fp64_capture, diffs: certify(ref_capture, test_capture, case, fp64=fp64_capture,
                                                         diffs=diffs),
                     fp64, say, pair=f"step-1 certificate {test} vs {baseline} on {case.name}")
    except (LockstepError, ValueError) as e:
        return Certificate(case=case.name, baseline=baseline, test=test, dtype=case.dtype, step=first_step(case),
                           problem=f"the captures cannot be compared: {e}")


def start_of(plan, case: CaseSpec, reference: ReferenceServices) -> tuple[SavedState | None, str | None]:
    """The state the case's first step starts from: None (its initial weights), or a resumed case's
    saved state, the reference's, which must be the baseline (None and why not)."""
    if first_step(case) == 1:
        return None, None
    if plan.runners[0].name != reference.name:
        return None, (f"a resumed case is certified from the {reference.name} reference's saved state, and the "
                      f"baseline is {plan.runners[0].name}")
    return resumed_start_state(reference, case, plan.out_dir), None


def recorded_capture(outcome) -> tuple[str | None, str | None]:
    """(the capture its run recorded, None), or (None, a sentence saying why there is none)."""
    meta = outcome.record.meta
    path = meta.get("step1_capture")
    if path and Path(path).is_file():
        return path, None
    return None, f"{outcome.framework} recorded no step 1 ({meta.get('step1_capture_error') or 'no capture written'})"


def recorded_after(plan, case: CaseSpec, runner, start: SavedState | None,
                   start_problem: str | None) -> tuple[str | None, str | None]:
    """The case's first step recorded by `runner` after every run: from `start` (a resumed case), or
    from the initial weights (a pair certified after its comparison)."""
    if start_problem:
        return None, start_problem
    inputs = plan.inputs[case.name]
    problem = at_step_problem(runner, case, inputs) if start else capture_problem(runner, case, inputs)
    step = start.step + 1 if start else 1
    if problem:
        origin = " from the reference's saved state" if start else ""
        return None, f"{runner.name} cannot record step {step}{origin} ({problem})"
    request = certificate_request(plan, case, runner.name, start)
    try:
        runner.capture(case, dataclasses.replace(inputs, capture=request), Path(request.path).parent / "work", request)
    except LockstepError as e:
        origin = " from the reference's saved state" if start else ""
        return None, f"{runner.name} could not record step {step}{origin} ({e})"
    return request.path, None
