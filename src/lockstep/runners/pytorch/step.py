"""The contract's training step on a reference module, written once for every loop that runs one:
the `pytorch` runner's training loop (train.py), its FP64 evidence run (`train_fp64`), the
step-1 capture without an update (capture.py's `capture_step`, also diagnose's and the
certificate's FP64 step 1) and `pytorch-fast`'s loop (its forward compiled).

One step (docs/reference/training-contract.md#loss): the gradients zeroed; per micro batch the
forward (BF16 autocast around the forward only, parameters FP32), the per-token cross entropy of
the logits in FP32 (FP64 for a model in FP64), the backward of their mean / divisor (accum, or
accum·DP when one process runs every DP rank's micro batches); every trainable parameter the
backward left without a gradient given a zero one (an expert no token was routed to:
docs/reference/training-contract.md#every-parameter-takes-every-step); the optimizer step. The logged
loss is the contract's FP64 mean of the per-token losses returned here (`step_loss_fp64`), taken
by the caller after the step's clock stops.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterable

import torch
import torch.nn.functional as F

from lockstep.runners.mkl_vml import settle_mkl_vml_dispatch


def token_losses(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bf16: bool,
                 observe: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> torch.Tensor:
    """The forward and per-token loss of one micro batch; `observe(logits, token_losses)` sees
    both before the backward (step-1 capture)."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits, _ = model(x)
    # FP32 logits for the loss (a model in FP64 keeps FP64: the exact-arithmetic yardstick).
    logits_for_loss = logits if logits.dtype == torch.float64 else logits.float()
    losses = F.cross_entropy(logits_for_loss.view(-1, logits.size(-1)), y.view(-1), reduction="none")
    if observe is not None:
        observe(logits, losses)
    return losses


@dataclass
class MicroBatch:
    """One micro batch of a step, on the model's device; `context` wraps its forward and backward
    (DDP's no_sync on a micro step before the last)."""

    x: torch.Tensor
    y: torch.Tensor
    dp_rank: int = 0
    micro: int = 0
    context: ContextManager = field(default_factory=contextlib.nullcontext)


LossesOf = Callable[[MicroBatch], torch.Tensor]


def zero_missing_gradients(optimizer: torch.optim.Optimizer) -> int:
    """Give every parameter `optimizer` steps that requires a gradient and has none (`.grad` None
    after the backward: an expert no token was routed to in this step) a zero gradient; returns how
    many. torch's optimizers skip a parameter whose gradient is None (Adam: no moment decay, no
    update, its own step count not incremented), while megatron-core steps every parameter from its
    zeroed gradient buffer: the contract takes megatron-core's, so here every trainable parameter
    takes every step (docs/reference/training-contract.md#every-parameter-takes-every-step).
    A frozen parameter (a LoRA base weight, requires_grad False) stays without one."""
    filled = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
                filled += 1
    return filled


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> float:
    """Set the lr this step trains at (the contract's, cases/lr_schedule.py's `lr_at`) on every
    parameter group, before the step; returns it for the step's record."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def contract_step(micro_batches: Iterable[MicroBatch], losses_of: LossesOf, divisor: int,
                  optimizer: torch.optim.Optimizer | None = None,
                  before_update: Callable[[list[torch.Tensor], torch.Tensor], None] | None = None
                  ) -> list[torch.Tensor]:
    """One step: `optimizer`'s gradients zeroed; per micro batch `losses_of(it)` (the per-token
    losses: `token_losses`, or pytorch-fast's compiled same) and the backward of their mean /
    `divisor`; with an optimizer, a zero gradient for every trainable parameter left without one
    (`zero_missing_gradients`); `before_update(micro losses, first micro batch's x)` once the
    step's gradients are complete; the optimizer step (None: a capture, which leaves the weights at step 0's and zeroes
    nothing itself). Returns each micro batch's detached per-token losses. `micro_batches` may be a
    generator: its data is then fetched inside the step, as the contract's timing counts it."""
    settle_mkl_vml_dispatch()  # every loop and capture comes here before its first parallel op (mkl_vml.py)
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    micro_losses: list[torch.Tensor] = []
    first_x = None
    for mb in micro_batches:
        first_x = mb.x if first_x is None else first_x
        with mb.context:
            losses = losses_of(mb)
            (losses.mean() / divisor).backward()
        micro_losses.append(losses.detach())
    if optimizer is not None:
        zero_missing_gradients(optimizer)  # before `before_update`: a capture sees the gradients stepped
    if before_update is not None:
        before_update(micro_losses, first_x)
    if optimizer is not None:
        optimizer.step()
    return micro_losses
