"""megatron-core's TP=4 and PP=4 on the tiny models, oversubscribed on the CPU (gloo), against the
pytorch reference on one rank: gpt2-tiny (12 heads, L2: TP=4 fits, PP at most 2) and llama3-tiny
(L4: PP=4). 3 steps at a high lr (SGD 1e-2, Adam 1e-3) so that the loss moves far past 1e-5;
the contract's lr is covered at TP=2 / PP=2 by test_megatron_runner.py."""

from __future__ import annotations

import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs
from lockstep.runners.pytorch import PyTorchRunner

pytest.importorskip("megatron.core")
pytestmark = [pytest.mark.slow, pytest.mark.integration]


def case(name: str, model: str, lr: float, **parallel) -> CaseSpec:
    return CaseSpec(name=name, model=model, dtype="float32", micro_batch=4 // parallel.pop("split", 1), seq_len=64,
                    total_batch=256, steps=3, lr=lr, **parallel).check()


@pytest.mark.parametrize("model,lr,parallel", [
    ("gpt2-tiny", 1e-2, {"tp": 4}),
    ("llama3-tiny", 1e-3, {"pp": 4, "split": 4}),  # B=1, 4 micro batches through the 4 stages
], ids=["gpt2-tiny-tp4", "llama3-tiny-pp4"])
def test_four_way_model_parallel_trains_like_one_rank(model, lr, parallel, tiny_checkpoint, llama3_tiny_checkpoint,
                                                      tiny_shakespeare_train, tmp_path, worker_pool):
    from lockstep.runners.megatron import MegatronRunner

    checkpoint = tiny_checkpoint if model == "gpt2-tiny" else llama3_tiny_checkpoint
    inputs = RunInputs(checkpoint=checkpoint, tokens=tiny_shakespeare_train, model=SHAPES[model].config,
                       device="cpu", oversubscribe=True)
    wide = case("wide", model, lr, **parallel)
    assert MegatronRunner().skip_reason(wide, inputs) is None
    ref = PyTorchRunner().run(case("one", model, lr), inputs, tmp_path)
    got = worker_pool.run(MegatronRunner(), wide, inputs, tmp_path)  # both layouts: one group of 4 ranks
    assert ref.ok, ref.error
    assert got.ok, got.error
    diff = max(abs(a - b) for a, b in zip(ref.losses(), got.losses()))
    print(f"megatron {model} {wide.parallel_label} vs pytorch one rank: max |dloss| {diff:.3e}; "
          f"loss {ref.losses()[0]:.6f} -> {ref.losses()[-1]:.6f}")
    assert len(got.losses()) == 3 and diff < 1e-5
    assert ref.losses()[0] - ref.losses()[-1] > 1e-2
