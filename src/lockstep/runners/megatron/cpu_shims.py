"""What megatron-core needs to train on a machine without CUDA (CI), and nothing more.

megatron-core is written for GPUs, but its GPTModel, tensor-parallel layers, pipeline
schedules, DistributedDataParallel and optimizer are plain PyTorch underneath and run on the
CPU over gloo once a few CUDA assumptions are answered. Each shim below
names the assumption it answers; `apply_cpu_shims` installs them, and the worker calls it only
when the job runs on the CPU. Nothing here changes any arithmetic.

1. "The current device": megatron allocates buffers with `device=torch.cuda.current_device()`
   (the global memory buffer behind attention scores and TP all-gathers, DDP's gradient
   buffers, pipeline receive buffers). On a CPU-only torch that call raises, so it answers 0
   without touching CUDA, and shim 2 maps that device to the CPU.
2. Literal CUDA devices: a few allocations name CUDA outright (`torch.zeros(..., device="cuda")`
   for the token counter of every pipeline schedule, the FP32 optimizer's loss-scale tensor)
   and tied embeddings with PP>1 call `weight.data.cuda()`. A TorchFunctionMode, active for the
   whole worker, rewrites a CUDA `device=` of any torch call to the CPU and makes
   `Tensor.cuda()` / `Tensor.to("cuda")` stay on the CPU; a backward pass started through it
   runs with it on (a mode is off inside its own handler).
3. The CUDA RNG tracker: attention runs its dropout inside `get_cuda_rng_tracker().fork()`,
   which swaps CUDA generator states. Without CUDA there are no states to swap, and with
   dropout 0 nothing draws from them: megatron-core's own inference tracker, whose `fork` is a
   no-op, is installed instead (`initialize_rng_tracker(inference_rng_tracker=True)`).
4. The current CUDA stream: megatron-core 0.19's DDP starts every gradient reduction with
   `torch.cuda.current_stream()` and waits there for CUDA-graph events (which only CUDA-graph
   replays create). CPU work is synchronous, so a stream whose waits are no-ops stands in.
5. Device synchronisation: batched pipeline p2p (`batch_p2p_comm`, model.pipeline_p2p) waits on
   its `batch_isend_irecv` requests, then calls `torch.cuda.synchronize()` (`batch_p2p_sync`).
   gloo runs the batch itself; what remains to wait for is nothing, so synchronize is a no-op.
   This keeps the CPU on the p2p path a GPU takes, so the CPU tests guard it.
6. The CUDA RNG state saved around activation recompute: megatron's CheckpointFunction saves
   the CPU generator's state, the CUDA generator's and the tracker's before a recomputed
   forward and restores them for its replay in the backward. Without CUDA there is no CUDA
   generator: its state is an empty tensor and setting it does nothing; the CPU generator's
   state (the one a CPU draws from) is still saved and restored by megatron itself.

Not shimmed, on purpose: bf16. megatron-core's bf16 autocast backward (and its bf16 optimizer,
which checks for `torch.cuda.BFloat16Tensor` parameters) needs CUDA, so the runner skips bf16
cases on the CPU rather than faking them.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


def _names_cuda(device) -> bool:
    """True for every way megatron names a CUDA device: "cuda", "cuda:1", torch.device("cuda", 0), 0."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


def _backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    """torch.autograd.backward past its __torch_function__ dispatch: the engine call it makes."""
    from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
    from torch.autograd.graph import _engine_run_backward

    tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
    inputs = () if inputs is None else ((inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs))
    grads = _make_grads(tensors, _tensor_or_tensors_to_tuple(grad_tensors, len(tensors)), is_grads_batched=False)
    _engine_run_backward(tensors, grads, create_graph if retain_graph is None else retain_graph, create_graph, inputs,
                         allow_unreachable=True, accumulate_grad=True)


class CudaDevicesOnCpu(TorchFunctionMode):
    """Shim 2: every torch call that asks for a CUDA device gets the CPU instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs and _names_cuda(kwargs["device"]):
            kwargs = {**kwargs, "device": torch.device("cpu")}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and len(args) > 1 and isinstance(args[1], (str, torch.device)) and _names_cuda(args[1]):
            args = (args[0], torch.device("cpu"), *args[2:])
        if func is torch.autograd.backward:
            # torch 2.13's backward dispatches through the mode, and a mode is off while its own
            # handler runs: every op of the backward's autograd functions would run unshimmed (the
            # MoE dispatcher's backward allocates its all-gather output on "the current device").
            # The backward runs with the mode on again, past its own dispatch.
            with self:
                return _backward(*args, **kwargs)
        return func(*args, **kwargs)


class SynchronousStream:
    """Shim 4: the CPU's "current stream"; everything on it has already happened."""

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass


_ACTIVE_MODE: CudaDevicesOnCpu | None = None
_CPU_STREAM = SynchronousStream()


def _current_stream_without_cuda(device=None) -> SynchronousStream:
    return _CPU_STREAM


def _synchronize_without_cuda(device=None) -> None:
    """Shim 5: nothing is in flight on a CPU once a call has returned."""


def _cuda_rng_state_without_cuda(device=None, clone=False, graph_safe=False) -> torch.Tensor:
    """Shim 6: the state of a CUDA generator that does not exist."""
    return torch.empty(0, dtype=torch.uint8)


def _set_cuda_rng_state_without_cuda(new_state, device=-1, graph_safe=False) -> None:
    """Shim 6: nothing to restore."""


def _current_device_without_cuda() -> int:
    """Shim 1: megatron's "current CUDA device", which shim 2 maps to the CPU."""
    return 0


def apply_cpu_shims() -> list[str]:
    """Install the shims for the rest of this (worker) process; returns what was applied.

    Call after `torch.distributed` and megatron's parallel state are initialised and before any
    model is built. Idempotent.
    """
    global _ACTIVE_MODE
    from megatron.core.tensor_parallel import random as mpu_random

    torch.cuda.current_device = _current_device_without_cuda
    torch.cuda.current_stream = _current_stream_without_cuda
    torch.cuda.synchronize = _synchronize_without_cuda
    if _ACTIVE_MODE is None:
        # Entered and deliberately never exited: the worker process ends with the run.
        _ACTIVE_MODE = CudaDevicesOnCpu()
        _ACTIVE_MODE.__enter__()
    mpu_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    mpu_random._get_cuda_rng_state = _cuda_rng_state_without_cuda
    mpu_random._set_cuda_rng_state = _set_cuda_rng_state_without_cuda
    return ["torch.cuda.current_device -> 0", "CUDA device arguments -> cpu (TorchFunctionMode)",
            "CUDA RNG tracker fork -> no-op (megatron inference tracker)",
            "torch.cuda.current_stream -> a synchronous stand-in", "torch.cuda.synchronize -> no-op",
            "CUDA RNG state around activation recompute -> empty (no CUDA generator)"]
