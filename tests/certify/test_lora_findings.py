"""The certificate of a LoRA case (certify/lora.py): the pytorch reference's step 1 against itself
holds over every adapter gradient and the frozen base; each LoRA defect in one side
(tests/support/defects.py) is its own named finding, placed first. In-process captures of
gpt2-tiny, whole tensors (tests/runners/test_lora_training.py certifies sketches, as `lockstep run` keeps them)."""

from __future__ import annotations

import pytest

from lockstep.capture.request import CaptureRequest
from lockstep.cases.spec import CaseSpec, LoraSpec
from lockstep.certify.certificate import certify
from lockstep.certify.classify import BACKWARD_INPUT, DOWNSTREAM
from lockstep.certify.lora import FROZEN_TRAINED, LORA_B_NOT_ZERO, LORA_MODULES, LORA_SCALE
from lockstep.models import SHAPES
from lockstep.runners.pytorch.train import capture_case
from support import defects

ATTN = LoraSpec(rank=8, alpha=16.0, target_modules=("c_attn", "attn.c_proj"))  # InfiniTrain's 1_lora


def lora_case(spec=ATTN) -> CaseSpec:
    return CaseSpec(name="gpt2_lora", model="gpt2-tiny", dtype="float32", micro_batch=4, seq_len=64, total_batch=256,
                    steps=1, lr=1e-4, lora=spec)


def capture(tiny_checkpoint, training_tokens, tmp_path, framework: str, case: CaseSpec):
    request = CaptureRequest(path=str(tmp_path / f"{framework}.npz"), rows=2, full=True, whole_grads=True)
    return capture_case(case, str(tiny_checkpoint), str(training_tokens), "cpu", request, framework=framework)


@pytest.fixture(scope="module")
def reference(tiny_checkpoint, training_tokens, tmp_path_factory):
    return capture(tiny_checkpoint, training_tokens, tmp_path_factory.mktemp("ref"), "pytorch", lora_case())


def test_the_reference_against_itself_holds_over_the_adapters(reference, tiny_checkpoint, training_tokens, tmp_path):
    again = capture(tiny_checkpoint, training_tokens, tmp_path, "again", lora_case())
    cert = certify(reference, again, lora_case())
    assert cert.holds and cert.findings == [], cert.summary_line()
    layers = SHAPES["gpt2-tiny"].config.num_layers
    assert cert.compared["gradients"] == 12 * layers + 4 + 4 * layers  # base (all zero: frozen) and 4 adapters a layer
    assert [n for n in reference.names("grad") if n.startswith("lora_")][:4] == [
        "lora_A.qkvw[0]", "lora_B.qkvw[0]", "lora_A.attprojw[0]", "lora_B.attprojw[0]"]


@pytest.mark.parametrize("defect,kind,where,words", [
    ("lora_scale_alpha", LORA_SCALE, "lora_B.qkvw[0..1], lora_B.attprojw[0..1]",
     "is 8x the reference (pytorch)'s (4 tensors, the same direction): lora-defect scales by alpha (16) instead of "
     "alpha/rank (2)"),
    ("lora_b_not_zero", LORA_B_NOT_ZERO, "lora_B.qkvw[0..1], lora_B.attprojw[0..1]",
     "LoRA B not zero at the start: lora-defect's lora_A gradients are not zero at step 1"),
    ("lora_layernorm_trains", FROZEN_TRAINED, "ln1w[0..1]",
     "frozen parameter trained: lora-defect's ln1w[0..1] receive a gradient at step 1"),
    ("lora_wrong_module", LORA_MODULES, "fcw[0..1]",
     "LoRA on other modules: lora-defect adapts fcw[0..1] (mlp.c_fc) where the reference (pytorch) adapts "
     "attprojw[0..1] (attn.c_proj)"),
])
def test_each_lora_defect_is_its_named_finding(reference, tiny_checkpoint, training_tokens, tmp_path, monkeypatch,
                                                defect, kind, where, words):
    defects.inject(defect, monkeypatch)
    broken = capture(tiny_checkpoint, training_tokens, tmp_path, "lora-defect", lora_case())
    cert = certify(reference, broken, lora_case())
    print(f"{defect}: {cert.summary_line()}")
    assert not cert.holds
    assert (cert.cause.kind, cert.cause.where) == (kind, where), cert.summary_line()
    assert words in cert.cause.line
    if defect in ("lora_scale_alpha", "lora_layernorm_trains", "lora_wrong_module"):
        # Step 1's forward is the base model's on both sides (B = 0): the LoRA finding is the only one.
        assert [f.kind for f in cert.findings] == [kind], [f.line for f in cert.findings]


def test_a_wrong_input_gradient_below_a_frozen_base_is_named_where_it_enters(reference, tiny_checkpoint,
                                                                              training_tokens, tmp_path, monkeypatch):
    """InfiniTrain's CUDA GPT-2 under LoRA (docs/results/2026-12-03-h200-reruns): ln_f's backward passes on a wrong
    input gradient. With the base frozen, the only parameter gradients compared are the adapters', every LoRA B
    below ln_f differs and every LoRA A is zero on both sides (B = 0 at step 1), so the gradient rules alone said
    "gradient of lora_B.qkvw only ... while their neighbours agree". The gradient arriving at the last block's
    output says where it comes from."""
    defects.inject("lnf_input_grad_term", monkeypatch)
    broken = capture(tiny_checkpoint, training_tokens, tmp_path, "lora-defect", lora_case())
    cert = certify(reference, broken, lora_case())
    print(cert.summary_line())
    assert not cert.holds
    assert (cert.cause.kind, cert.cause.where) == (BACKWARD_INPUT, "lnf"), cert.summary_line()
    assert "the gradient arriving at block[1]'s output differs" in cert.cause.line
    downstream = cert.findings[1]
    assert downstream.kind == DOWNSTREAM and set(downstream.tensors) == {
        f"lora_B.{t}[{layer}]" for t in ("qkvw", "attprojw") for layer in (0, 1)}
    assert [f.kind for f in cert.findings] == [BACKWARD_INPUT, DOWNSTREAM]
