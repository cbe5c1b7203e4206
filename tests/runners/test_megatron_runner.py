"""The megatron runner end to end on gpt2-tiny, CPU (gloo): losses against the pytorch reference,
TP=2 and PP=2 against TP=1, its log, failures and skips.

Every run here launches torchrun workers that import megatron-core (about 10 s each on the
CI machine), so the cases are few and short.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.models.gpt2 import FAMILY as GPT2_FAMILY
from lockstep.formats.run_record import read_run_record
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs
from lockstep.runners.megatron import MegatronRunner
from lockstep.runners.megatron import runner as megatron_runner_module
from lockstep.runners.pytorch import PyTorchRunner

pytest.importorskip("megatron.core")

TINY = SHAPES["gpt2-tiny"].config
FP32_TOLERANCE = 1e-5


def case(name="c", steps=10, B=4, T=64, total=256, dtype="float32", **parallel) -> CaseSpec:
    return CaseSpec(name=name, model="gpt2", dtype=dtype, micro_batch=B, seq_len=T, total_batch=total, steps=steps,
                    lr=1e-4, **parallel)


@pytest.fixture(scope="module")
def inputs(tiny_checkpoint, tiny_shakespeare_train) -> RunInputs:
    return RunInputs(checkpoint=tiny_checkpoint, tokens=tiny_shakespeare_train, model=TINY, device="cpu")


@pytest.fixture(scope="module")
def gpt2_1_runs(inputs, tmp_path_factory):
    """gpt2_1's shape (B=4, T=64, 256 tokens/step), 10 FP32 steps, on both frameworks."""
    out = tmp_path_factory.mktemp("gpt2_1")
    c = case("gpt2_1")
    return MegatronRunner().run(c, inputs, out), PyTorchRunner().run(c, inputs, out), out


def max_diff(a, b) -> float:
    assert len(a.losses()) == len(b.losses()) > 0
    return max(abs(x - y) for x, y in zip(a.losses(), b.losses()))


def test_gpt2_1_shape_matches_pytorch_over_10_steps(gpt2_1_runs):
    mega, ref, _ = gpt2_1_runs
    assert mega.ok, mega.error
    assert ref.ok, ref.error
    assert [s.step for s in mega.steps] == list(range(1, 11))
    diff = max_diff(mega, ref)
    print(f"gpt2_1-shaped max |dloss| megatron vs pytorch over 10 steps: {diff:.3e}")
    assert diff < FP32_TOLERANCE
    assert mega.losses()[0] != mega.losses()[-1]  # training moved the weights


@pytest.mark.slow
def test_gpt2_2_shape_with_accumulation_matches_pytorch(inputs, tmp_path):
    """gpt2_2 (B=80, 5120 tokens/step) scaled to the CPU: B=8, 1024 tokens/step -> accum 2."""
    c = case("gpt2_2", B=8, total=1024)
    assert c.accum == 2
    mega, ref = MegatronRunner().run(c, inputs, tmp_path), PyTorchRunner().run(c, inputs, tmp_path)
    assert mega.ok, mega.error
    diff = max_diff(mega, ref)
    print(f"gpt2_2-shaped (B=8, accum=2) max |dloss| megatron vs pytorch over 10 steps: {diff:.3e}")
    assert diff < FP32_TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [{"tp": 2}, {"pp": 2}], ids=["tp2", "pp2"])
def test_tp2_and_pp2_match_tp1(parallel, gpt2_1_runs, inputs, tmp_path):
    """Two gloo processes: TP=2 (vocab padded to Vp and masked) or PP=2 (tied weight on the last stage)."""
    tp1 = gpt2_1_runs[0]
    rec = MegatronRunner().run(case("split", steps=2, **parallel), inputs, tmp_path)
    assert rec.ok, rec.error
    assert rec.meta["tp"] == parallel.get("tp", 1) and rec.meta["pp"] == parallel.get("pp", 1)
    diffs = [abs(a - b) for a, b in zip(rec.losses(), tp1.losses()[:2])]
    print(f"{parallel} vs TP=1 |dloss| steps 1-2: {diffs}")
    assert len(diffs) == 2 and max(diffs) < FP32_TOLERANCE
    if "tp" in parallel:
        assert rec.meta["megatron_vocab_size"] == TINY.padded_vocab_size


def test_log_has_marker_config_iteration_and_perf_lines(gpt2_1_runs):
    mega, _, out = gpt2_1_runs
    log = (out / "megatron" / "gpt2_1.log").read_text()
    lines = log.splitlines()
    marker = [i for i, ln in enumerate(lines) if "lockstep megatron runner" in ln]
    assert marker and marker[0] <= 3  # near the top, right after launch.py's [COMMAND] line
    assert "seq_length=64" in log
    iterations = [ln for ln in lines if " iteration " in ln and "lm loss:" in ln]
    assert len(iterations) == 10
    # The logged loss is the step's own loss (no Megatron-LM step-2 running mean).
    logged = [float(re.search(r"lm loss: (\S+) \|", ln).group(1)) for ln in iterations]
    assert all(abs(a - b) < 1e-5 * max(1.0, abs(b)) for a, b in zip(logged, mega.losses()))
    assert re.search(r"iteration +2/ +10 \| consumed samples: +8 \|", log)
    assert len([ln for ln in lines if ln.startswith("PERF step ")]) == 10
    assert re.search(r"^PERF summary \| measured_steps 9 \| avg [\d.]+ ms \| avg \d+ tok/s$", log, re.M)
    for s in mega.steps:
        assert s.step_ms > 0 and abs(s.tokens_per_s - 256 / (s.step_ms / 1e3)) < 1e-6 * s.tokens_per_s


def test_record_meta(gpt2_1_runs):
    mega, _, out = gpt2_1_runs
    back = read_run_record(out / "megatron" / "gpt2_1.jsonl")
    assert back.status == "ok" and back.framework == "megatron" and back.losses() == mega.losses()
    meta = back.meta
    assert meta["framework_version"].startswith("megatron-core 0.")
    assert (meta["tp"], meta["pp"], meta["dp"]) == (1, 1, 1)
    assert meta["device_name"] == "cpu" and meta["launcher"] == "torchrun --nproc_per_node=1"
    assert meta["cpu_shims"] and meta["megatron_vocab_size"] == TINY.vocab_size


def test_checkpoint_with_disagreeing_shape_fails_naming_tensor_and_rank(inputs, tmp_path):
    # The file's maxT differs from the planned model's: wpe has 512 rows, the model wants 1024.
    other = dataclasses.replace(TINY, max_seq_len=512)
    rng = np.random.default_rng(0)
    bad = tmp_path / "short_wpe.bin"
    GPT2_FAMILY.write(bad, other, {n: rng.standard_normal(s).astype(np.float32) * 0.02 for n, s in other.tensor_shapes()})
    rec = MegatronRunner().run(case("gpt2_1", steps=2), dataclasses.replace(inputs, checkpoint=bad), tmp_path)
    assert rec.status == "failed" and rec.steps == []
    assert "rank 0: tensor embedding.position_embeddings.weight (LLMC wpe) has shape (512, 96)" in rec.error
    assert "(1024, 96)" in rec.error
    assert read_run_record(tmp_path / "megatron" / "gpt2_1.jsonl").status == "failed"


def test_too_few_tokens_fails_before_launching(inputs, tmp_path):
    from lockstep.formats.tokens import write_token_stream

    short = tmp_path / "short.bin"
    write_token_stream(short, np.arange(1000))
    rec = MegatronRunner().run(case("gpt2_1", steps=10), dataclasses.replace(inputs, tokens=short), tmp_path)
    assert rec.status == "failed" and "needs 2561 tokens" in rec.error and "holds 1000" in rec.error
    assert not (tmp_path / "megatron" / "gpt2_1.log").exists()  # no worker was started


def test_skip_reasons(inputs, monkeypatch):
    runner = MegatronRunner()
    assert runner.skip_reason(case(), inputs) is None
    assert runner.skip_reason(case(dtype="bfloat16"), inputs) == "megatron-core's bf16 autocast backward needs CUDA"
    assert "attention heads" in runner.skip_reason(case(tp=5, B=4, total=256), inputs)
    assert "layers" in runner.skip_reason(case(pp=4, B=1, total=256), inputs)  # L=2
    assert "devices" in runner.skip_reason(case(dp=64, B=1, total=64 * 64), inputs)
    assert "Apex" in runner.skip_reason(case(tp=2, sp=True), inputs)
    assert "need PP > 1" in runner.skip_reason(case(vpp=2), inputs)
    four_layers = dataclasses.replace(inputs, model=dataclasses.replace(TINY, num_layers=4))
    assert "multiple of PP=2" in runner.skip_reason(case(pp=2, vpp=2, B=4, total=256), four_layers)  # accum 1
    assert runner.skip_reason(case(pp=2, vpp=2, B=2, total=256), four_layers) is None
    assert "native bf16" in MegatronRunner(native_bf16=True).skip_reason(case(dtype="bfloat16"), inputs)
    monkeypatch.setattr(megatron_runner_module, "megatron_core_installed", lambda: False)
    assert runner.skip_reason(case(), inputs) == "megatron-core is not installed (pip install 'lockstep[megatron]')"


def test_version_and_native_bf16_option():
    assert MegatronRunner().version().startswith("megatron-core ")
    assert MegatronRunner(native_bf16=True).options.native_bf16
    from lockstep.runners import get_runner

    assert isinstance(get_runner("megatron", native_bf16=True), MegatronRunner)
