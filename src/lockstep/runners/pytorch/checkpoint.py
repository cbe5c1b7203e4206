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

import contextlib
import shutil
import warnings
from pathlib import Path
from typing import Iterator

import torch

# torch.distributed.checkpoint is imported inside the functions that save or load: its import pulls in
# torch._dynamo and sympy (1 s on a warm machine, ~2 s more where bytecode is not cached), which every
# case would pay at the trainer's import.

from lockstep.errors import RunError
# The plan (folders, intervals, what-ifs) is every framework's; re-exported here for the trainer.
from lockstep.runners.checkpoint_plan import (STEP_PREFIX, WHAT_IF_OPTIMIZER, CheckpointPlan,  # noqa: F401
                                              ResumePlan, SavePlan, ShiftedBatches, checkpoints_root,
                                              partial_dir, plan_for, prune, step_dir)

FORMAT = "lockstep-pytorch-dcp-1"
# DCP's UserWarning at every save and load of a single-process run (no process group): a case on
# one device is meant to be one process, so it says nothing to the user.
SINGLE_PROCESS_WARNING = r"torch\.distributed is disabled, unavailable or uninitialized"


@contextlib.contextmanager
def _single_process_dcp() -> Iterator[None]:
    """Around one dcp.save/dcp.load: that warning only, and only without a process group."""
    import torch.distributed as dist

    with warnings.catch_warnings():
        if not (dist.is_available() and dist.is_initialized()):
            warnings.filterwarnings("ignore", message=SINGLE_PROCESS_WARNING, category=UserWarning)
        yield


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
    partial = partial_dir(final)
    if is_writer:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True, exist_ok=True)
    if dist.is_initialized():
        dist.barrier()
    try:
        with _single_process_dcp():
            dcp.save(_state(model, optimizer if plan.optimizer else None, step), checkpoint_id=str(partial))
    except OSError as e:
        raise RunError(f"{partial}: could not save the checkpoint of step {step} ({e})") from None
    if dist.is_initialized():
        dist.barrier()
    if is_writer:
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        prune(Path(plan.root), plan.keep)
    if dist.is_initialized():
        dist.barrier()
    return final


def load_training_state(plan: ResumePlan, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load `plan.directory` into the model and optimizer (and the RNG); returns the shift of the
    data stream from the loop's step (0 for a true resume: the saved position is the step)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_state_dict

    folder = Path(plan.directory)
    if not (folder / ".metadata").is_file():
        raise RunError(f"{folder}: no checkpoint of step {plan.step} there (no DCP .metadata); "
                       "the saving case must run first, with a save_interval that reaches the step")
    state = _state(model, optimizer, plan.step)
    try:
        saved_optimizer = _has_optimizer_state(folder)
        if not saved_optimizer:
            del state["optim"]
        with _single_process_dcp():
            dcp.load(state, checkpoint_id=str(folder))
    # DCP's CheckpointException is a BaseException: uncaught, it would end lockstep itself, not this case.
    except (Exception, CheckpointException) as e:
        raise RunError(unreadable_checkpoint(folder, plan.step, e)) from None
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


def unreadable_checkpoint(folder: Path, step: int, error: BaseException) -> str:
    """One sentence for a step folder DCP cannot load: damaged, or not a checkpoint of this model.
    DCP wraps each rank's failure (`CheckpointException.failures`: rank -> (exception, traceback));
    the first one is the reason."""
    failures = getattr(error, "failures", None)
    if failures:
        first = next(iter(failures.values()))
        error = first[0] if isinstance(first, tuple) else first
    reason = (str(error).strip().splitlines() or [""])[0][:300]
    return (f"{folder}: the checkpoint of step {step} cannot be loaded ({type(error).__name__}"
            + (f": {reason}" if reason else "") + "); it is damaged or was written for another model")


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
