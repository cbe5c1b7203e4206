"""The reference GPT-2, readable top to bottom (llm.c / nanoGPT semantics).

tanh GELU, LayerNorm eps 1e-5, causal attention scaled by 1/sqrt(hd) with the softmax in
FP32, tied wte/lm_head, no dropout. The embedding keeps llm.c's padded vocab Vp so the
checkpoint maps 1:1, but only the first V logits exist: padded rows never get a gradient.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from lockstep.models.reference import load_llmc
from lockstep.models.gpt2.config import GPT2Config

LN_EPS = 1e-5


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q, k, v (B, T, NH, hd) -> (B, T, NH*hd): scores scaled by 1/sqrt(hd), causal mask, softmax in FP32."""
    B, T, NH, hd = q.shape
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = att.masked_fill(~causal, float("-inf"))
    # Softmax in FP32 even under bf16 autocast (the contract; Megatron's attention_softmax_in_fp32).
    att = F.softmax(att.float(), dim=-1).to(v.dtype)
    return (att @ v).transpose(1, 2).contiguous().view(B, T, NH * hd)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.n_head = cfg.num_heads
        self.c_attn = nn.Linear(cfg.channels, 3 * cfg.channels)  # rows: [Q all heads; K; V] as in LLMC
        self.c_proj = nn.Linear(cfg.channels, cfg.channels)
        # The attention kernel, same signature in every family; the pytorch-fast runner swaps in SDPA.
        self.attention_kernel = causal_attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        y = self.attention_kernel(q.view(B, T, self.n_head, hd), k.view(B, T, self.n_head, hd),
                                  v.view(B, T, self.n_head, hd))
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(cfg.channels, 4 * cfg.channels)
        self.c_proj = nn.Linear(4 * cfg.channels, cfg.channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.channels, eps=LN_EPS)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.channels, eps=LN_EPS)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.channels)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.channels)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.channels, eps=LN_EPS)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        # Tied head over the real vocabulary only: logits V..Vp-1 do not exist.
        logits = x @ self.wte.weight[: self.cfg.vocab_size].t()
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def llmc_parameters(self) -> dict[str, nn.Parameter]:
        """Every parameter under its canonical LLMC name (`qkvw[3]`): the map both ways."""
        out = {"wte": self.wte.weight, "wpe": self.wpe.weight}
        for i, blk in enumerate(self.h):
            out |= {f"ln1w[{i}]": blk.ln_1.weight, f"ln1b[{i}]": blk.ln_1.bias,
                    f"qkvw[{i}]": blk.attn.c_attn.weight, f"qkvb[{i}]": blk.attn.c_attn.bias,
                    f"attprojw[{i}]": blk.attn.c_proj.weight, f"attprojb[{i}]": blk.attn.c_proj.bias,
                    f"ln2w[{i}]": blk.ln_2.weight, f"ln2b[{i}]": blk.ln_2.bias,
                    f"fcw[{i}]": blk.mlp.c_fc.weight, f"fcb[{i}]": blk.mlp.c_fc.bias,
                    f"fcprojw[{i}]": blk.mlp.c_proj.weight, f"fcprojb[{i}]": blk.mlp.c_proj.bias}
        return out | {"lnfw": self.ln_f.weight, "lnfb": self.ln_f.bias}

    @classmethod
    def from_llmc(cls, tensors: dict, cfg: GPT2Config) -> "GPT2":
        """Build the model with the LLMC checkpoint's weights (fp32)."""
        return load_llmc(cls(cfg), tensors, cfg)
