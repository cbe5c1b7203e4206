"""Where this worker sits in the Megatron grid: the one place the parallel state is read.

megatron-core keeps its process groups in module globals (`megatron.core.parallel_state`).
`init_parallel` creates them for a case (a persistent worker, runners/workers.py, runs several
cases in one torch.distributed process group and calls `reset_between_cases` between them, which
keeps the grid for a next case of the same layout);
everything else in the worker reads ranks and stage flags from the `ParallelLayout` it returns,
never from parallel_state directly.

Rank order is megatron-core's default "tp-cp-ep-dp-pp": TP ranks are adjacent, then DP, then
pipeline stages. With DP=2, TP=2, PP=2: ranks 0-3 are stage 0 (TP pairs 0,1 and 2,3, which are
DP ranks 0 and 1), ranks 4-7 stage 1.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.runners.nodes import reports_results


@dataclass(frozen=True)
class ParallelLayout:
    rank: int  # global
    world: int
    local_rank: int
    dp: int
    tp: int
    pp: int
    vpp: int  # model chunks per pipeline stage (1 = no interleaving)
    dp_rank: int
    tp_rank: int
    pp_rank: int
    device: torch.device
    reports: bool = True  # writes the log's step lines and the results (local rank 0 of node 0)
    ep: int = 1  # expert-parallel size (MoE): the experts split over EP of the DP ranks
    ep_rank: int = 0
    edp_rank: int = 0  # rank among the ranks holding the same experts (expert data parallel)

    @property
    def holds_first_expert_copy(self) -> bool:
        """This rank's experts are read back here: expert-data-parallel rank 0, (expert) TP rank 0."""
        return self.edp_rank == 0 and self.tp_rank == 0

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def reports_loss(self) -> bool:
        """One rank per DP replica holds the finished loss: TP rank 0 of the last pipeline stage."""
        return self.is_last_stage and self.tp_rank == 0


def start_process_group(device_kind: str) -> torch.device:
    """torch.distributed's one process group (NCCL on CUDA, gloo on the CPU), once per process."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl", device_id=device)
        return device
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo")
    return torch.device("cpu")


def init_parallel(case: CaseSpec, device_kind: str) -> ParallelLayout:
    """Start torch.distributed (unless a persistent worker already did) and megatron's model-parallel groups."""
    from megatron.core import parallel_state

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if world != case.world_size:
        raise LockstepError(f"case {case.name} needs DP*TP*PP = {case.world_size} processes but torchrun started {world}")
    device = start_process_group(device_kind)
    if not grid_in_place(case):
        release_model_parallel()  # a grid kept from an earlier case of another layout
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=case.tp,
            pipeline_model_parallel_size=case.pp,
            virtual_pipeline_model_parallel_size=case.vpp if case.vpp > 1 else None,
            expert_model_parallel_size=case.ep,  # the expert tensor-parallel size stays TP (its default)
        )
    layout = ParallelLayout(
        rank=rank, world=world, local_rank=local_rank, dp=parallel_state.get_data_parallel_world_size(),
        tp=case.tp, pp=case.pp, vpp=case.vpp, dp_rank=parallel_state.get_data_parallel_rank(),
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(), device=device, reports=reports_results(),
        ep=case.ep, ep_rank=parallel_state.get_expert_model_parallel_rank(),
        edp_rank=parallel_state.get_expert_data_parallel_rank())
    if layout.dp != case.dp:
        raise LockstepError(f"megatron-core made {layout.dp} data-parallel ranks, the case asks for {case.dp}")
    return layout


def chunk_stages(layout: ParallelLayout, chunk: int) -> tuple[bool, bool]:
    """(pre_process, post_process) of model chunk `chunk` on this rank, as megatron-core decides them."""
    from megatron.core import parallel_state

    if layout.vpp == 1:
        return parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage()
    return (parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=chunk),
            parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=chunk))


def grid_in_place(case: CaseSpec) -> bool:
    """Whether megatron-core's model-parallel grid, kept from the previous case of a persistent
    worker (`reset_between_cases`), is the one this case needs."""
    from megatron.core import parallel_state

    return (parallel_state.model_parallel_is_initialized() and case.pp == 1 and case.vpp == 1
            and parallel_state.get_tensor_model_parallel_world_size() == case.tp
            and parallel_state.get_expert_model_parallel_world_size() == case.ep
            and parallel_state.get_pipeline_model_parallel_world_size() == 1)


def reset_between_cases(keep_grid: bool) -> None:
    """Between the cases of a persistent worker: megatron-core's per-case state back to a fresh
    process's. `keep_grid` (the case ended well on every rank) keeps the model-parallel process
    groups: `init_parallel` uses them for a next case of the same layout without pipeline stages
    (`grid_in_place`) and replaces them otherwise. Making NCCL communicators and destroying them
    costs ~0.4 s and ~0.5 s per case on an H200, and a communicator carries nothing from one case to
    the next. The grid's scratch buffer is made afresh, as a new grid would have it."""
    from megatron.core import parallel_state

    if not keep_grid:
        release_model_parallel()
        return
    _reset_other_globals()
    parallel_state.destroy_global_memory_buffer()
    parallel_state._set_global_memory_buffer()


def _reset_other_globals() -> None:
    for module, fn in (("megatron.core.rerun_state_machine", "destroy_rerun_state_machine"),
                       ("megatron.core.num_microbatches_calculator", "destroy_num_microbatches_calculator")):
        try:
            getattr(importlib.import_module(module), fn)()
        except (ImportError, AttributeError):
            pass


def release_model_parallel() -> None:
    """Between the cases of a persistent worker: megatron-core's per-run global state back to what
    a fresh process has, keeping torch.distributed's default process group.

    `destroy_model_parallel` forgets every model-parallel group, rank and the global memory
    buffer (megatron-core 0.16 and 0.19), but destroys only its gloo groups; the NCCL/gloo
    subgroups it made are destroyed here, so a group of many cases does not pile up
    communicators. The rerun state machine and the microbatch calculator are megatron's other
    module globals (unused by this runner's schedule calls, reset all the same); the CUDA RNG
    tracker is reset by every case's `model_parallel_cuda_manual_seed` (or the CPU shims)."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()  # also after a case that failed half-way through initialising
    _reset_other_globals()
    if dist.is_initialized():
        world = dist.GroupMember.WORLD
        for group in list(dist.distributed_c10d._world.pg_map):
            if group is not world and group is not None:
                dist.destroy_process_group(group)


def shutdown() -> None:
    from megatron.core import parallel_state

    if dist.is_initialized():
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
