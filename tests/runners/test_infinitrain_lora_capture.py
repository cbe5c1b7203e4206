"""InfiniTrain's step 1 of a LoRA case (runners/infinitrain/capture.py): the recovery step starts from
the case's weights and lockstep's LoRA init, and its model.ckpt (base and adapters) gives every
adapter's gradient and the frozen base's zeros, which the certificate judges as megatron's
(certify/lora.py). InfiniTrain is stood in for by a runner that answers the capture's launches with
the reference's own SGD step at the recovery lr, saved as InfiniTrain's model.ckpt; planted defects
in what it saves are each their LoRA finding. The real build: tests/runners/test_infinitrain_at_step.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from lockstep.capture.request import CaptureRequest
from lockstep.cases.spec import CaseSpec, LoraSpec
from lockstep.certify.certificate import certify
from lockstep.certify.lora import FROZEN_TRAINED, LORA_SCALE
from lockstep.formats.infinitrain_checkpoint import write_state_file
from lockstep.formats.run_record import RunRecord, StepRecord
from lockstep.models import SHAPES, load_checkpoint
from lockstep.models.family import split_canonical
from lockstep.models.lora import infinitrain_lora_name, is_lora_name, lora_init_tensors
from lockstep.runners.base import RunInputs
from lockstep.runners.infinitrain.capture import KEEP_SAVE, capture_step
from lockstep.runners.infinitrain.families import adapter_for
from lockstep.runners.infinitrain.runner import InfiniTrainRunner
from lockstep.runners.pytorch.train import capture_case

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

ATTN = LoraSpec(rank=8, alpha=16.0, target_modules=("c_attn", "attn.c_proj"))  # InfiniTrain's 1_lora / 2_lora


def lora_case(steps=1) -> CaseSpec:
    return CaseSpec(name="gpt2_lora", model="gpt2-tiny", dtype="float32", micro_batch=4, seq_len=64, total_batch=256,
                    steps=steps, lr=1e-4, lora=ATTN)


class SavingOnly(InfiniTrainRunner):
    """Answers the capture's launches as an InfiniTrain that trains like the reference: one SGD step at
    the launch's lr from the case's weights and LoRA init, saved as its model.ckpt (base under its
    module names, adapters as transformer.h.0.attn.c_attn.lora_A); `plant(w1)` edits what it saves."""

    def __init__(self, checkpoint: Path, tokens: Path, plant=None):
        super().__init__(build_dir=None)
        self.checkpoint, self.tokens, self.plant = checkpoint, tokens, plant
        self.launches: list[CaseSpec] = []

    def run(self, case, inputs, out_dir, on_step=None, workers=None):
        self.launches.append(case)
        ref = capture_case(dataclasses.replace(case, name="ref"), str(self.checkpoint), str(self.tokens), "cpu",
                           CaptureRequest(path=str(Path(out_dir) / f"{case.name}.ref.npz"), full=True))
        ckpt = load_checkpoint(self.checkpoint)
        w0 = split_canonical(ckpt.tensors, ckpt.config) | lora_init_tensors("gpt2", ckpt.config, case.lora, 42)
        w1 = {n: (w.astype(np.float32) - np.float32(case.lr) * ref.grads[n]).astype(np.float32) for n, w in w0.items()}
        if self.plant:
            self.plant(w1)
        base = {n: a for n, a in w1.items() if not is_lora_name(n)}
        saved = adapter_for("gpt2").native_state(base, ckpt.config) | {
            infinitrain_lora_name(n): a for n, a in w1.items() if is_lora_name(n)}
        path = Path(out_dir) / "infinitrain" / f"{case.name}.save" / f"checkpoint_step_{case.steps:06d}" / "model.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_state_file(path, saved)
        assert inputs.extra.get(KEEP_SAVE) and inputs.save_final_params
        return RunRecord(framework="infinitrain", case=case.name, steps=[StepRecord(1, ref.loss)],
                         meta={"infinitrain_save": str(path)}, source=str(path))


@pytest.fixture(scope="module")
def reference(tiny_checkpoint, training_tokens, tmp_path_factory):
    request = CaptureRequest(path=str(tmp_path_factory.mktemp("ref") / "pytorch.npz"), full=True, whole_grads=True)
    return capture_case(lora_case(), str(tiny_checkpoint), str(training_tokens), "cpu", request)


def infinitrain_capture(reference, tiny_checkpoint, training_tokens, tmp_path, plant=None):
    ref_path = tmp_path / "pytorch.npz"
    reference.save(ref_path)
    runner = SavingOnly(tiny_checkpoint, training_tokens, plant)
    inputs = RunInputs(checkpoint=tiny_checkpoint, tokens=training_tokens, model=SHAPES["gpt2-tiny"].config,
                       device="cpu")
    request = CaptureRequest(path=str(tmp_path / "infinitrain.npz"), full=True, reference=str(ref_path))
    return capture_step(runner, lora_case(steps=10), inputs, tmp_path, request), runner


def test_the_lora_capture_recovers_every_adapter_and_the_frozen_base(reference, tiny_checkpoint, training_tokens,
                                                                     tmp_path):
    cap, runner = infinitrain_capture(reference, tiny_checkpoint, training_tokens, tmp_path)
    (launch,) = runner.launches
    assert launch.steps == 1 and launch.lora == ATTN and launch.lr == 2.0 ** round(np.log2(launch.lr))
    assert runner.capture_problem(lora_case(), RunInputs(checkpoint=tiny_checkpoint, tokens=training_tokens,
                                                         model=SHAPES["gpt2-tiny"].config, device="cpu")) is None
    adapters = sorted(n for n in reference.names("grad") if is_lora_name(n))
    assert sorted(n for n in cap.names("grad") if is_lora_name(n)) == adapters and len(adapters) == 8
    for name in reference.names("grad"):
        g, r = cap.grads[name].astype(np.float64), reference.grads[name].astype(np.float64)
        if not is_lora_name(name) or name.startswith("lora_A"):
            # Frozen base and step 1's A (B = 0): exactly zero on both sides.
            assert not np.any(r) and not np.any(g), name
        else:
            assert np.linalg.norm(g - r) <= 1e-6 * np.linalg.norm(r), name
    cert = certify(reference, cap, lora_case())
    print(f"LoRA capture, no defect: {cert.summary_line()}")
    assert cert.holds and cert.findings == [], cert.summary_line()


def test_lora_b_rescaled_in_the_saved_file_is_a_scale_finding(reference, tiny_checkpoint, training_tokens, tmp_path):
    def rescale_b(w1):  # B starts at 0: its saved value is -lr·g, so a factor 8 on it is 8x the gradient
        for name in w1:
            if name.startswith("lora_B"):
                w1[name] = w1[name] * np.float32(8.0)

    cap, _ = infinitrain_capture(reference, tiny_checkpoint, training_tokens, tmp_path, rescale_b)
    cert = certify(reference, cap, lora_case())
    print(f"LoRA capture, B x8: {cert.summary_line()}")
    assert not cert.holds
    assert (cert.cause.kind, cert.cause.where) == (LORA_SCALE, "lora_B.qkvw[0..1], lora_B.attprojw[0..1]")
    assert "is 8x the reference (pytorch)'s (4 tensors, the same direction): infinitrain scales by alpha" \
        in cert.cause.line


def test_a_base_tensor_that_moved_is_a_frozen_parameter_trained(reference, tiny_checkpoint, training_tokens, tmp_path):
    def move_ln1(w1):
        for layer in (0, 1):
            w1[f"ln1w[{layer}]"] = w1[f"ln1w[{layer}]"] - np.float32(2.0 ** -10)

    cap, _ = infinitrain_capture(reference, tiny_checkpoint, training_tokens, tmp_path, move_ln1)
    cert = certify(reference, cap, lora_case())
    print(f"LoRA capture, ln1w moved: {cert.summary_line()}")
    assert (cert.cause.kind, cert.cause.where) == (FROZEN_TRAINED, "ln1w[0..1]")
    assert "frozen parameter trained: infinitrain's ln1w[0..1] receive a gradient at step 1" in cert.cause.line


# ---------------------------------------------------------------------- with a real build

def real_build_or_skip() -> Path:
    import os

    build = os.environ.get("LOCKSTEP_INFINITRAIN_BUILD")
    if not build or not (Path(build) / "gpt2").is_file():
        pytest.skip("set LOCKSTEP_INFINITRAIN_BUILD to an InfiniTrain build with gpt2 to run this")
    return Path(build)


def test_real_infinitrains_lora_step_1_agrees_and_a_rescaled_b_is_named(reference, tiny_checkpoint, training_tokens,
                                                                         tmp_path, monkeypatch):
    """Its own step at the recovery lr, saved, against the reference: the certificate holds over
    the 8 adapters and the frozen base; the same save read with every lora_B x8 is the scale finding."""
    from lockstep.runners.infinitrain import capture as infinitrain_capture_module

    build = real_build_or_skip()
    ref_path = tmp_path / "pytorch.npz"
    reference.save(ref_path)
    runner = InfiniTrainRunner(build_dir=build)
    inputs = RunInputs(checkpoint=tiny_checkpoint, tokens=training_tokens, model=SHAPES["gpt2-tiny"].config,
                       device="cpu", timeout_s=600)

    def capture(name):
        request = CaptureRequest(path=str(tmp_path / f"{name}.npz"), full=True, reference=str(ref_path), rows=4)
        return capture_step(runner, lora_case(steps=10), inputs, tmp_path / name, request)

    cap = capture("infinitrain")
    cert = certify(reference, cap, lora_case())
    adapters = [n for n in cap.names("grad") if is_lora_name(n)]
    b_rel = max(np.linalg.norm(cap.grads[n].astype(np.float64) - reference.grads[n])
                / np.linalg.norm(reference.grads[n].astype(np.float64)) for n in adapters if n.startswith("lora_B"))
    print(f"real InfiniTrain LoRA step 1: {cert.summary_line()}; lora_B worst relative {b_rel:.2e}; "
          f"recovery lr {cap.meta['recovery_lr']:g}; {len(cap.forward)} module outputs")
    assert len(adapters) == 8
    assert all(not np.any(cap.grads[n]) for n in cap.names("grad") if not n.startswith("lora_B")), "frozen base moved"
    assert cert.holds, cert.summary_line()

    real_saved = infinitrain_capture_module.saved_weights

    def b_times_8(saved_path, family, model):
        w1 = real_saved(saved_path, family, model)
        return {n: a * np.float32(8.0) if n.startswith("lora_B") else a for n, a in w1.items()}

    monkeypatch.setattr(infinitrain_capture_module, "saved_weights", b_times_8)
    broken = certify(reference, capture("planted"), lora_case())
    print(f"real InfiniTrain LoRA step 1, its saved B x8: {broken.summary_line()}")
    assert (broken.cause.kind, broken.cause.where) == (LORA_SCALE, "lora_B.qkvw[0..1], lora_B.attprojw[0..1]")
