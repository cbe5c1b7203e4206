"""The services lockstep's reference trainer offers the rest of lockstep, declared here.

Looking inside a step (lockstep/stepcheck: certificates, diagnose, --at-step, resumed cases) and
the evidence the verdict policy asks for need more of the reference than a run: its step 1 in
FP64, a whole run in FP64, its training state after step N (made, or one a saving case left),
that state read under canonical LLMC names for another framework to load, and the alternatives a
broken resume would have trained. This module names them as one interface; the registered
reference runner (the runner whose `Capabilities.reference` is set: `pytorch`) implements it, and
nothing outside its own package imports that package's modules. Other runners reach the state
they load through `reference_services()` too (megatron's and InfiniTrain's --at-step).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from lockstep.errors import LockstepError
from lockstep.runners.registry import get_runner, reference_framework

if TYPE_CHECKING:
    from lockstep.capture.state import CanonicalState
    from lockstep.cases.spec import CaseSpec
    from lockstep.formats.run_record import RunRecord
    from lockstep.formats.step_capture import StepCapture
    from lockstep.models.family import OptimizerSpec
    from lockstep.runners.base import RunInputs


@dataclass(frozen=True)
class SavedState:
    """A training state the reference saved: its own checkpoint folder after `step` steps."""

    step: int
    folder: Path
    seconds: float = 0.0  # what making it cost (0: a saving case of the run had left it)
    losses: tuple[tuple[int, float], ...] = ()  # the reference's losses of the steps that made it
    made: bool = False  # made for looking inside a step (removed once loaded), not a saving case's own

    @property
    def bytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())


@runtime_checkable
class ReferenceServices(Protocol):
    """What the reference runner does for the rest of lockstep besides training a case."""

    name: str

    def optimizer(self, inputs: "RunInputs") -> "OptimizerSpec":
        """The optimizer the reference trains the inputs' family with (its constants: Adam's eps, betas)."""

    def fp64_step1(self, case: "CaseSpec", inputs: "RunInputs", path: Path) -> "StepCapture":
        """Step 1 of the case in FP64, sketched as certificates keep captures: what FP32 moves each tensor by."""

    def train_fp64(self, case: "CaseSpec", inputs: "RunInputs", record_path: Path) -> "RunRecord":
        """The whole case in FP64 as a record (the policy's evidence of Adam amplifying rounding)."""

    def state_after(self, case: "CaseSpec", inputs: "RunInputs", step: int, work_dir: Path) -> SavedState:
        """Train the case's first `step` steps and save the state there (weights, optimizer, data position)."""

    def saved_state(self, case: "CaseSpec", log_path: Path) -> SavedState:
        """The state a resumed case starts from: the folder its saving case left beside `log_path`."""

    def read_state(self, state: SavedState, case: "CaseSpec", inputs: "RunInputs") -> "CanonicalState":
        """A saved state under canonical LLMC names, for another framework to write in its own format."""

    def train_resume_alternatives(self, case: "CaseSpec", inputs: "RunInputs", log_path: Path,
                                  out_dir: Path) -> list:
        """The resumed case trained the way each broken resume would (compare/resume.ResumeAlternative)."""


def reference_services(framework_options=None) -> ReferenceServices:
    """The registered reference runner, as the services it declares."""
    runner = get_runner(reference_framework(), framework_options)
    if not isinstance(runner, ReferenceServices):
        raise LockstepError(f"the reference runner {runner.name!r} does not offer the reference's services")
    return runner
