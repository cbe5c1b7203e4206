"""What every reference module shares: loading LLMC tensors and reading them back.

A reference module (`models/<family>/model.py`) names each of its parameters canonically in
`llmc_parameters()` (`qkvw[3]` is layer 3's slice of LLMC `qkvw`); these two functions are the
map in both directions, for weights and for gradients.
"""

from __future__ import annotations

import numpy as np
import torch

from lockstep.models.family import split_canonical


@torch.no_grad()
def load_llmc(module: torch.nn.Module, tensors: dict[str, np.ndarray], config) -> torch.nn.Module:
    params = module.llmc_parameters()
    values = split_canonical(tensors, config)
    if set(params) != set(values):
        missing = sorted(set(values) ^ set(params))
        raise ValueError(f"reference module and LLMC tensors disagree on {missing[:3]}")
    for name, param in params.items():
        src = torch.from_numpy(np.array(values[name], dtype=np.float32, copy=True))
        if tuple(src.shape) != tuple(param.shape):
            raise ValueError(f"{name}: LLMC shape {tuple(src.shape)} vs module {tuple(param.shape)}")
        param.copy_(src)
    return module


def llmc_state(module: torch.nn.Module, grads: bool = False) -> dict[str, np.ndarray]:
    """Canonical name -> FP32 numpy copy of each parameter (or its gradient; zeros when it has none)."""
    out = {}
    for name, param in module.llmc_parameters().items():
        t = param.grad if grads else param
        if t is None:
            t = torch.zeros_like(param)
        out[name] = t.detach().float().cpu().numpy().copy()
    return out
