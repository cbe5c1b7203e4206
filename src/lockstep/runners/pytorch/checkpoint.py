"""Saving and resuming the reference trainer through `torch.distributed.checkpoint` (DCP).

A step folder holds what docs/reference/checkpoints.md says a checkpoint must hold: the model's
parameters, torch.optim's state (Adam's `step`, `exp_avg`, `exp_avg_sq` per parameter; SGD
without momentum has none), the data position (the next step whose window the stream reads)
and the torch RNG state. Folders are `<out>/pytorch/<case>.checkpoints/step_NNNNNN/`.

`ResumePlan.what_if` builds the resume judge's alternatives (compare/resume.py): the same
checkpoint loaded the way a broken resume would load it (the data stream restarted or shifted,
the optimizer fresh, Adam's moments zeroed, its step count reset). Only the reference trains
them; a framework's own resume always loads everything.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from lockstep.cases.spec import CaseSpec
from lockstep.errors import RunError

STEP_PREFIX = "step_"
FORMAT = "lockstep-pytorch-dcp-1"
# What-if loads of a checkpoint (ResumePlan.what_if): the resume judge's alternatives.
WHAT_IF_OPTIMIZER = ("fresh", "moments_zeroed", "step_reset")


def checkpoints_root(log_path: Path, case_name: str) -> Path:
    """Where a case's step folders go: beside its log, `<case>.checkpoints/`."""
    return Path(log_path).with_name(f"{case_name}.checkpoints")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"{STEP_PREFIX}{step:06d}"


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
    """The case's `checkpoint` table as the reference trainer does it: it saves beside its own log
    and resumes from `resume_case`'s folder (its own name's when no case is named)."""
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
    """The contract's batches read `shift` steps away from the loop's step (a what-if resume)."""

    def __init__(self, batches, shift: int):
        self.batches, self.shift = batches, shift

    def micro_batch(self, step: int, micro_step: int):
        return self.batches.micro_batch(step + self.shift, micro_step)


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, step: int) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict, get_model_state_dict

    if optimizer is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
    else:
        model_sd, optim_sd = get_model_state_dict(model), None
    state = {"model": model_sd,
             "trainer": {"format": FORMAT, "step": step, "data_next_step": step, "rng_torch": torch.get_rng_state()}}
    if optim_sd is not None:
        state["optim"] = optim_sd
    return state


def save_training_state(plan: SavePlan, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        is_writer: bool = True) -> Path:
    """DCP-save the state after `step` (every rank calls it: DCP writes each rank's part), then
    prune to the newest `plan.keep`. A folder is written aside and renamed, so a step folder on
    disk is complete."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    final = step_dir(Path(plan.root), step)
    partial = final.with_name(final.name + ".partial")
    if is_writer:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True, exist_ok=True)
    if dist.is_initialized():
        dist.barrier()
    try:
        dcp.save(_state(model, optimizer if plan.optimizer else None, step), checkpoint_id=str(partial))
    except OSError as e:
        raise RunError(f"{partial}: could not save the checkpoint of step {step} ({e})") from None
    if dist.is_initialized():
        dist.barrier()
    if is_writer:
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        if plan.keep > 0:
            kept = sorted(p for p in Path(plan.root).glob(f"{STEP_PREFIX}[0-9]*") if not p.name.endswith(".partial"))
            for old in kept[: -plan.keep]:
                shutil.rmtree(old, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    return final


def load_training_state(plan: ResumePlan, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load `plan.directory` into the model and optimizer (and the RNG); returns the shift of the
    data stream from the loop's step (0 for a true resume: the saved position is the step)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    folder = Path(plan.directory)
    if not (folder / ".metadata").is_file():
        raise RunError(f"{folder}: no checkpoint of step {plan.step} there (no DCP .metadata); "
                       "the saving case must run first, with a save_interval that reaches the step")
    state = _state(model, optimizer, plan.step)
    saved_optimizer = _has_optimizer_state(folder)
    if not saved_optimizer:
        del state["optim"]
    dcp.load(state, checkpoint_id=str(folder))
    trainer = state["trainer"]
    if trainer.get("format") != FORMAT or int(trainer["step"]) != plan.step:
        raise RunError(f"{folder}: holds step {trainer.get('step')} ({trainer.get('format')}), "
                       f"not step {plan.step} of {FORMAT}")
    if saved_optimizer and plan.optimizer != "fresh":
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(model, state["model"])
        # get_state_dict filled an empty optimizer's state by a zero-lr step (Adam's step 1):
        # a fresh optimizer has none.
        optimizer.state.clear()
    _what_if_optimizer(optimizer, plan.optimizer)
    torch.set_rng_state(trainer["rng_torch"])
    data_next = int(trainer["data_next_step"]) if plan.data_step is None else plan.data_step
    return data_next - plan.step


def _has_optimizer_state(folder: Path) -> bool:
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    return any(key.startswith("optim.") for key in metadata.state_dict_metadata)


def _what_if_optimizer(optimizer: torch.optim.Optimizer, what: str | None) -> None:
    if what in (None, "fresh"):
        return
    for state in optimizer.state.values():
        if what == "moments_zeroed":
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key].zero_()
        elif what == "step_reset" and "step" in state:
            state["step"].zero_()


def gather_rank_losses(loss: torch.Tensor, world: int) -> list[float]:
    """Every DP rank's own loss of the step (before the average), in rank order: where a shard
    that was not restored shows first (compare/resume.py)."""
    import torch.distributed as dist

    parts = [torch.zeros_like(loss) for _ in range(world)]
    dist.all_gather(parts, loss.detach().clone())
    return [float(p.item()) for p in parts]
