"""`torch.compile` deferred to a function's first call while megatron-core is imported.

megatron-core decorates its fused kernels (bias+GELU, bias+SwiGLU, bias+dropout+add, ...) with
`megatron.core.jit.jit_fuser`, which is `torch.compile`; 0.19 also decorates a router function with
`torch.compile` itself. Decorating already imports torch._dynamo and torch._inductor's compiler,
although the runner turns every fusion off (model.py) and never calls those functions: 0.75 s of CPU
in every rank's start-up on the 2-core CI machine (megatron's imports and the first optimizer: 1.9 s
-> 1.15 s; torch's optimizers import torch._dynamo themselves, its compiler they do not).
Inside `compile_on_first_call()`, `torch.compile(fn)` of a plain function returns a stand-in that
calls the real `torch.compile(fn)` the first time it is called and the compiled function from then
on: a function that is called is compiled and runs as before, so no arithmetic changes; one that is
not costs nothing. megatron's `jit_fuser` is bound to the stand-in when megatron.core.jit is imported
inside the block, so modules imported later (the MoE layers of a mixtral case) are deferred too.
Modules (`torch.compile(module)`) compile as before.

Inside `uncompiled()` (megatron-fast on the CPU, fast.py) a deferred function runs as the plain
function it wraps and is never compiled: the same code, without inductor's import and compile
(seconds to tens of seconds per function on a 2-core machine).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

# True inside `uncompiled()`: deferred functions run uncompiled (a context variable: scoped to the block).
_UNCOMPILED = contextvars.ContextVar("lockstep_megatron_uncompiled", default=False)


def deferred_compile(real_compile: Callable) -> Callable:
    """A `torch.compile` with the same signature whose plain-function results compile on first call."""

    def compile_later(model=None, **options):
        if model is None:  # used as @torch.compile(mode=...)
            return lambda fn: compile_later(fn, **options)
        if not inspect.isfunction(model):
            return real_compile(model, **options)
        compiled: Callable | None = None

        @functools.wraps(model)
        def call(*args, **kwargs):
            nonlocal compiled
            if _UNCOMPILED.get():
                return model(*args, **kwargs)
            if compiled is None:
                compiled = real_compile(model, **options)
            return compiled(*args, **kwargs)

        call.compiles_on_first_call = True
        return call

    compile_later.defers = real_compile
    return compile_later


@contextmanager
def compile_on_first_call() -> Iterator[None]:
    """While inside, `torch.compile` of a function defers compiling to the function's first call."""
    real = torch.compile
    if getattr(real, "defers", None) is not None:  # already inside one
        yield
        return
    torch.compile = deferred_compile(real)
    try:
        yield
    finally:
        torch.compile = real


@contextmanager
def uncompiled() -> Iterator[None]:
    """While inside, functions deferred by `compile_on_first_call` run uncompiled, and any other
    torch.compile'd code runs eagerly (torch's "force_eager" stance)."""
    token = _UNCOMPILED.set(True)
    try:
        with torch.compiler.set_stance("force_eager"):
            yield
    finally:
        _UNCOMPILED.reset(token)
