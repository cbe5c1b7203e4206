"""Where a runner saves its step folders and which one it resumes from: a case's `checkpoint`
table (cases/spec.py CheckpointSpec) as a plan every framework that saves and resumes shares
(docs/reference/checkpoints.md). No torch here: the plan travels to torchrun workers as a dict.

Each framework keeps its own format inside the folders (pytorch: runners/pytorch/checkpoint.py,
torch.distributed.checkpoint; megatron: runners/megatron/checkpoint.py, megatron-core's
dist_checkpointing); the layout is the same for all:
`<out>/<framework>/<case>.checkpoints/step_NNNNNN/`, written as `step_NNNNNN.partial` and renamed.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from lockstep.cases.spec import CaseSpec

STEP_PREFIX = "step_"
PARTIAL_SUFFIX = ".partial"
# What-if loads of a checkpoint (ResumePlan.what_if): the resume judge's alternatives.
WHAT_IF_OPTIMIZER = ("fresh", "moments_zeroed", "step_reset")


def checkpoints_root(log_path: Path, case_name: str) -> Path:
    """Where a case's step folders go: beside its log, `<case>.checkpoints/`."""
    return Path(log_path).with_name(f"{case_name}.checkpoints")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"{STEP_PREFIX}{step:06d}"


def partial_dir(final: Path) -> Path:
    """Where a step folder is written before it is renamed into place (complete)."""
    return Path(final).with_name(Path(final).name + PARTIAL_SUFFIX)


def prune(root: Path, keep: int) -> list[Path]:
    """Remove all but the newest `keep` complete step folders under `root` (0: keep all); returns
    what was removed."""
    if keep <= 0:
        return []
    kept = sorted(p for p in Path(root).glob(f"{STEP_PREFIX}[0-9]*") if not p.name.endswith(PARTIAL_SUFFIX))
    removed = kept[: -keep]
    for old in removed:
        shutil.rmtree(old, ignore_errors=True)
    return removed


@dataclass(frozen=True)
class SavePlan:
    """Save after every `interval`-th step and after the last; keep the newest `keep` (0: all)."""

    root: str
    interval: int
    keep: int = 0
    optimizer: bool = True

    def due(self, step: int, last_step: int) -> bool:
        return self.interval > 0 and (step % self.interval == 0 or step == last_step)


@dataclass(frozen=True)
class ResumePlan:
    """Load the step folder `directory` (saved after step `step`) and train the steps after it.

    `what_if` (the judge's alternatives only): `data_step`, the 0-based step whose window the
    stream reads first instead of the saved position; `optimizer`, one of WHAT_IF_OPTIMIZER."""

    directory: str
    step: int
    data_step: int | None = None
    optimizer: str | None = None

    def what_if(self, data_step: int | None = None, optimizer: str | None = None) -> "ResumePlan":
        if optimizer is not None and optimizer not in WHAT_IF_OPTIMIZER:
            raise ValueError(f"unknown what-if optimizer {optimizer!r}")
        return ResumePlan(self.directory, self.step, data_step, optimizer)


@dataclass(frozen=True)
class CheckpointPlan:
    save: SavePlan | None = None
    resume: ResumePlan | None = None

    def clear_earlier_saves(self) -> None:
        """Remove the step folders an earlier run of this case saved (unless this run resumes from
        one of them): a resumed case must never load what another run left behind."""
        if self.save is None:
            return
        root = Path(self.save.root)
        if self.resume is not None and Path(self.resume.directory).parent == root:
            return
        shutil.rmtree(root, ignore_errors=True)

    def to_dict(self) -> dict:
        return {"save": vars(self.save) if self.save else None, "resume": vars(self.resume) if self.resume else None}

    @classmethod
    def from_dict(cls, d: dict | None) -> "CheckpointPlan | None":
        if not d:
            return None
        return cls(SavePlan(**d["save"]) if d.get("save") else None,
                   ResumePlan(**d["resume"]) if d.get("resume") else None)


def plan_for(case: CaseSpec, log_path: Path) -> CheckpointPlan | None:
    """The case's `checkpoint` table for a runner whose log is `log_path`: it saves beside its own
    log and resumes from `resume_case`'s folder there (its own name's when no case is named)."""
    spec = case.checkpoint
    if spec is None:
        return None
    save = (SavePlan(str(checkpoints_root(log_path, case.name)), spec.save_interval, spec.max_checkpoint_keep,
                     spec.save_optimizer_state) if spec.save_interval else None)
    resume = None
    if spec.resume_from is not None:
        source = checkpoints_root(log_path, spec.resume_case or case.name)
        resume = ResumePlan(str(step_dir(source, spec.resume_from)), spec.resume_from)
    return CheckpointPlan(save, resume)


class ShiftedBatches:
    """The contract's batches read `shift` steps away from the loop's step (a what-if resume, or
    a resume whose saved data position is not its step)."""

    def __init__(self, batches, shift: int):
        self.batches, self.shift = batches, shift

    def micro_batch(self, step: int, micro_step: int):
        return self.batches.micro_batch(step + self.shift, micro_step)

    def __getattr__(self, name):  # everything else (the megatron batches' attention mask) is the stream's
        return getattr(self.batches, name)
