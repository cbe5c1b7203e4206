"""Saving and resuming megatron-core training through megatron-core's own `dist_checkpointing`
(docs/reference/checkpoints.md), as Megatron-LM's `save_checkpoint` / `load_checkpoint` do with
`--ckpt-format torch_dist`, inside the lockstep worker (worker.py).

A step folder, `<out>/megatron/<case>.checkpoints/step_NNNNNN/` (written as `.partial`, then
renamed), holds one sharded state dict:
- `model` (`model0`, `model1`, ... with VPP): every chunk's `sharded_state_dict()`, each tensor a
  ShardedTensor with its global shape and this rank's offsets under TP/PP (the tied output
  weight of the last stage is the first stage's embedding, replicated);
- `optimizer` (unless `save_optimizer_state = false`): the megatron optimizer's
  `sharded_state_dict(model)` -- torch Adam's `exp_avg`, `exp_avg_sq` sharded like their
  parameters and its step as the common `common_step`; SGD without momentum holds only its
  param groups; the distributed optimizer (ZeRO-1) its FP32 main-parameter shards and moments
  in the `dp_reshardable` layout Megatron-LM uses by default;
- `opt_param_scheduler` (its constant lr and step count), `iteration` and `lockstep` (the
  format, the step, the data position -- the next step whose window the stream reads -- the
  consumed samples, whether the optimizer was saved), common to every rank;
- `rng_state`: Python's, numpy's, torch's (and CUDA's) generators and megatron's RNG tracker
  states, a ShardedObject per (pipeline, tensor) rank replicated over DP, as Megatron-LM saves it.
The sharding metadata the state dict was made with is saved as the checkpoint's content
metadata, and the resume builds its own state dict with the same metadata, so dist_checkpointing
loads (and reshards, for model and Adam state) into the resumed run's layout.

`write_state` (at the end) is the other way in: a checkpoint written from canonical (LLMC-named)
Adam moments, for a run whose model was built from canonical weights (`lockstep diagnose
--at-step N` starts every framework from the reference's step-N state through it).
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from lockstep.errors import RunError
from lockstep.runners.checkpoint_plan import ResumePlan, SavePlan, partial_dir, prune, step_dir
from lockstep.runners.megatron.job import CHECKPOINT_FORMAT as FORMAT
from lockstep.runners.megatron.job import missing_checkpoint
from lockstep.runners.megatron.parallel import ParallelLayout


def sharding_metadata(zero: int) -> dict:
    """How the sharded state dicts are made, as Megatron-LM's training loop makes them by default:
    the distributed optimizer's state in the `dp_reshardable` layout (each rank writes its own
    buffers, no gather; megatron-core's own default without metadata is the deprecated
    `fully_sharded_model_space`), no prefixes for a chained optimizer of one, no singleton local
    shards. The keys are the same in megatron-core 0.16.1 and 0.19.2."""
    metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if zero >= 1:
        metadata["distrib_optim_sharding_type"] = "dp_reshardable"
    return metadata


def unwrap(chunk):
    """The GPTModel inside megatron's DDP (and Float16Module) wrappers."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def _model_keys(chunks: list) -> list[str]:
    return ["model"] if len(chunks) == 1 else [f"model{i}" for i in range(len(chunks))]


def _sub_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _rng_state(layout: ParallelLayout):
    """This rank's generators as Megatron-LM's `get_rng_state` collects them, one ShardedObject per
    (pipeline, tensor) rank, the DP ranks its replicas."""
    from megatron.core import tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    state = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
             "torch_rng_state": torch.get_rng_state(),
             "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states()}
    if layout.device.type == "cuda":
        state["cuda_rng_state"] = torch.cuda.get_rng_state()
    return ShardedObject("rng_state", [state], (layout.pp, layout.tp), (layout.pp_rank, layout.tp_rank),
                         replica_id=layout.dp_rank)


def _set_rng_state(loaded, layout: ParallelLayout) -> None:
    from megatron.core import tensor_parallel

    state = loaded[0] if isinstance(loaded, list) else loaded
    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if layout.device.type == "cuda" and "cuda_rng_state" in state:
        torch.cuda.set_rng_state(state["cuda_rng_state"])
    if state.get("rng_tracker_states"):
        tensor_parallel.get_cuda_rng_tracker().set_states(state["rng_tracker_states"])


def _layout_of(layout: ParallelLayout) -> dict:
    return {"dp": layout.dp, "tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp, "ep": layout.ep}


def _sharded_state(chunks: list, optimizer, scheduler, layout: ParallelLayout, step: int, metadata: dict,
                   with_optimizer: bool, is_loading: bool, consumed_samples: int, with_rng: bool = True) -> dict:
    state: dict = {}
    model_state: dict = {}
    for key, chunk in zip(_model_keys(chunks), chunks):
        model_state[key] = unwrap(chunk).sharded_state_dict(metadata=metadata)
    state.update(model_state)
    if with_optimizer:
        if is_loading:
            # megatron-core's FP32Optimizer fills an empty state before loading by calling its
            # init_state_fn, which get_megatron_optimizer leaves None for SGD (0.16.1): SGD
            # without momentum has no state to fill.
            for sub in _sub_optimizers(optimizer):
                if getattr(sub, "init_state_fn", True) is None:
                    sub.init_state_fn = lambda opt, config=None: None
        state["optimizer"] = optimizer.sharded_state_dict(model_state, is_loading=is_loading, metadata=metadata)
    state["opt_param_scheduler"] = scheduler.state_dict()
    state["iteration"] = step
    state["lockstep"] = {"format": FORMAT, "step": step, "data_next_step": step, "consumed_samples": consumed_samples,
                         "optimizer_saved": with_optimizer, "layout": _layout_of(layout)}
    if with_rng:
        state["rng_state"] = _rng_state(layout)
    return state


WRITER_WATCH_S = 0.5  # how often a save looks at its forked writers


def writer_problem() -> str | None:
    """What megatron-core's torch_dist writer lacks to run at all: each forked writer process reads
    its memory through psutil first thing, and without it dies before reporting, so the save waits
    for its report forever."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not getattr(filesystem_async, "HAVE_PSUTIL", True):
        return ("megatron-core's checkpoint writer needs psutil, which is not installed "
                "(pip install psutil, or install lockstep's megatron extra: pip install -e '.[megatron]')")
    return None


class DeadWriterWatch:
    """While a save runs, every WRITER_WATCH_S: a forked writer process that ended with a non-zero
    status (it died: an import it lacks, the OOM killer) is reported through `on_dead`, which must
    end the rank. megatron-core's save waits on a queue for every writer's report, so a dead one
    would leave it (and the run) waiting forever, with nothing on the terminal."""

    def __init__(self, folder: Path, on_dead):
        self.folder, self.on_dead = folder, on_dead

    def __enter__(self) -> "DeadWriterWatch":
        import threading

        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="lockstep-writer-watch", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

    def _watch(self) -> None:
        import multiprocessing

        while not self.done.wait(WRITER_WATCH_S):
            # This process's children not yet joined (megatron joins each writer after its report);
            # `exitcode` polls without reaping anything megatron would still wait for.
            for child in list(multiprocessing.process._children):
                if child.exitcode not in (None, 0) and not self.done.is_set():
                    self.on_dead(f"{self.folder}: megatron-core's checkpoint writer process {child.pid} died "
                                 f"(exit status {child.exitcode}) before reporting; its traceback is in this log")
                    return


def save_training_state(plan: SavePlan, step: int, chunks: list, optimizer, scheduler, layout: ParallelLayout,
                        zero: int, consumed_samples: int, on_dead_writer=None) -> Path:
    """dist_checkpointing-save the state after `step` (a collective: every rank writes its shards),
    into `step_NNNNNN.partial`, renamed once complete, then prune to the newest `plan.keep`.
    `on_dead_writer(sentence)` ends the rank when a forked writer dies (DeadWriterWatch)."""
    from megatron.core import dist_checkpointing

    problem = writer_problem()
    if problem:
        raise RunError(problem)
    final = step_dir(Path(plan.root), step)
    partial = partial_dir(final)
    if layout.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    metadata = sharding_metadata(zero)
    state = _sharded_state(chunks, optimizer, scheduler, layout, step, metadata, with_optimizer=plan.optimizer,
                           is_loading=False, consumed_samples=consumed_samples)
    try:
        with DeadWriterWatch(partial, on_dead_writer) if on_dead_writer else _nothing():
            dist_checkpointing.save(state, str(partial), content_metadata=metadata)
    except OSError as e:
        raise RunError(f"{partial}: could not save the checkpoint of step {step} ({e})") from None
    dist.barrier()
    if layout.rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        prune(Path(plan.root), plan.keep)
    dist.barrier()
    return final


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def saved_trainer_state(folder: Path, step: int) -> dict:
    """The `lockstep` entry of a step folder, checked to be this format's checkpoint of `step`."""
    from megatron.core import dist_checkpointing

    problem = missing_checkpoint(folder, step)
    if problem:
        raise RunError(problem)
    common = dist_checkpointing.load_common_state_dict(str(folder))
    trainer = common.get("lockstep") or {}
    if trainer.get("format") != FORMAT or int(trainer.get("step", -1)) != step:
        raise RunError(f"{folder}: holds step {trainer.get('step')} ({trainer.get('format')}), not step {step} of {FORMAT}")
    return trainer


def load_training_state(plan: ResumePlan, chunks: list, optimizer, scheduler, layout: ParallelLayout,
                        zero: int) -> int:
    """Load `plan.directory` into the model chunks, the optimizer (a fresh one where the folder has
    no optimizer state), the scheduler and the generators; returns the shift of the data stream
    from the loop's step (0 for a true resume: the saved position is the step)."""
    from megatron.core import dist_checkpointing

    folder = Path(plan.directory)
    trainer = saved_trainer_state(folder, plan.step)
    metadata = dist_checkpointing.load_content_metadata(str(folder)) or sharding_metadata(zero)
    with_optimizer = bool(trainer.get("optimizer_saved", True))
    # The generators are saved per (pipeline, tensor) rank: a resume in another layout reshards the
    # model and Adam's state but cannot give a rank the generators of a rank that no longer exists.
    # Nothing draws while training (no dropout, no shuffling), so they are then left as they are.
    saved = trainer.get("layout") or {}
    with_rng = (saved.get("tp"), saved.get("pp")) == (layout.tp, layout.pp)
    state = _sharded_state(chunks, optimizer, scheduler, layout, plan.step, metadata, with_optimizer=with_optimizer,
                           is_loading=True, consumed_samples=int(trainer.get("consumed_samples", 0)), with_rng=with_rng)
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

    try:
        loaded = dist_checkpointing.load(state, str(folder))
    except (Exception, CheckpointException) as e:  # megatron's CheckpointingException, torch's: one sentence
        detail = next((line.strip() for line in reversed(str(e).splitlines()) if line.strip()), "")
        raise RunError(f"{folder}: megatron-core could not load the checkpoint of step {plan.step} into this "
                       f"run's layout ({type(e).__name__}: {detail[:300]})") from None
    for key, chunk in zip(_model_keys(chunks), chunks):
        unwrap(chunk).load_state_dict(loaded[key], strict=True)
    if with_optimizer:
        optimizer.load_state_dict(loaded["optimizer"])
    else:
        # A fresh optimizer on the loaded weights; mixed-precision optimizers copy them into their
        # main parameters (a no-op for the FP32 optimizer, whose parameters are the model's).
        for sub in _sub_optimizers(optimizer):
            if getattr(sub, "optimizer", None) is not None:
                sub.optimizer.state.clear()
        optimizer.reload_model_params()
    scheduler.load_state_dict(loaded["opt_param_scheduler"])
    if with_rng:
        _set_rng_state(loaded["rng_state"], layout)
    return int(trainer["data_next_step"]) - plan.step


def gather_rank_losses(own_loss: float, layout: ParallelLayout) -> list[float]:
    """Every DP replica's own loss of the step (before the average over DP), in DP-rank order:
    where a shard that was not restored shows first (compare/resume.py). The replica's loss lives
    on its last stage's TP rank 0 (`reports_loss`); a collective over every rank."""
    parts = torch.zeros(layout.dp, dtype=torch.float64, device=layout.device)
    if layout.reports_loss:
        parts[layout.dp_rank] = own_loss
    dist.all_reduce(parts, op=dist.ReduceOp.SUM)
    return [float(v) for v in parts.cpu().tolist()]


def _owner_of(optimizer, param):
    """The torch optimizer (of a chained megatron optimizer) that updates `param`."""
    for sub in _sub_optimizers(optimizer):
        inner = getattr(sub, "optimizer", None)
        if inner is not None and any(p is param for g in inner.param_groups for p in g["params"]):
            return inner
    return None


@torch.no_grad()
def seed_adam_state(chunks: list, shards: list, optimizer, model, adapter, moments: dict, step: int) -> int:
    """Put canonical Adam state into the megatron optimizer as if it had made `step` updates:
    `moments` maps `exp_avg.<canonical name>` and `exp_avg_sq.<canonical name>` to arrays of the
    parameter's canonical shape, mapped onto every chunk's parameters as the weights are
    (weights.chunk_tensors: Megatron's layout, this rank's TP rows, the tied output weight's copy,
    zero rows for the padded vocabulary). Returns the number of parameters seeded.

    Only where the torch optimizer updates the model's own FP32 parameters (megatron's FP32
    optimizer: zero = 0, FP32 or autocast parameters); the distributed optimizer and native bf16
    keep their state on separate main parameters."""
    from lockstep.errors import LockstepError
    from lockstep.runners.megatron import weights as mweights

    for sub in _sub_optimizers(optimizer):
        if type(sub).__name__ != "FP32Optimizer":
            raise LockstepError(f"writing megatron-core Adam state from canonical tensors needs its FP32 optimizer "
                                f"(ZeRO 0, FP32 parameters), not {type(sub).__name__}")
    exp_avg = {k.split(".", 1)[1]: v for k, v in moments.items() if k.startswith("exp_avg.")}
    exp_avg_sq = {k.split(".", 1)[1]: v for k, v in moments.items() if k.startswith("exp_avg_sq.")}
    seeded = 0
    for chunk, shard in zip(chunks, shards):
        module = unwrap(chunk)
        first = mweights.chunk_tensors(exp_avg, model, shard, adapter)
        second = mweights.chunk_tensors(exp_avg_sq, model, shard, adapter)
        for name, param in module.named_parameters():
            inner = _owner_of(optimizer, param)
            if inner is None:
                raise LockstepError(f"megatron-core's optimizer does not update parameter {name}")
            inner.state[param] = {
                "step": torch.tensor(float(step), dtype=torch.float32),
                "exp_avg": torch.from_numpy(np.ascontiguousarray(first[name].value, dtype=np.float32)).to(param.device),
                "exp_avg_sq": torch.from_numpy(np.ascontiguousarray(second[name].value, dtype=np.float32)).to(param.device),
            }
            seeded += 1
    return seeded


def write_state(write: dict, chunks: list, shards: list, optimizer, scheduler, layout: ParallelLayout, case,
                model, adapter) -> dict:
    """The worker's `write_state` job: the model as built (from canonical weights) and, for Adam,
    the canonical moments of `write["moments"]` (an .npz), saved as the step folder of step
    `write["step"]` under `write["root"]`, exactly as a run that made `step` updates saves it:
    a resume of it (ResumePlan) trains step+1 on."""
    step = int(write["step"])
    if write.get("moments"):
        with np.load(write["moments"]) as npz:
            moments = {k: npz[k] for k in npz.files}
        seed_adam_state(chunks, shards, optimizer, model, adapter, moments, step)
    for _ in range(step):
        scheduler.step(increment=1)  # its step count, as after `step` updates (the lr stays constant)
    global_batch = case.total_batch // case.seq_len
    plan = SavePlan(root=str(write["root"]), interval=max(step, 1), keep=0, optimizer=True)
    began = time.perf_counter()
    folder = save_training_state(plan, step, chunks, optimizer, scheduler, layout, case.zero,
                                 consumed_samples=step * global_batch)
    return {"checkpoint_written": str(folder), "checkpoint_save_s": round(time.perf_counter() - began, 3)}
