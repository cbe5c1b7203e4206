"""The state a looked-at step starts from.

Step 1 starts from the case's initial weights. A later step N+1 starts from the reference's state
after step N -- its weights, optimizer state and data position -- loaded by each framework in its
own checkpoint format (`FrameworkRunner.at_step_problem` says which cannot yet): made here by the
reference for `lockstep diagnose --at-step N`, or the one a saving case of the run left for the
certificate of a case that resumes from it. A defect that shows only after step 1 (an optimizer
whose state or bias correction is wrong, a schedule) leaves step 1 agreeing from inside; from a
later state the same capture and comparison locate it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.runners.base import at_step_problem
from lockstep.runners.reference import ReferenceServices, SavedState


def check_at_step(case: CaseSpec, at_step: int, frameworks: list[str], runner_of, inputs) -> None:
    """One sentence (LockstepError) when step `at_step` + 1 of `case` cannot be compared from the
    reference's state after step `at_step` on every framework of `frameworks`."""
    if at_step < 0:
        raise LockstepError(f"--at-step {at_step}: a step cannot be negative (0, or no --at-step, compares step 1)")
    if at_step == 0:
        return
    if at_step >= case.steps:
        raise LockstepError(f"--at-step {at_step}: case {case.name} trains {case.steps} steps, so the latest state "
                            f"it can start from is the one after step {case.steps - 1}")
    if case.checkpoint is not None:
        raise LockstepError(f"--at-step {at_step}: case {case.name} saves or resumes itself (its checkpoint table); "
                            "diagnose --at-step makes the state it starts from: diagnose a case without one")
    for fw in frameworks:
        problem = at_step_problem(runner_of(fw), case, inputs)
        if problem:
            raise LockstepError(f"--at-step {at_step} on case {case.name}: {problem}")


def start_note(state: SavedState) -> str:
    """What a verdict says of the state its step started from."""
    made = f"; made in {state.seconds:.1f} s" if state.made else ""
    return (f"at step {state.step + 1}, from the reference's state after step {state.step} (its weights, Adam "
            f"state and data position, {state.bytes / 1e6:.1f} MB, loaded by each framework in its own "
            f"checkpoint format{made})")


def states_dir(out_dir: Path, step: int) -> Path:
    """Where the reference's state after `step` is made: `<out>/at_step_<step>/`."""
    return Path(out_dir) / f"at_step_{step}"


def make_start_state(reference: ReferenceServices, case: CaseSpec, inputs, step: int, out_dir: Path,
                     say=lambda text: None) -> SavedState:
    """The reference trains the case's first `step` steps and saves there, once for every framework."""
    say(f"the reference's state after step {step}: {reference.name} trains steps 1..{step} of {case.name} "
        "and saves ...")
    return reference.state_after(case, inputs, step, states_dir(out_dir, step))


def remove_start_state(state: SavedState) -> None:
    """A state made here (hundreds of MB for a 1B model's Adam) once every capture has loaded it;
    the reference's record and log of those steps stay. A saving case's folder is the run's: kept."""
    if state.made:
        shutil.rmtree(state.folder.parent, ignore_errors=True)


def resumed_start_state(reference: ReferenceServices, case: CaseSpec, out_dir: Path) -> SavedState:
    """The state a resumed case starts from: the reference's saving case's step folder in this run."""
    return reference.saved_state(case, Path(out_dir) / reference.name / f"{case.name}.log")
