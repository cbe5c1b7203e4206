"""Activation recompute in megatron-core trades compute for memory and must not change a bit:
a recompute case's every loss equals its twin's without recompute exactly (gpt2-tiny).

megatron-core 0.16's recompute (tensor_parallel.random.CheckpointFunction) saves the CUDA RNG
state, so on a machine without CUDA the runner skips a recompute case with that reason (checked
here) and the bitwise test runs on a GPU."""

from __future__ import annotations

import dataclasses

import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.formats.run_record import read_run_record
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs
from lockstep.runners.megatron import MegatronRunner

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.integration


def losses(out, c: CaseSpec) -> list[float]:
    return [s.loss for s in read_run_record(out / "megatron" / f"{c.name}.jsonl").steps]


def test_cpu_skips_recompute_with_the_reason(tiny_checkpoint, training_tokens):
    inputs = RunInputs(checkpoint=tiny_checkpoint, tokens=training_tokens, model=SHAPES["gpt2-tiny"].config,
                       device="cpu")
    c = CaseSpec(name="r", model="gpt2", dtype="float32", micro_batch=4, seq_len=64, total_batch=256, steps=4,
                 lr=1e-4, activation_recompute=True, recompute_granularity="selective")
    assert "saves the CUDA RNG state" in MegatronRunner().skip_reason(c, inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("recompute", [dict(recompute_granularity="full", recompute_method="uniform",
                                            recompute_num_layers=1),
                                       dict(recompute_granularity="selective")], ids=["full_uniform", "selective"])
def test_recompute_is_bitwise_its_twin(tiny_checkpoint, training_tokens, worker_pool, tmp_path, recompute):
    inputs = RunInputs(checkpoint=tiny_checkpoint, tokens=training_tokens, model=SHAPES["gpt2-tiny"].config,
                       device="cuda")
    twin = CaseSpec(name="plain", model="gpt2", dtype="float32", micro_batch=4, seq_len=64, total_batch=256, steps=4,
                    lr=1e-4)
    rc = dataclasses.replace(twin, name="recompute", activation_recompute=True, **recompute).check()
    for c in (twin, rc):
        rec = worker_pool.run(MegatronRunner(), c, inputs, tmp_path)
        assert rec.ok, rec.error
    assert losses(tmp_path, rc) == losses(tmp_path, twin)
