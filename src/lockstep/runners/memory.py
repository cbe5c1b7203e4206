"""Peak device memory of a run, as torch's allocator counts it (shared by the torch-based runners)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def peak_memory_info(device: torch.device, world: int) -> dict:
    """{"peak_memory_mb": {"allocated", "reserved"}} since the last reset, max over ranks (a
    collective when world > 1: every rank calls it); {} off CUDA, where torch counts nothing."""
    if device.type != "cuda":
        return {}
    peaks = torch.tensor([torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)],
                         dtype=torch.float64, device=device) / 2**20
    if world > 1:
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    return {"peak_memory_mb": {"allocated": float(peaks[0]), "reserved": float(peaks[1])}}
