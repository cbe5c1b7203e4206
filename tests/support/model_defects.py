"""Defects built into the reference GPT-2 (test-only subclasses; the source is never edited), for
the step-1 tests that must name them: certify/, and the runners' captures."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

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
