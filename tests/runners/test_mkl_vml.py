"""The oneMKL VML dispatch race (runners/mkl_vml.py): the settling calls, and where they are made."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from lockstep.runners import mkl_vml
from lockstep.runners.pytorch import step as reference_step


class _Calls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, torch.dtype, int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        first = args[0] if args else None
        if isinstance(first, torch.Tensor):
            self.seen.append((getattr(func, "__name__", str(func)), first.dtype, first.numel()))
        return func(*args, **(kwargs or {}))


def test_settling_calls_every_vml_op_once_per_dtype_on_one_element(monkeypatch):
    monkeypatch.setattr(mkl_vml, "_settled", False)
    calls = _Calls()
    with calls:
        mkl_vml.settle_mkl_vml_dispatch()
    ops = {(name, dtype) for name, dtype, n in calls.seen if name in mkl_vml.VML_OPS}
    assert ops == {(op, dtype) for op in mkl_vml.VML_OPS for dtype in (torch.float32, torch.float64)}
    # One element is below torch's parallel grain: each first call runs on the calling thread alone.
    assert {n for name, _, n in calls.seen if name in mkl_vml.VML_OPS} == {1}
    # A second call does nothing (it is made at every reference step).
    again = _Calls()
    with again:
        mkl_vml.settle_mkl_vml_dispatch()
    assert again.seen == []


def test_the_reference_step_settles_before_its_first_forward(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(reference_step, "settle_mkl_vml_dispatch", lambda: order.append("settle"))
    layer = torch.nn.Linear(4, 3)

    def losses_of(mb):
        order.append("forward")
        return torch.nn.functional.cross_entropy(layer(mb.x), mb.y, reduction="none")

    batch = reference_step.MicroBatch(x=torch.ones(2, 4), y=torch.tensor([0, 2]))
    reference_step.contract_step([batch], losses_of, divisor=1, optimizer=torch.optim.SGD(layer.parameters(), lr=0.1))
    assert order == ["settle", "forward"]


def test_exp_is_exact_to_float32_after_settling():
    # What megatron's cross entropy computes: exp over a large tensor split over the OpenMP threads.
    mkl_vml.settle_mkl_vml_dispatch()
    x = torch.linspace(-20.0, 0.0, 256 * 8192).reshape(256, 8192)
    rel = ((torch.exp(x).double() - torch.exp(x.double())) / torch.exp(x.double())).abs().max().item()
    assert rel < 2.4e-7  # two float32 ulps; a thread on the low-accuracy kernel is off by up to 1.5e-4
