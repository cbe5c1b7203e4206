"""`lockstep diagnose --at-step N`: step N+1 compared from inside, every framework starting it from
the same state -- the pytorch reference's weights, optimizer state and data position after N
steps, made once here (the reference trains the case's first N steps and saves after step N
through torch.distributed.checkpoint, runners/pytorch/checkpoint.py) and loaded by each framework
in its own checkpoint format (`FrameworkRunner.at_step_problem` says which cannot yet).

A defect that shows only after step 1 (an optimizer whose state or bias correction is wrong, a
schedule) leaves step 1 agreeing from inside; from a later state the same capture and comparison
locate it, and the capture then also holds the update each optimizer applied (`applied/`).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.runners import reference_framework


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
        problem = runner_of(fw).at_step_problem(case, inputs)
        if problem:
            raise LockstepError(f"--at-step {at_step} on case {case.name}: {problem}")


@dataclass(frozen=True)
class ReferenceState:
    """The reference's state after `step` steps of the case, as its torch.distributed.checkpoint folder."""

    step: int
    folder: Path
    seconds: float  # training the first `step` steps and saving them
    bytes: int
    losses: dict[int, float]  # the reference's losses of steps 1..step

    def note(self) -> str:
        return (f"at step {self.step + 1}, from the reference's state after step {self.step} (its weights, Adam "
                f"state and data position, {self.bytes / 1e6:.1f} MB, loaded by each framework in its own "
                f"checkpoint format; made in {self.seconds:.1f} s)")


def state_case(case: CaseSpec, at_step: int) -> CaseSpec:
    """The case the reference trains to make the state: its first `at_step` steps, on one device
    per DP rank as its step-1 capture has them (TP/PP are the same math)."""
    return dataclasses.replace(case, name=f"{case.name}_to_step{at_step}", steps=at_step, tp=1, pp=1, vpp=1,
                               sp=False, pp_layout=None)


def make_reference_state(plan, say=lambda text: None) -> ReferenceState:
    """Train the reference through step `plan.at_step` and save there: `<out>/diagnose/at_step_N/`."""
    from lockstep.runners.pytorch.checkpoint import CheckpointPlan, SavePlan, step_dir
    from lockstep.runners.pytorch.train import one_process_meant

    ref = reference_framework()
    runner = plan.runner(ref)
    case = state_case(plan.case, plan.at_step)
    work = state_dir(plan)
    root = work / ref / f"{case.name}.checkpoints"
    save = CheckpointPlan(save=SavePlan(str(root), interval=plan.at_step, keep=1))
    inputs = dataclasses.replace(plan.inputs, capture=None, save_final_params=False,
                                 extra={**plan.inputs.extra, "pytorch_checkpoints": save})
    say(f"the reference's state after step {plan.at_step}: {ref} trains steps 1..{plan.at_step} of {plan.case.name} "
        "and saves ...")
    start = time.perf_counter()
    with one_process_meant():
        record = runner.run(case, inputs, work)
    seconds = time.perf_counter() - start
    folder = step_dir(root, plan.at_step)
    if not record.ok:
        raise LockstepError(f"the reference's state after step {plan.at_step} of case {plan.case.name} could not be "
                            f"made: {record.error}")
    if not (folder / ".metadata").is_file():
        raise LockstepError(f"{folder}: the reference trained {plan.at_step} steps but saved no state there")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return ReferenceState(plan.at_step, folder, seconds, size, {s.step: s.loss for s in record.steps})


def state_dir(plan) -> Path:
    return plan.out_dir / f"at_step_{plan.at_step}"


def remove_state(plan) -> None:
    """The state (hundreds of MB for a 1B model's Adam) once every capture has loaded it; the
    reference's record and log of those steps stay."""
    for folder in (state_dir(plan) / reference_framework()).glob("*.checkpoints"):
        shutil.rmtree(folder, ignore_errors=True)
