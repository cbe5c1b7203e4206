"""oneMKL's vector-math kernels chosen on one thread, before any torch op can run in parallel.

On the CPU, torch hands contiguous float32/float64 `exp`, `log`, `sqrt`, `tanh`, `sin`, ... to
oneMKL's VML (`vmsExp(n, in, out, VML_HA | ...)`, aten/src/ATen/cpu/vml.h), one call per OpenMP
thread on its share of the tensor. oneMKL 2024.2, the one the torch wheels link in, works out
which kernels fit this CPU on the process's first VML call and keeps the answer in a static,
`mkl_vml_serv_cpu_detect.vml_cpu_type`. It writes that static twice: first the raw CPU type
(9 on an AVX-512 Xeon), then the type it maps to (5). A thread that reads it between the two
writes gets 9 back. Its kernel table row is then the AVX2 "enhanced performance" (VML_EP) one,
although the call asked for high accuracy, so that thread's whole share comes out right to about
11 bits (exp: relative error up to 1.5e-4). Every call after the first is exact, which makes it
a rare heisenbug: it happens only when the process's first VML call is made by several threads
at once. megatron's vocab-parallel cross entropy does exactly that on the CPU: its in-place
`torch.exp` on the [b, s, V] logits is the worker's first VML call, split over the OpenMP threads.
About one worker process in three then logged a step-1 loss 1.5e-5 off (docs/results/2026-12-02-megatron-cpu-loss/).
It is pytorch/pytorch#188792 (fixed upstream in oneMKL 2025.0).

`settle_mkl_vml_dispatch()` makes each VML function's first call on a one-element tensor. That is
below torch's parallel grain, so it runs on the calling thread alone, and after it no thread ever
reads the static half-written. It changes no result: a settled process computes what an unlucky
one would have computed had it not been unlucky. It is called where torch compute begins: the
reference's one training step (runners/pytorch/step.py: every pytorch and pytorch-fast loop and
every capture, in a worker or in lockstep's own process) and the megatron worker's entry point. Without MKL (another platform, another torch build) the same ops
are a few scalar ops that do no harm.
"""

from __future__ import annotations

import threading

# Every op torch sends to MKL's VML (vml.h's IMPLEMENT_VML_MKL list), in the two dtypes it sends.
VML_OPS = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log", "log10", "log2", "sin", "sqrt",
           "tan", "tanh", "trunc")

# The static this guards is one per process, so the guard is too: two Python threads that both
# start by settling (a capture in the background beside an in-process run) must not race either.
_LOCK = threading.Lock()
_settled = False


def settle_mkl_vml_dispatch() -> None:
    """Make the process's first call of every MKL VML function on this thread alone (idempotent)."""
    global _settled
    if _settled:  # called at every step of the reference loops: the common case takes no lock
        return
    with _LOCK:
        if _settled:
            return
        import torch

        for dtype in (torch.float32, torch.float64):
            one = torch.full((1,), 0.5, dtype=dtype)
            for op in VML_OPS:
                getattr(torch, op)(one)
        _settled = True
