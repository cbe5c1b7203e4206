"""Defects built into the reference GPT-2 must be named as exactly that tensor or module, with the
right classification -- from whole tensors (diagnose) and from sketches (the certificate of
`lockstep run`) alike."""

from __future__ import annotations

import numpy as np
import pytest

from lockstep.capture.request import CaptureRequest, adam_first_update
from lockstep.cases.spec import CaseSpec
from lockstep.certify.certificate import certify
from lockstep.certify.classify import BACKWARD_INPUT, FORWARD, GRADIENT_ONLY, TIE
from lockstep.diagnose.verdict import diagnose_captures
from lockstep.formats.step_capture import GRAD_ADAM_UPDATE
from lockstep.models.gpt2.model import GPT2
from lockstep.runners.pytorch.capture import capture_reference
from support.model_defects import UntiedGPT2, gpt2_with


@pytest.fixture(scope="module")
def reference(gpt2_tiny, token_ids, gpt2_case):
    config, tensors = gpt2_tiny
    return capture_reference(GPT2.from_llmc(tensors, config), gpt2_case(), token_ids)


def verdict_against(reference, model, token_ids):
    case = CaseSpec.from_dict(reference.meta["case"])
    return diagnose_captures(reference, capture_reference(model, case, token_ids, framework="test"), case)


def sketched(model, case, token_ids, tmp_path, framework):
    """The certificate's capture of `lockstep run`: sketches only, written and read back."""
    request = CaptureRequest(path=str(tmp_path / f"{framework}.npz"), adam_eps=1e-8)
    capture_reference(model, case, token_ids, framework=framework, request=request)
    from lockstep.formats.step_capture import StepCapture

    return StepCapture.load(request.path)


def test_identical_pair_reports_no_divergence(reference, gpt2_tiny, token_ids):
    config, tensors = gpt2_tiny
    v = verdict_against(reference, GPT2.from_llmc(tensors, config), token_ids)
    assert v.findings == [] and v.headline == "no divergence"
    assert max(d.rel for d in v.grads) == 0.0 and max(d.rel for d in v.forward) == 0.0


def test_transposed_bias_gradient_is_named_as_that_bias_only(reference, gpt2_tiny, token_ids):
    config, tensors = gpt2_tiny
    v = verdict_against(reference, gpt2_with(tensors, config, c_attn=True), token_ids)
    assert [(f.kind, f.where, f.tensors) for f in v.findings] == [(GRADIENT_ONLY, "qkvb[0..1]",
                                                                    ("qkvb[0]", "qkvb[1]"))]
    assert "gradient of qkvb only, in 2 layers (0..1) (backward kernel of qkv, Linear)" in v.findings[0].line
    worst = v.ranked()[0]
    assert worst.name in ("qkvb[0]", "qkvb[1]") and worst.rel > 0.5 and worst.cosine < 0.5
    assert max(d.rel for d in v.forward) == 0.0  # the forward is untouched


def test_layernorm_gradient_term_is_named_as_that_layernorm(reference, gpt2_tiny, token_ids):
    config, tensors = gpt2_tiny
    v = verdict_against(reference, gpt2_with(tensors, config, ln_2=1), token_ids)
    assert [(f.kind, f.where) for f in v.findings] == [(BACKWARD_INPUT, "ln2[1]")]
    assert "(LayerNorm)" in v.findings[0].line
    by_name = {d.name: d for d in v.grads}
    assert by_name["ln2w[1]"].rel == 0.0 and by_name["fcw[1]"].rel == 0.0  # downstream of it: untouched
    assert by_name["attprojb[1]"].rel > 1e-5 and by_name["wpe"].rel > 1e-5  # upstream: all moved


def test_broken_tie_is_named_as_tied_weights_not_tied(reference, gpt2_tiny, token_ids):
    config, tensors = gpt2_tiny
    v = verdict_against(reference, UntiedGPT2.from_llmc(tensors, config), token_ids)
    assert [(f.kind, f.where) for f in v.findings] == [(TIE, "wte")]
    assert "embedding lookup's alone" in v.findings[0].line


def test_forward_defect_is_named_at_its_module(reference, gpt2_tiny, token_ids):
    config, tensors = gpt2_tiny
    model = GPT2.from_llmc(tensors, config)
    model.h[1].mlp.c_fc.register_forward_hook(lambda m, a, out: out * (1 + 1e-3))
    v = verdict_against(reference, model, token_ids)
    assert v.findings[0].kind == FORWARD and v.findings[0].where == "mlp[1]"
    assert v.first_diverging_module == "mlp[1]"


def test_with_adam_updates_only_the_output_gradients_still_name_the_layernorm(reference, gpt2_tiny, token_ids):
    """An Adam family on a framework that only saves weights (InfiniTrain's llama3): what it shows
    of each gradient is Adam's first update g/(|g| + eps), which a 1e-3 relative LayerNorm term
    hardly moves; the gradients arriving at the module outputs (its --precision_check dumps)
    locate it by magnitude."""
    config, tensors = gpt2_tiny
    case = CaseSpec.from_dict(reference.meta["case"])
    test = capture_reference(gpt2_with(tensors, config, ln_2=1), case, token_ids, framework="test")
    test.grads = {n: adam_first_update(g, 1e-8).astype(np.float32) for n, g in test.grads.items()}
    test.grad_kind = GRAD_ADAM_UPDATE
    v = diagnose_captures(reference, test, case, adam_eps=1e-8)
    assert v.first_diverging_module is None and v.first_diverging_output_grad == "attproj[1]"
    assert [(f.kind, f.where) for f in v.findings if f.kind == BACKWARD_INPUT] == [(BACKWARD_INPUT, "ln2[1]")]
    by_name = {d.name: d for d in v.output_grads}
    assert by_name["mlp[1]"].rel == 0.0 and by_name["ln2[1]"].rel == 0.0  # after the defect, in backward order
    assert by_name["attproj[1]"].rel > 1e-5 and by_name["embedding"].rel > 1e-5


def test_output_gradients_of_an_identical_pair_agree_exactly(reference, gpt2_tiny, token_ids):
    config, tensors = gpt2_tiny
    v = verdict_against(reference, GPT2.from_llmc(tensors, config), token_ids)
    assert [d.name for d in v.output_grads][:3] == ["logits", "lnf", "block[1]"] and v.output_grads[-1].name == "embedding"
    assert max(d.rel for d in v.output_grads) == 0.0 and v.first_diverging_output_grad is None


DEFECTS = {
    "identical": (lambda t, c: GPT2.from_llmc(t, c), []),
    "transposed qkv bias gradient": (lambda t, c: gpt2_with(t, c, c_attn=True), [(GRADIENT_ONLY, "qkvb[0..1]")]),
    "LayerNorm input-gradient term": (lambda t, c: gpt2_with(t, c, ln_2=1), [(BACKWARD_INPUT, "ln2[1]")]),
    "tie lost": (lambda t, c: UntiedGPT2.from_llmc(t, c), [(TIE, "wte")]),
    "forward of one MLP": (lambda t, c: mlp_scaled(GPT2.from_llmc(t, c)), [(FORWARD, "mlp[1]"), ("downstream of the forward difference", "mlp[1]")]),
}


def mlp_scaled(model):
    model.h[1].mlp.c_fc.register_forward_hook(lambda m, a, out: out * (1 + 1e-3))
    return model


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_the_certificates_sketches_name_what_whole_tensors_name(defect, gpt2_tiny, token_ids, gpt2_case, tmp_path):
    """`lockstep run` keeps only sketches of step 1 (a few MB whatever the model): they must reach
    the same findings as diagnose's whole tensors, and hold for an identical pair."""
    config, tensors = gpt2_tiny
    make, expected = DEFECTS[defect]
    case = gpt2_case()
    ref = sketched(GPT2.from_llmc(tensors, config), case, token_ids, tmp_path, "pytorch")
    test = sketched(make(tensors, config), case, token_ids, tmp_path, "test")
    assert not ref.grads and ref.sketch("grad", "qkvw[0]") is not None  # sketches only
    cert = certify(ref, test, case)
    assert [(f.kind, f.where) for f in cert.findings] == expected, [f.line for f in cert.findings]
    assert cert.holds == (not expected)
    if not expected:
        assert cert.worst["gradients"].rel == 0.0 and cert.worst["module outputs"].rel == 0.0
        assert cert.compared == {"module outputs": 3 + 6 * config.num_layers + 1, "later micro batches": 0,
                                 "output gradients": 3 + 6 * config.num_layers, "gradients": 28}


def test_a_certificate_names_its_step_and_refuses_captures_of_two_steps(gpt2_tiny, token_ids, gpt2_case, tmp_path):
    """A resumed case's certificate is of the step after its resume point: it says which step, and
    two captures of different steps (a step-1 capture against a step-31 one) are no certificate."""
    config, tensors = gpt2_tiny
    case = gpt2_case()
    ref = sketched(GPT2.from_llmc(tensors, config), case, token_ids, tmp_path, "pytorch")
    test = sketched(GPT2.from_llmc(tensors, config), case, token_ids, tmp_path, "test")
    assert certify(ref, test, case).summary_line().startswith("step 1 agrees from inside")
    # The same tensors, said to be step 31 on both sides (start_step 30): the line says step 31.
    for capture in (ref, test):
        capture.meta["request"] = {**capture.meta["request"], "start_step": 30}
    cert = certify(ref, test, case)
    assert cert.holds and cert.step == 31 and cert.summary_line().startswith("step 31 agrees from inside")
    from lockstep.certify.certificate import Certificate

    assert Certificate.from_json(cert.to_json()).step == 31
    # Planted negative control: the reference's capture of step 1 against the test's of step 31.
    ref.meta["request"] = {**ref.meta["request"], "start_step": 0}
    with pytest.raises(ValueError, match="the pytorch capture is of step 1, the test capture of step 31"):
        certify(ref, test, case)
