"""The case's LLMC weights as torchtitan's state dict, and torchtitan's parameters back under
LLMC names (the final parameters a test compares, and the capture's gradients)."""

from __future__ import annotations

import numpy as np
import torch

from lockstep.models import load_checkpoint
from lockstep.models.family import split_canonical
from lockstep.runners.torchtitan.state_dict import from_llmc, to_llmc


def llmc_tensors(checkpoint: str) -> tuple[dict[str, torch.Tensor], object]:
    """canonical name (`qkvw[3]`) -> FP32 tensor of an LLMC checkpoint, and its config."""
    ckpt = load_checkpoint(checkpoint)
    tensors = split_canonical(ckpt.tensors, ckpt.config)
    return {name: torch.from_numpy(np.array(t, dtype=np.float32)) for name, t in tensors.items()}, ckpt.config


def torchtitan_state(job) -> dict[str, torch.Tensor]:
    """The job's checkpoint under torchtitan's parameter names (the weight mapping)."""
    tensors, cfg = llmc_tensors(job.checkpoint)
    return from_llmc(tensors, cfg)


def canonical(state: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """torchtitan's (full) state dict, or gradients keyed the same, under LLMC names."""
    return to_llmc(state, cfg, qk_norm=cfg.family == "qwen3")
