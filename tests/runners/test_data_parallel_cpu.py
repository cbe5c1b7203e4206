"""Data parallel semantics on the CPU over gloo: 8 ranks on a 2-core machine (--oversubscribe),
and ZeRO, each against the same global batch on fewer ranks. gpt2-tiny, 3 steps.

gpt2_3 runs at the contract's lr and at a high lr (SGD 1e-2) at which the loss moves by far
more than the 1e-5 threshold, so that agreement is not that of frozen weights; ZeRO at the high lr.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from lockstep.cases.matrix import load_matrix
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs
from lockstep.runners.pytorch import PyTorchRunner

FP32_TOLERANCE = 1e-5
STEPS = 3
GPT2 = {c.name: c for c in load_matrix("gpt2")}
LRS = {"contract_lr": 1e-4, "high_lr": 1e-2}

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def inputs(tiny_checkpoint, tiny_shakespeare_train) -> RunInputs:
    return RunInputs(checkpoint=tiny_checkpoint, tokens=tiny_shakespeare_train, model=SHAPES["gpt2-tiny"].config,
                     device="cpu", oversubscribe=True)


def shaped(name: str, lr: float, **kw):
    return replace(GPT2[name], model="gpt2-tiny", steps=STEPS, lr=lr, **kw)


def max_diff(a, b) -> float:
    assert a.ok, a.error
    assert b.ok, b.error
    assert len(a.losses()) == len(b.losses()) == STEPS
    return max(abs(x - y) for x, y in zip(a.losses(), b.losses()))


@pytest.fixture(scope="module")
def gpt2_2(inputs, tmp_path_factory):
    """The single-rank reference of the 5,120-token global batch, at each lr (pytorch, in-process)."""
    out = tmp_path_factory.mktemp("gpt2_2")
    return {lr_name: PyTorchRunner().run(replace(shaped("gpt2_2", lr), name=f"gpt2_2_{lr_name}"), inputs, out)
            for lr_name, lr in LRS.items()}


@pytest.mark.parametrize("framework", ["pytorch", "megatron"])
def test_gpt2_3_on_8_oversubscribed_ranks_trains_like_gpt2_2(framework, gpt2_2, inputs, tmp_path):
    """At both lrs, in one group of 8 ranks started once (as `lockstep run` runs a layout's cases)."""
    if framework == "megatron":
        pytest.importorskip("megatron.core")
        from lockstep.runners.megatron import MegatronRunner as Runner
    else:
        Runner = PyTorchRunner
    cases = {lr_name: replace(shaped("gpt2_3", lr), name=f"gpt2_3_{lr_name}") for lr_name, lr in LRS.items()}
    assert all((c.dp, c.micro_batch, c.total_batch) == (8, 10, 5120) for c in cases.values())
    runner = Runner()
    assert runner.skip_reason(cases["contract_lr"], inputs) is None  # not skipped for want of cores: oversubscribed
    records = runner.run_many([(c, inputs) for c in cases.values()], [tmp_path], persistent=True)
    for lr_name, (rec,) in zip(cases, records):
        diff = max_diff(rec, gpt2_2[lr_name])
        print(f"{framework} gpt2_3 (8 ranks on the CPU) vs pytorch gpt2_2 at {lr_name}: max |dloss| {diff:.3e}; "
              f"loss {rec.losses()[0]:.6f} -> {rec.losses()[-1]:.6f}")
        assert diff < FP32_TOLERANCE
        assert "8 ranks on" in rec.meta["oversubscribed"] and rec.meta["torch_threads"] == 1
        if lr_name == "high_lr":
            assert rec.losses()[0] - rec.losses()[-1] > 1e-2  # training moved the loss far past the threshold


def test_gpt2_3_is_skipped_without_oversubscribe_when_cores_are_fewer(inputs, monkeypatch):
    import lockstep.runners.base as base

    monkeypatch.setattr(base, "available_devices", lambda device: 2)
    reason = PyTorchRunner().skip_reason(shaped("gpt2_3", 1e-4), replace(inputs, oversubscribe=False))
    assert reason == "needs 8 devices, this machine has 2 CPU cores (--oversubscribe runs them anyway)"


# ---------------------------------------------------------------------- ZeRO


def dp2(zero: int, lr: float):
    # gpt2_1's global batch (256 tokens) over 2 ranks, 2 micro steps each: accumulation under ZeRO too.
    return replace(GPT2["gpt2_1"], name=f"dp2_zero{zero}", model="gpt2-tiny", steps=STEPS, lr=lr, dp=2,
                   micro_batch=1, zero=zero).check()


def test_pytorch_zero1_and_zero2_train_like_plain_dp(inputs, tmp_path, worker_pool):
    # At the high lr only: the sharded and unsharded updates are the same elementwise arithmetic
    # (measured identical at both lrs), and the high lr is the one that would show a difference.
    runs = {z: worker_pool.run(PyTorchRunner(), dp2(z, LRS["high_lr"]), inputs, tmp_path) for z in (0, 1, 2)}
    d1, d2 = max_diff(runs[1], runs[0]), max_diff(runs[2], runs[0])
    print(f"pytorch DP=2 at high_lr: ZeRO-1 vs DP {d1:.3e}, ZeRO-2 (FSDP2) vs DP {d2:.3e}; "
          f"loss {runs[0].losses()[0]:.6f} -> {runs[0].losses()[-1]:.6f}")
    assert runs[0].losses()[0] - runs[0].losses()[-1] > 1e-2
    assert d1 < FP32_TOLERANCE and d2 < FP32_TOLERANCE
    assert "ZeroRedundancyOptimizer" in runs[1].meta["data_parallel"] and "FSDP2" in runs[2].meta["data_parallel"]


def test_what_megatron_cannot_shard_is_a_skip_with_the_reason(inputs):
    pytest.importorskip("megatron.core")
    from lockstep.runners.megatron import MegatronRunner

    assert "needs CUDA" in MegatronRunner().skip_reason(dp2(1, 1e-4), inputs)
    assert "accepts only Adam" in MegatronRunner().skip_reason(dp2(1, 1e-4), replace(inputs, device="cuda"))
    assert "Megatron-FSDP" in MegatronRunner().skip_reason(dp2(2, 1e-4), inputs)
