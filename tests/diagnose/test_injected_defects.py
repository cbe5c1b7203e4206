"""Defects built into the reference GPT-2 (test-only subclasses; the source is never edited) must
be named as exactly that tensor or module, with the right classification."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lockstep.diagnose.classify import BACKWARD_INPUT, FORWARD, GRADIENT_ONLY, TIE
from lockstep.diagnose.reference_capture import capture_reference
from lockstep.diagnose.verdict import diagnose_captures
from lockstep.models.gpt2.model import GPT2, LN_EPS


class TransposedBiasGrad(torch.autograd.Function):
    """y = x W^T + b, whose bias gradient reduces the (rows x out) gradient read as (out x rows),
    the way InfiniTrain's CUDA linear.cu did for c_attn / c_fc."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        rows, out = g2.shape
        wrong = g2.contiguous().view(-1).view(out, rows).sum(dim=1)  # the same memory read transposed
        return g @ weight, g2.t() @ x.reshape(-1, x.shape[-1]), wrong


class BiasGradTransposedLinear(nn.Linear):
    def forward(self, x):
        return TransposedBiasGrad.apply(x, self.weight, self.bias)


class LayerNormExtraTerm(torch.autograd.Function):
    """LayerNorm whose input gradient has a spurious `- mean(dy*w) * mean(x) * rstd` term
    (InfiniTrain's CUDA layernorm.cu at b24d92f)."""

    @staticmethod
    def forward(ctx, x, w, b):
        with torch.enable_grad():
            xd = x.detach().requires_grad_()
            y = F.layer_norm(xd, (x.shape[-1],), w.detach(), b.detach(), LN_EPS)
        ctx.save_for_backward(x, w, b)
        return y.detach()

    @staticmethod
    def backward(ctx, dy):
        x, w, b = ctx.saved_tensors
        with torch.enable_grad():
            xd, wd, bd = (t.detach().requires_grad_() for t in (x, w, b))
            y = F.layer_norm(xd, (x.shape[-1],), wd, bd, LN_EPS)
            dx, dw, db = torch.autograd.grad(y, (xd, wd, bd), dy)
        mean = x.mean(-1, keepdim=True)
        rstd = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + LN_EPS)
        mean_d = (dy * w).mean(-1, keepdim=True)
        return dx - mean_d * mean * rstd, dw, db


class ExtraTermLayerNorm(nn.LayerNorm):
    def forward(self, x):
        return LayerNormExtraTerm.apply(x, self.weight, self.bias)


def gpt2_with(tensors, config, **swap):
    model = GPT2.from_llmc(tensors, config)
    for i, blk in enumerate(model.h):
        if "c_attn" in swap:
            new = BiasGradTransposedLinear(config.channels, 3 * config.channels)
            new.load_state_dict(blk.attn.c_attn.state_dict())
            blk.attn.c_attn = new
        if "ln_2" in swap and i == swap["ln_2"]:
            new = ExtraTermLayerNorm(config.channels, eps=LN_EPS)
            new.load_state_dict(blk.ln_2.state_dict())
            blk.ln_2 = new
    return model


class UntiedGPT2(GPT2):
    """GPT-2 whose output head reads its own copy of wte: the tie broken."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.lm_head_weight = nn.Parameter(torch.empty(cfg.padded_vocab_size, cfg.channels))

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.lm_head_weight[: self.cfg.vocab_size].t(), None

    @classmethod
    def from_llmc(cls, tensors, cfg):
        model = super().from_llmc(tensors, cfg)
        with torch.no_grad():
            model.lm_head_weight.copy_(model.wte.weight)
        return model


@pytest.fixture(scope="module")
def reference(gpt2_tiny, token_ids, gpt2_case):
    config, tensors = gpt2_tiny
    return capture_reference(GPT2.from_llmc(tensors, config), gpt2_case(), token_ids)


def verdict_against(reference, model, token_ids):
    case = reference.meta["case"]
    from lockstep.cases.spec import CaseSpec

    case = CaseSpec.from_dict(case)
    return diagnose_captures(reference, capture_reference(model, case, token_ids, framework="test"), case)


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


def test_with_adam_signs_only_the_output_gradients_still_name_the_layernorm(reference, gpt2_tiny, token_ids):
    """An Adam family on a framework that only saves weights (InfiniTrain's llama3): its parameter
    gradients are signs, which a 1e-3 relative LayerNorm term does not flip; the gradients arriving
    at the module outputs (its --precision_check dumps) locate it by magnitude."""
    from lockstep.cases.spec import CaseSpec
    from lockstep.diagnose.capture import GRAD_ADAM_SIGN

    config, tensors = gpt2_tiny
    case = CaseSpec.from_dict(reference.meta["case"])
    test = capture_reference(gpt2_with(tensors, config, ln_2=1), case, token_ids, framework="test")
    test.grads = {n: np.sign(g) for n, g in test.grads.items()}
    test.grad_kind = GRAD_ADAM_SIGN
    v = diagnose_captures(reference, test, case)
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
