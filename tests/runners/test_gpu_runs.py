"""CUDA paths of the pytorch and megatron runners on gpt2-tiny (marked gpu; run on the device)."""

from __future__ import annotations

import pytest
import torch

from lockstep.cases.spec import CaseSpec
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs
from lockstep.runners.megatron import MegatronRunner
from lockstep.runners.pytorch import PyTorchRunner

pytestmark = pytest.mark.gpu
TINY = SHAPES["gpt2-tiny"].config


def case(name, dtype="float32", B=4, total=256, dp=1, tp=1, pp=1, steps=5) -> CaseSpec:
    return CaseSpec(name=name, model="gpt2", dtype=dtype, micro_batch=B, seq_len=64, total_batch=total, steps=steps,
                    lr=1e-4, dp=dp, tp=tp, pp=pp)


@pytest.fixture
def cuda_inputs(tiny_checkpoint, tiny_shakespeare_train) -> RunInputs:
    return RunInputs(checkpoint=tiny_checkpoint, tokens=tiny_shakespeare_train, model=TINY, device="cuda")


def max_diff(a, b) -> float:
    assert len(a.steps) == len(b.steps) > 0
    return max(abs(x - y) for x, y in zip(a.losses(), b.losses()))


@pytest.mark.parametrize("dtype,limit", [("float32", 1e-5), ("bfloat16", 1e-2)])
def test_megatron_matches_pytorch_on_cuda(cuda_inputs, tmp_path, dtype, limit):
    c = case("c_bfloat16" if dtype == "bfloat16" else "c", dtype=dtype)
    ref = PyTorchRunner().run(c, cuda_inputs, tmp_path)
    meg = MegatronRunner().run(c, cuda_inputs, tmp_path)
    assert ref.ok and meg.ok, (ref.error, meg.error)
    assert "H200" in ref.meta["device_name"] or ref.meta["device_name"]  # a real device name, not "cpu"
    assert ref.steps[-1].peak_mem_mb and ref.steps[-1].peak_mem_mb > 0
    assert max_diff(ref, meg) < limit


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_pytorch_dp2_nccl_matches_dp1(cuda_inputs, tmp_path):
    one = PyTorchRunner().run(case("one", B=4), cuda_inputs, tmp_path)
    two = PyTorchRunner().run(case("two", B=2, dp=2), cuda_inputs, tmp_path)
    assert one.ok and two.ok, two.error
    assert max_diff(one, two) < 1e-6


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("tp,pp,B", [(2, 1, 4), (1, 2, 2)])
def test_megatron_tp2_pp2_nccl_match_tp1(cuda_inputs, tmp_path, tp, pp, B):
    one = MegatronRunner().run(case("one"), cuda_inputs, tmp_path)
    par = MegatronRunner().run(case(f"tp{tp}pp{pp}", B=B, tp=tp, pp=pp), cuda_inputs, tmp_path)
    assert one.ok and par.ok, par.error
    assert max_diff(one, par) < 1e-5


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_pytorch_zero1_and_zero2_over_nccl_match_plain_dp(cuda_inputs, tmp_path):
    runs = {z: PyTorchRunner().run(CaseSpec(name=f"z{z}", model="gpt2", dtype="float32", micro_batch=2, seq_len=64,
                                            total_batch=256, steps=5, lr=1e-2, dp=2, zero=z), cuda_inputs, tmp_path)
            for z in (0, 1, 2)}
    assert all(r.ok for r in runs.values()), [r.error for r in runs.values()]
    assert max_diff(runs[1], runs[0]) < 1e-5 and max_diff(runs[2], runs[0]) < 1e-5


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_megatron_distributed_optimizer_matches_plain_dp_on_llama3_tiny(llama3_tiny_checkpoint, tiny_shakespeare_train,
                                                                         tmp_path):
    """megatron-core's distributed optimizer (ZeRO-1) takes only Adam and CUDA tensors: Llama 3 (tiny)."""
    inputs = RunInputs(checkpoint=llama3_tiny_checkpoint, tokens=tiny_shakespeare_train,
                       model=SHAPES["llama3-tiny"].config, device="cuda")
    runs = [MegatronRunner().run(CaseSpec(name=f"z{z}", model="llama3-tiny", dtype="float32", micro_batch=2,
                                          seq_len=64, total_batch=256, steps=5, lr=1e-3, dp=2, zero=z), inputs, tmp_path)
            for z in (0, 1)]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert runs[1].meta["distributed_optimizer"] is True
    assert max_diff(runs[1], runs[0]) < 1e-5
