"""Checkpoint cases on InfiniTrain: its own `--save`/`--load` (docs/reference/checkpoints.md).

A saving case passes `--save <log dir>/<case>.checkpoints --save_interval N --max_checkpoint_keep K
--save_optimizer_state=B` (the root of the plan every framework shares, runners/checkpoint_plan.py);
InfiniTrain writes `checkpoint_step_NNNNNN/` there after every N-th step and after the last
(example/gpt2/main.cc:508-515), and prunes to the newest K by name (0 keeps all, as the case's 0
means). A resumed case passes `--load` of the saving case's
`checkpoint_step_<resume_from>` folder; InfiniTrain restarts its step loop at the saved global
step and skips its loader to the saved batch, so it logs steps resume_from+1..steps, and
compare/resume.py judges them against the saving case's run.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from lockstep.cases.spec import CaseSpec
from lockstep.errors import FormatError, RunError
from lockstep.formats.infinitrain_checkpoint import read_checkpoint_folder, saved_steps
from lockstep.runners.checkpoint_plan import plan_for

STEP_PREFIX = "checkpoint_step_"  # InfiniTrain's own name for a step folder (main.cc:511), not the shared plan's
# checkpoint_manager.cc SaveCheckpoint: "Checkpoint saved at: DIR (12.34 ms)", once per save (main rank).
_SAVED = re.compile(r"Checkpoint saved at: .* \(([0-9.]+) ms\)")
# checkpoint.cc Checkpoint::Load logs "[CKPT] Loading model: ..." first and "[CKPT] Load done: ..." last, each
# under glog's prefix, whose time of day (microseconds) is all the log says of how long the load took.
_GLOG_TIME = r"^[IWEF](?:\d{4})?\d{4} (\d\d):(\d\d):(\d\d\.\d{6}) .*"
_LOAD_BEGIN = re.compile(_GLOG_TIME + r"\[CKPT\] Loading model: ", re.M)
_LOAD_DONE = re.compile(_GLOG_TIME + r"\[CKPT\] Load done: ", re.M)


def step_folder(root: Path, step: int) -> Path:
    return Path(root) / f"{STEP_PREFIX}{step:06d}"


@dataclass(frozen=True)
class InfiniTrainCheckpoints:
    """What a checkpoint case asks of one InfiniTrain launch: where it saves (None: it does not)
    and which folder it resumes from (None: from step 0)."""

    save_root: Path | None
    resume_folder: Path | None
    interval: int = 0
    keep: int = 3
    optimizer: bool = True

    def flags(self) -> list[str]:
        out = []
        if self.save_root is not None:
            out += ["--save", str(self.save_root), "--save_interval", str(self.interval),
                    "--max_checkpoint_keep", str(self.keep),
                    f"--save_optimizer_state={'true' if self.optimizer else 'false'}"]
        if self.resume_folder is not None:
            out += ["--load", str(self.resume_folder)]
        return out

    def prepare(self) -> None:
        """Before the launch: the folder resumed from must be there and whole (RunError naming it), and a
        saving case starts from an empty root, so that a resume never loads what an earlier run left."""
        if self.resume_folder is not None and not self.resume_folder.is_dir():
            raise RunError(f"{self.resume_folder}: no InfiniTrain checkpoint there; the saving case must run first, "
                           "with a save_interval that reaches the step")
        if self.resume_folder is not None:
            problems = folder_problems(self.resume_folder)
            if problems:
                raise RunError(f"the checkpoint to resume from is not whole: {_first(problems)}")
        if self.save_root is not None and not (self.resume_folder is not None
                                               and self.resume_folder.parent == self.save_root):
            shutil.rmtree(self.save_root, ignore_errors=True)

    def check_saved(self) -> None:
        """After a launch that exited 0: every step folder it saved must be a whole checkpoint. InfiniTrain
        does not check its writes: with the disk full (H200, 2026-12-03) it wrote 4.0 GB of an 18 GB
        step folder and 358 bytes of the next, and exited 0."""
        if self.save_root is None:
            return
        for step in saved_steps(self.save_root):
            folder = self.save_root / f"{STEP_PREFIX}{step:06d}"
            problems = folder_problems(folder)
            if problems:
                raise RunError(f"InfiniTrain exited 0, but the checkpoint it saved at step {step} is not whole: "
                               f"{_first(problems)}")


def folder_problems(folder: Path) -> list[str]:
    """What is wrong with an InfiniTrain step folder (formats/infinitrain_checkpoint: every file parsed
    to its end, ranks and trainer states consistent); empty when it is whole."""
    try:
        return read_checkpoint_folder(folder).problems
    except FormatError as e:
        return [str(e)]


def _first(problems: list[str]) -> str:
    return problems[0] + (f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else "")


def checkpoints_for(case: CaseSpec, log_dir: Path) -> InfiniTrainCheckpoints | None:
    """The case's `checkpoint` table as InfiniTrain's flags, on the plan every framework shares
    (runners/checkpoint_plan.py): it saves into `<case>.checkpoints/` beside its own log and resumes
    from `resume_case`'s (its own name's when no case is named); inside, the step folders have
    InfiniTrain's own names."""
    plan = plan_for(case, Path(log_dir) / f"{case.name}.log")
    if plan is None:
        return None
    resume = None
    if plan.resume is not None:
        resume = step_folder(Path(plan.resume.directory).parent, plan.resume.step)
    if plan.save is None:
        return InfiniTrainCheckpoints(None, resume)
    return InfiniTrainCheckpoints(Path(plan.save.root), resume, plan.save.interval, plan.save.keep, plan.save.optimizer)


def checkpoint_save_seconds(text: str) -> float | None:
    """The time InfiniTrain says its saves took, all of them (None: it saved nothing)."""
    ms = [float(m) for m in _SAVED.findall(text)]
    return round(sum(ms) / 1e3, 3) if ms else None


def checkpoint_load_seconds(text: str) -> float | None:
    """How long InfiniTrain's resume load took, from the glog times of its first and last load line
    (None: it loaded nothing, or its log has no glog prefix)."""
    begin, done = _LOAD_BEGIN.search(text), _LOAD_DONE.search(text)
    if begin is None or done is None:
        return None
    def seconds(m: re.Match) -> float:
        return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    elapsed = seconds(done) - seconds(begin)
    return round(elapsed + 86400 if elapsed < 0 else elapsed, 3)  # a load across midnight
