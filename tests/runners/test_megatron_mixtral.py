"""Mixtral (MoE) on megatron-core against the pytorch reference, on the CPU (gloo), and the
certificate's routing findings.

A small Mixtral (L2 NH4 C32, 8 experts, top-2, F48, V256; the router spread to N(0, 0.5) so that
tokens really choose) trains 3 FP32 steps at the contract's lr on both frameworks: EP=1, EP=2 (two
ranks that are also the attention's two DP ranks, against the reference's DP=2) and TP=2 with
sequence parallelism (kv heads 2, against the reference's one process): every step's loss within
1e-5 and a step-1 certificate that holds over every module output, every expert's gradients, each
token's chosen experts, the routing weights and each layer's aux loss.

Negative controls (tests/support/defects.py), each a named finding of the certificate:
a router that does not renormalise over the k chosen (routing weights differ), ties broken towards
the higher expert index (tokens routed differently, on a checkpoint whose layer-0 router is zero so
that every logit ties), an aux loss scaled by 2 (aux loss differs), expert 3's gradients scaled by
1.1 in the reference and in megatron's workers (gradients of expert 3 only), and EP=2 with
expert parallelism missing from megatron's TransformerConfig (every expert's gradients, while the
loss stays within the threshold).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lockstep.capture.request import CAPTURE_ROWS, CaptureRequest
from lockstep.cases.spec import CaseSpec
from lockstep.certify.certificate import certify
from lockstep.certify.classify import FORWARD, GRADIENT_ONLY
from lockstep.certify.routing import AUX_LOSS, ROUTED, ROUTING_WEIGHTS
from lockstep.formats.step_capture import StepCapture
from lockstep.formats.tokens import write_token_stream
from lockstep.models import FAMILIES, SHAPES
from lockstep.models.init import init_tensors
from lockstep.models.mixtral.config import MixtralConfig
from lockstep.runners.base import RunInputs
from lockstep.runners.megatron import MegatronRunner
from lockstep.runners.pytorch import PyTorchRunner
from support import defects

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

pytest.importorskip("megatron.core")

FP32_TOLERANCE = 1e-5
STEPS = 3
SMALL = MixtralConfig(max_seq_len=128, vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=1, channels=32,
                      num_experts=8, router_topk=2, moe_ffn_hidden_size=48)
FAMILY = FAMILIES["mixtral"]


def case(name: str, **layout) -> CaseSpec:
    total = 256 * layout.get("dp", 1)
    return CaseSpec(name=name, model="mixtral-tiny", dtype="float32", micro_batch=4, seq_len=64, total_batch=total,
                    steps=STEPS, lr=1e-4, **layout)


def write_model(path, config: MixtralConfig, zero_router: int | None = None):
    tensors = {k: np.array(v) for k, v in init_tensors(config, FAMILY.init_rule(config), 42).items()}
    rng = np.random.default_rng(7)
    for layer in range(config.num_layers):  # the init's 0.02 router routes nearly uniformly; spread it
        name = f"routerw[{layer}]"
        tensors[name] = (np.zeros_like(tensors[name]) if layer == zero_router
                         else rng.normal(0.0, 0.5, tensors[name].shape).astype(np.float32))
    FAMILY.write(path, config, tensors)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixtral")
    write_token_stream(d / "tokens.bin", np.random.default_rng(5).integers(0, 256, size=8_000), kind="llama3",
                       vocab_size=256)
    return {"tokens": d / "tokens.bin", "kv1": write_model(d / "kv1.bin", SMALL),
            "kv2": write_model(d / "kv2.bin", dataclasses.replace(SMALL, num_kv_heads=2)),
            "tied": write_model(d / "tied.bin", SMALL, zero_router=0)}


def inputs_for(files, model: str, out, framework: str, c: CaseSpec) -> RunInputs:
    config = FAMILY.load(files[model]).config
    request = CaptureRequest(path=str(out / f"{framework}_{c.name}.npz"), rows=CAPTURE_ROWS)
    return RunInputs(checkpoint=files[model], tokens=files["tokens"], model=config, device="cpu", model_name=model,
                     capture=request)


@pytest.fixture(scope="module")
def runs(files, tmp_path_factory, worker_pool):
    """(layout) -> (megatron record, pytorch record, megatron capture, pytorch capture), each run once."""
    out = tmp_path_factory.mktemp("runs")
    made = {}
    layouts = {"ep1": ("kv1", case("mixtral_1"), case("mixtral_1")),
               "ep2": ("kv1", case("mixtral_ep2", dp=2, ep=2), case("mixtral_dp2", dp=2)),
               "tp2": ("kv2", case("mixtral_tp2", tp=2, sp=True), case("mixtral_1"))}

    def get(layout: str):
        if layout not in made:
            model, mega_case, ref_case = layouts[layout]
            d = out / layout
            mega_in, ref_in = (inputs_for(files, model, d, fw, c) for fw, c in (("megatron", mega_case),
                                                                                ("pytorch", ref_case)))
            mega = worker_pool.run(MegatronRunner(), mega_case, mega_in, d)
            ref = worker_pool.run(PyTorchRunner(), ref_case, ref_in, d)
            assert mega.ok, mega.error
            assert ref.ok, ref.error
            made[layout] = (mega, ref, StepCapture.load(mega_in.capture.path), StepCapture.load(ref_in.capture.path),
                            ref_case)
        return made[layout]

    return get


@pytest.mark.parametrize("layout", ["ep1", pytest.param("ep2", marks=pytest.mark.slow), "tp2"])  # ep2: 65 s
def test_megatron_moe_matches_pytorch_with_a_certificate(runs, layout):
    mega, ref, mega_cap, ref_cap, ref_case = runs(layout)
    dloss = max(abs(a - b) for a, b in zip(mega.losses(), ref.losses()))
    cert = certify(ref_cap, mega_cap, ref_case)
    print(f"{layout}: max |dloss| {dloss:.3e} over {STEPS} steps; {cert.summary_line()}")
    assert len(mega.losses()) == STEPS and dloss < FP32_TOLERANCE
    assert mega.meta["ep"] == (2 if layout == "ep2" else 1) and mega.meta["tp"] == (2 if layout == "tp2" else 1)
    assert cert.holds, cert.summary_line()
    # every expert's three matrices in both layers among the 61 gradients; 2 layers x 256 tokens routed
    assert cert.compared["gradients"] == 61 and cert.compared["routed tokens"] == 512
    assert cert.compared["aux losses"] == 2 and "router[1]" in mega_cap.forward_order
    assert np.array_equal(mega_cap.routing["experts[1]"], ref_cap.routing["experts[1]"])
    assert len(np.unique(ref_cap.routing["experts[0]"])) == 8  # every expert serves some token


def reference_capture(files, model: str, c: CaseSpec, tmp_path, name: str) -> StepCapture:
    inputs = inputs_for(files, model, tmp_path, name, c)
    return PyTorchRunner().capture(c, inputs, tmp_path / "work", inputs.capture)


@pytest.mark.parametrize("defect,kind,where", [
    ("mixtral_router_unrenormalised", ROUTING_WEIGHTS, "weights[0]"),
    ("mixtral_aux_loss_doubled", AUX_LOSS, "aux_loss[0]"),
    ("mixtral_expert3_grad_scaled", GRADIENT_ONLY, "expert3"),
])
def test_a_reference_defect_is_its_named_finding(runs, files, tmp_path, monkeypatch, defect, kind, where):
    """The reference with the defect against the clean megatron capture of the same step."""
    _, _, mega_cap, _, ref_case = runs("ep1")
    defects.inject(defect, monkeypatch)
    cert = certify(reference_capture(files, "kv1", ref_case, tmp_path, defect), mega_cap, ref_case)
    print(f"{defect}: {cert.summary_line()}")
    assert not cert.holds and (cert.cause.kind, cert.cause.where) == (kind, where)
    if defect == "mixtral_expert3_grad_scaled":
        assert "gradients of expert 3 only: its fcprojw, fcw, fcw2 in layers 0, 1" in cert.cause.line
        assert len(cert.cause.tensors) == 6 and [f.kind for f in cert.findings] == [GRADIENT_ONLY]
    if defect == "mixtral_aux_loss_doubled":
        assert "(x0.5)" in cert.cause.line and {f.kind for f in cert.findings} == {AUX_LOSS}
    if defect == "mixtral_router_unrenormalised":
        assert cert.cause.line.startswith("routing weights differ in layer 0 (relative ")
        assert "while every token's experts and the router logits (relative " in cert.cause.line
        assert FORWARD in {f.kind for f in cert.findings}  # the block's output, downstream of the weights


def test_ties_broken_the_other_way_are_tokens_routed_differently(files, tmp_path, monkeypatch):
    """Layer 0's router is zero: every logit ties. The contract sends every token to experts 0 and 1;
    ties to the higher index send it to 7 and 6, and the certificate says so, token by token."""
    c = case("mixtral_1")
    clean = reference_capture(files, "tied", c, tmp_path, "clean")
    assert (np.asarray(clean.routing["experts[0]"]) == [0, 1]).all()
    defects.inject("mixtral_ties_to_higher_index", monkeypatch)
    flipped = reference_capture(files, "tied", c, tmp_path, "flipped")
    cert = certify(clean, flipped, c)
    print(cert.summary_line())
    assert (cert.cause.kind, cert.cause.where) == (ROUTED, "experts[0]")
    assert cert.cause.line.startswith("tokens routed differently: 256 of 256 tokens in layer 0 go to other experts "
                                      "(sequence 0 positions 0, 1, 2, 3, 4, 5; ...; the first: reference experts 0, 1, "
                                      "test 7, 6) while the router logits agree (relative 0.0e+00): the top-k rule or "
                                      "its tie-break differs")


def test_one_expert_gradient_scaled_in_megatron_is_named(files, runs, tmp_path, monkeypatch):
    """Planted in megatron's workers (a process of its own): its local expert 3 at EP=1."""
    _, _, _, ref_cap, ref_case = runs("ep1")
    defects.worker_env("megatron_expert3_grad_scaled", monkeypatch)
    inputs = inputs_for(files, "kv1", tmp_path, "megatron", ref_case)
    rec = MegatronRunner().run(dataclasses.replace(ref_case, steps=1), inputs, tmp_path)
    assert rec.ok, rec.error
    cert = certify(ref_cap, StepCapture.load(inputs.capture.path), ref_case)
    print(cert.summary_line())
    assert (cert.cause.kind, cert.cause.where) == (GRADIENT_ONLY, "expert3") and len(cert.findings) == 1


def test_ep2_without_expert_parallelism_in_the_config_fails_only_from_inside(files, runs, tmp_path, monkeypatch):
    """Expert parameters all-reduced over the EP ranks as if replicated: the loss stays within the
    threshold for these steps, the certificate names every expert's gradients."""
    _, ref, _, ref_cap, ref_case = runs("ep2")
    defects.worker_env("megatron_ep_not_in_config", monkeypatch)
    c = case("mixtral_ep2", dp=2, ep=2)
    inputs = inputs_for(files, "kv1", tmp_path, "megatron", c)
    rec = MegatronRunner().run(c, inputs, tmp_path)
    assert rec.ok, rec.error
    dloss = max(abs(a - b) for a, b in zip(rec.losses(), ref.losses()))
    cert = certify(ref_cap, StepCapture.load(inputs.capture.path), ref_case)
    print(f"max |dloss| {dloss:.3e}; {cert.summary_line()[:300]}")
    assert dloss < FP32_TOLERANCE and not cert.holds
    assert [(f.kind, f.where) for f in cert.findings] == [(GRADIENT_ONLY, "experts")]
    assert cert.cause.line.startswith("gradients of all 8 experts only: their fcprojw, fcw, fcw2 in layers 0, 1 differ")
    assert set(cert.cause.tensors) == {f"expert{e}.{r}[{l}]" for e in range(8) for r in ("fcw2", "fcw", "fcprojw")
                                       for l in (0, 1)}


def test_layouts_megatron_refuses_say_why():
    from lockstep.runners.megatron.families import adapter_of

    mixtral, llama = adapter_of("mixtral"), adapter_of("llama3")
    kv2 = dataclasses.replace(SMALL, num_kv_heads=2)
    assert mixtral.layout_problem(case("c", tp=2), kv2) == ("megatron-core's MoE layer trains with TP > 1 only with "
                                                           "sequence parallelism (sp = true)")
    assert mixtral.layout_problem(case("c", tp=2, sp=True), SMALL) == ("TP=2 does not divide the model's 1 kv heads "
                                                                      "(query groups)")
    assert mixtral.layout_problem(case("c", dp=4, ep=4), dataclasses.replace(SMALL, num_experts=6)) == (
        "EP=4 does not divide the model's 6 experts")
    assert llama.layout_problem(case("c", dp=2, ep=2), SHAPES["llama3-tiny"].config) == (
        "expert parallelism (EP=2) needs a mixture-of-experts model")
    assert mixtral.layout_problem(case("c", dp=2, ep=2), SMALL) is None
    assert case("c", dp=2, ep=2).parallel_label == "DP=2 EP=2"


def test_router_gating_backward_runs_under_the_forward_s_autocast():
    """BF16 autocast MoE cases failed in megatron-core's router gating backward ("expected mat1 and
    mat2 to have the same dtype", measured on an H200): its custom autograd function's backward ran
    outside autocast. Patched, the gating's forward and backward are bitwise an autocast linear's
    (here on the CPU's autocast; the CUDA one takes the same path), and FP32 is untouched."""
    import torch
    from megatron.core.transformer.moe import moe_utils

    from lockstep.runners.megatron.families.mixtral import autocast_aware_router_gating

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    function = moe_utils.RouterGatingLinearFunction
    saved = function.forward, function.backward, getattr(function, "_lockstep_autocast_aware", False)
    try:
        function.forward, function.backward = staticmethod(saved[0]), staticmethod(saved[1])
        function._lockstep_autocast_aware = saved[2]
        gen = torch.Generator().manual_seed(0)
        x0, w0 = torch.randn(6, 8, generator=gen), torch.randn(4, 8, generator=gen)

        def gating(linear):
            x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = linear(x, w)
            out.float().square().sum().backward()
            return out, x.grad, w.grad

        megatron_gating = lambda x, w: moe_utils.router_gating_linear(x, w, None, x.dtype)  # noqa: E731
        if not saved[2]:  # megatron-core as it comes: the backward's dtype error
            with pytest.raises(RuntimeError, match="same dtype"):
                gating(megatron_gating)
        autocast_aware_router_gating(function)
        autocast_aware_router_gating(function)  # idempotent
        ours, expected = gating(megatron_gating), gating(torch.nn.functional.linear)
        assert ours[0].dtype == torch.bfloat16
        for a, b in zip(ours, expected):
            assert torch.equal(a, b)
        x = x0.clone().requires_grad_()
        moe_utils.router_gating_linear(x, w0, None, x.dtype).sum().backward()
        assert x.grad.dtype == torch.float32
    finally:
        function.forward, function.backward = staticmethod(saved[0]), staticmethod(saved[1])
        function._lockstep_autocast_aware = saved[2]
