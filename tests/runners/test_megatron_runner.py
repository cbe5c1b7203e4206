"""The megatron runner end to end on gpt2-tiny, CPU (gloo): losses and final parameters against
the pytorch reference, TP=2 and PP=2 against TP=1, its log, failures and skips.

Every equality test runs at the contract's lr and at TRAINING_LR (tests/support/numerics.py),
where training moves the parameters far past the limits and every parameter is compared after
the last step under its canonical LLMC name. Each kind of comparison has negative controls: a
known defect injected into one side (tests/support/defects.py) must make it fail.

Every run here starts torchrun workers that import megatron-core (about 10 s each on the CI
machine), so the cases are few and short, and most run in the session's shared worker groups
(tests/conftest.py, `worker_pool`: started once per world size). gpt2_1_runs and the failing
checkpoint still start a process of their own (the runner's path without persistent workers),
and so does every run with a defect in its workers' environment.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.models.gpt2 import FAMILY as GPT2_FAMILY
from lockstep.formats.run_record import read_run_record
from lockstep.models import SHAPES, load_checkpoint
from lockstep.runners.base import RunInputs
from lockstep.runners.megatron import MegatronRunner
from lockstep.runners.megatron import runner as megatron_runner_module
from lockstep.runners.pytorch import PyTorchRunner
from support import defects
from support.numerics import (LOSS_LIMIT, PARAM_LIMITS, TRAINING_LR, TRAINING_STEPS, assert_loss_falls, assert_trained,
                              final_params, loss_gap, param_gap)

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

pytest.importorskip("megatron.core")

TINY = SHAPES["gpt2-tiny"].config
FP32_TOLERANCE = 1e-5  # the contract's FP32 loss threshold, for the contract-lr cases


def case(name="c", steps=10, B=4, T=64, total=256, dtype="float32", lr=1e-4, **parallel) -> CaseSpec:
    return CaseSpec(name=name, model="gpt2", dtype=dtype, micro_batch=B, seq_len=T, total_batch=total, steps=steps,
                    lr=lr, **parallel)


def training_case(name, B=4, **parallel) -> CaseSpec:
    return case(name, steps=TRAINING_STEPS, B=B, lr=TRAINING_LR, **parallel)


@pytest.fixture(scope="module")
def inputs(tiny_checkpoint, training_tokens) -> RunInputs:
    return RunInputs(checkpoint=tiny_checkpoint, tokens=training_tokens, model=TINY, device="cpu",
                     save_final_params=True)


@pytest.fixture(scope="module")
def gpt2_1_runs(inputs, tmp_path_factory):
    """gpt2_1's shape (B=4, T=64, 256 tokens/step), 10 FP32 steps at the contract's lr, on both frameworks."""
    out = tmp_path_factory.mktemp("gpt2_1")
    c = case("gpt2_1")
    return MegatronRunner().run(c, inputs, out), PyTorchRunner().run(c, inputs, out), out


@dataclasses.dataclass(frozen=True)
class Trained:
    """One run at TRAINING_LR: its record and its final canonical parameters."""

    record: object
    params: dict

    @classmethod
    def run(cls, runner, c: CaseSpec, inputs: RunInputs, out, pool=None) -> "Trained":
        """In `pool`'s shared worker group where one is given (tests/conftest.py), else on its own."""
        rec = pool.run(runner, c, inputs, out) if pool is not None else runner.run(c, inputs, out)
        assert rec.ok, rec.error
        return cls(rec, final_params(out, runner.name, c.name))


@pytest.fixture(scope="module")
def trained(inputs, tmp_path_factory, worker_pool) -> dict[str, Trained]:
    """gpt2_1's shape at TRAINING_LR: the pytorch reference and megatron TP=1, accum 1."""
    out = tmp_path_factory.mktemp("trained")
    runs = {"pytorch": Trained.run(PyTorchRunner(), training_case("one"), inputs, out),
            "megatron": Trained.run(MegatronRunner(), training_case("one"), inputs, out, worker_pool)}
    assert_loss_falls(runs["pytorch"].record)
    assert_trained(runs["pytorch"].params, load_checkpoint(inputs.checkpoint).tensors, TINY)
    return runs


def disagreements(a: Trained, b: Trained, param_limit: float) -> list[str]:
    """What the equality check finds between two trained runs (empty: they agree)."""
    found = []
    dloss, gap = loss_gap(a.record, b.record), param_gap(a.params, b.params, TINY)
    print(f"max |dloss| {dloss:.3e}, {gap}")
    if dloss >= LOSS_LIMIT:
        found.append(f"max |dloss| {dloss:.3e} >= {LOSS_LIMIT:g}")
    if gap.max_abs >= param_limit:
        found.append(f"{gap} >= {param_limit:g}")
    return found


def max_diff(a, b) -> float:
    return loss_gap(a, b)


def test_gpt2_1_shape_matches_pytorch_over_10_steps(gpt2_1_runs):
    mega, ref, out = gpt2_1_runs
    assert mega.ok, mega.error
    assert ref.ok, ref.error
    assert [s.step for s in mega.steps] == list(range(1, 11))
    diff = max_diff(mega, ref)
    print(f"gpt2_1-shaped max |dloss| megatron vs pytorch over 10 steps: {diff:.3e}")
    assert diff < FP32_TOLERANCE
    gap = param_gap(final_params(out, "megatron", "gpt2_1"), final_params(out, "pytorch", "gpt2_1"), TINY)
    assert gap.max_abs < PARAM_LIMITS["megatron_vs_pytorch"], gap


def test_megatron_trains_the_same_model_as_pytorch(trained):
    assert disagreements(trained["megatron"], trained["pytorch"], PARAM_LIMITS["megatron_vs_pytorch"]) == []


@pytest.mark.parametrize("defect", [*defects.REFERENCE_DEFECTS, "data_order_off_by_one"])
def test_megatron_vs_pytorch_catches_a_defective_reference(defect, trained, inputs, tmp_path, monkeypatch):
    """The reference with one known defect (in-process) must FAIL against the clean megatron run."""
    defects.inject(defect, monkeypatch)
    broken = Trained.run(PyTorchRunner(), training_case("one"), inputs, tmp_path)
    assert disagreements(trained["megatron"], broken, PARAM_LIMITS["megatron_vs_pytorch"]) != []


@pytest.mark.slow
def test_gpt2_2_shape_with_accumulation_matches_pytorch(inputs, tmp_path, worker_pool):
    """gpt2_2 (B=80, 5120 tokens/step) scaled to the CPU: B=8, 1024 tokens/step -> accum 2."""
    c = case("gpt2_2", B=8, total=1024)
    assert c.accum == 2
    mega, ref = worker_pool.run(MegatronRunner(), c, inputs, tmp_path), PyTorchRunner().run(c, inputs, tmp_path)
    assert mega.ok, mega.error
    diff = max_diff(mega, ref)
    print(f"gpt2_2-shaped (B=8, accum=2) max |dloss| megatron vs pytorch over 10 steps: {diff:.3e}")
    assert diff < FP32_TOLERANCE
    gap = param_gap(final_params(tmp_path, "megatron", "gpt2_2"), final_params(tmp_path, "pytorch", "gpt2_2"), TINY)
    assert gap.max_abs < PARAM_LIMITS["megatron_vs_pytorch"], gap


@pytest.mark.slow
def test_megatron_accumulation_trains_the_same_model_as_pytorch(trained, inputs, tmp_path, worker_pool):
    """B=2, accum 2 on megatron against the unsplit reference at TRAINING_LR."""
    acc = Trained.run(MegatronRunner(), training_case("acc", B=2), inputs, tmp_path, worker_pool)
    assert acc.record.meta["case_spec"]["micro_batch"] == 2
    assert disagreements(acc, trained["pytorch"], PARAM_LIMITS["megatron_vs_pytorch"]) == []


PARALLEL = {"tp2": ({"tp": 2}, 4, "megatron_tp2"), "pp2": ({"pp": 2}, 2, "megatron_vs_pytorch")}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(PARALLEL))
def test_tp2_and_pp2_match_tp1_at_contract_lr(layout, gpt2_1_runs, inputs, tmp_path, worker_pool):
    """Two gloo processes: TP=2 (vocab padded to Vp and masked) or PP=2 (tied weight on the last stage)."""
    parallel, B, _ = PARALLEL[layout]
    tp1 = gpt2_1_runs[0]
    rec = worker_pool.run(MegatronRunner(), case("split", steps=5, B=B, **parallel), inputs, tmp_path)
    assert rec.ok, rec.error
    assert rec.meta["tp"] == parallel.get("tp", 1) and rec.meta["pp"] == parallel.get("pp", 1)
    diffs = [abs(a - b) for a, b in zip(rec.losses(), tp1.losses()[:5])]
    print(f"{parallel} vs TP=1 |dloss| steps 1-5: {diffs}")
    assert len(diffs) == 5 and max(diffs) < FP32_TOLERANCE
    if "tp" in parallel:
        assert rec.meta["megatron_vocab_size"] == TINY.padded_vocab_size


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(PARALLEL))
def test_tp2_and_pp2_train_the_same_model_as_tp1(layout, trained, inputs, tmp_path, worker_pool):
    parallel, B, limit = PARALLEL[layout]
    split = Trained.run(MegatronRunner(), training_case(layout, B=B, **parallel), inputs, tmp_path, worker_pool)
    assert (split.record.meta["tp"], split.record.meta["pp"]) == (parallel.get("tp", 1), parallel.get("pp", 1))
    assert disagreements(split, trained["megatron"], PARAM_LIMITS[limit]) == []


@pytest.mark.slow
@pytest.mark.parametrize("layout,defect", [("tp2", "megatron_tp_input_grad_unreduced"),
                                           ("pp2", "megatron_pp_tie_unsynced")])
def test_tp2_and_pp2_comparisons_catch_a_parallel_defect(layout, defect, trained, inputs, tmp_path, monkeypatch):
    """TP=2 whose column-parallel input gradients are not all-reduced; PP=2 whose tied word
    embedding's gradient is not all-reduced between the first and last stage: both must FAIL."""
    parallel, B, limit = PARALLEL[layout]
    defects.worker_env(defect, monkeypatch)
    split = Trained.run(MegatronRunner(), training_case(layout, B=B, **parallel), inputs, tmp_path)
    assert disagreements(split, trained["megatron"], PARAM_LIMITS[limit]) != []


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
