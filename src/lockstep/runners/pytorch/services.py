"""The reference's services beyond training a case (runners/reference.py declares them): its state
after step N, the state a saving case left, that state under canonical names, and the resume
alternatives. `fp64_step1` and `train_fp64` are the runner's own (runner.py)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from lockstep.capture.state import CanonicalState
from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.runners.base import RunInputs
from lockstep.runners.checkpoint_plan import CheckpointPlan, SavePlan, plan_for, step_dir
from lockstep.runners.reference import SavedState


def state_case(case: CaseSpec, step: int) -> CaseSpec:
    """The case the reference trains to make the state: its first `step` steps, on one device per DP
    rank as its step-1 capture has them (TP/PP are the same math)."""
    return case.first_steps(step, name=f"{case.name}_to_step{step}", tp=1, pp=1, vpp=1, sp=False, pp_layout=None,
                            checkpoint=None)


class ReferenceServicesMixin:
    """What PyTorchRunner offers besides a run (the ReferenceServices protocol)."""

    def optimizer(self, inputs: RunInputs):
        return inputs.family.optimizer

    def state_after(self, case: CaseSpec, inputs: RunInputs, step: int, work_dir: Path) -> SavedState:
        from lockstep.runners.pytorch.train import one_process_meant

        made = state_case(case, step)
        root = Path(work_dir) / self.name / f"{made.name}.checkpoints"
        saving = dataclasses.replace(inputs, capture=None, save_final_params=False, extra={
            **inputs.extra, "pytorch_checkpoints": CheckpointPlan(save=SavePlan(str(root), interval=step, keep=1))})
        start = time.perf_counter()
        with one_process_meant():
            record = self.run(made, saving, Path(work_dir))
        if not record.ok:
            raise LockstepError(f"the reference's state after step {step} of case {case.name} could not be "
                                f"made: {record.error}")
        folder = step_dir(root, step)
        if not (folder / ".metadata").is_file():
            raise LockstepError(f"{folder}: the reference trained {step} steps but saved no state there")
        return SavedState(step, folder, time.perf_counter() - start, tuple((s.step, s.loss) for s in record.steps),
                          made=True)

    def saved_state(self, case: CaseSpec, log_path: Path) -> SavedState:
        plan = plan_for(case, Path(log_path))
        if plan is None or plan.resume is None:
            raise LockstepError(f"case {case.name} resumes from no saved state")
        return SavedState(plan.resume.step, Path(plan.resume.directory))

    def read_state(self, state: SavedState, case: CaseSpec, inputs: RunInputs) -> CanonicalState:
        from lockstep.runners.pytorch.canonical_state import read_canonical_state

        return read_canonical_state(str(state.folder), state.step, case, str(inputs.checkpoint))

    def train_resume_alternatives(self, case: CaseSpec, inputs: RunInputs, log_path: Path, out_dir: Path) -> list:
        from lockstep.runners.pytorch.alternatives import train_alternatives

        return train_alternatives(self, case, inputs, Path(log_path), Path(out_dir))
