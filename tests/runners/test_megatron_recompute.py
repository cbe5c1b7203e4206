"""Activation recompute in megatron-core trades compute for memory and must not change a bit:
a recompute case's every loss equals its twin's without recompute exactly (gpt2-tiny).

megatron-core's recompute (tensor_parallel.random.CheckpointFunction) saves and restores the CUDA
RNG state around the replay; on a CPU that state is empty (cpu_shims.py, shim 6), so the bitwise
test runs here and, marked, on a GPU."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.cli import main
from lockstep.formats.run_record import read_run_record
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs
from lockstep.runners.megatron import MegatronRunner
from support.defects import TESTS_DIR
from support.recompute_cases import recompute_matrix
from support.recompute_probe import MARKER

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.integration


def losses(out, c: CaseSpec) -> list[float]:
    return [s.loss for s in read_run_record(out / "megatron" / f"{c.name}.jsonl").steps]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("recompute", [dict(recompute_granularity="selective")], ids=["selective"])
def test_recompute_is_bitwise_its_twin(tiny_checkpoint, training_tokens, worker_pool, tmp_path, recompute, device):
    inputs = RunInputs(checkpoint=tiny_checkpoint, tokens=training_tokens, model=SHAPES["gpt2-tiny"].config,
                       device=device)
    twin = CaseSpec(name="plain", model="gpt2", dtype="float32", micro_batch=4, seq_len=64, total_batch=256, steps=4,
                    lr=1e-4)
    rc = dataclasses.replace(twin, name="recompute", activation_recompute=True, **recompute).check()
    for c in (twin, rc):
        rec = worker_pool.run(MegatronRunner(), c, inputs, tmp_path)
        assert rec.ok, rec.error
    assert losses(tmp_path, rc) == losses(tmp_path, twin)


def test_a_recompute_case_replays_forwards_in_the_backward(tiny_checkpoint, training_tokens, tmp_path, monkeypatch):
    """Full recompute of both gpt2-tiny layers, one at a time: two replays per step."""
    monkeypatch.setenv("LOCKSTEP_TEST_PLUGINS", "support.recompute_probe:count_replays")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p))
    inputs = RunInputs(checkpoint=tiny_checkpoint, tokens=training_tokens, model=SHAPES["gpt2-tiny"].config,
                       device="cpu")
    c = CaseSpec(name="recompute", model="gpt2", dtype="float32", micro_batch=4, seq_len=64, total_batch=256,
                 steps=2, lr=1e-4, activation_recompute=True, recompute_granularity="full", recompute_method="uniform",
                 recompute_num_layers=1).check()
    rec = MegatronRunner().run(c, inputs, tmp_path)
    assert rec.ok, rec.error
    log = (tmp_path / "megatron" / "recompute.log").read_text()
    assert log.count(MARKER) == 2 * 2, log[-2000:]


def test_full_recompute_with_two_micro_batches_is_its_twin_inside_step_1(tmp_path, capsys, tiny_checkpoint,
                                                                         training_tokens):
    """Step 1's captures too: the replayed forwards are not taken for the next micro batch's."""
    matrix = tmp_path / "m.toml"
    matrix.write_text(recompute_matrix(micro_batches=2))
    out = tmp_path / "o"
    rc = main(["run", "--matrix", str(matrix), "--frameworks", "pytorch,megatron", "--llmc", str(tiny_checkpoint),
               "--data", str(training_tokens), "--device", "cpu", "--out", str(out), "--no-history"])
    text = capsys.readouterr().out
    assert rc == 0, text
    twin = {t["framework"]: t for t in json.loads((out / "summary.json").read_text())["twins"]}["megatron"]
    assert (twin["case"], twin["passed"]) == ("rc_uniform1", True)
    assert twin["captures"] == "step 1's module outputs and gradients bit for bit", twin
