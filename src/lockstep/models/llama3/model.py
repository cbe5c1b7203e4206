"""The reference Llama 3, readable top to bottom (llm.c's train_llama3.py semantics).

RMSNorm `x * rsqrt(mean(x^2) + eps) * w`, RoPE on *interleaved* pairs (dims 2i, 2i+1 of a
head; theta from the header, no scaling), grouped-query attention (each kv head serves NH/kv
query heads, repeat_interleave), causal softmax in FP32 scaled by 1/sqrt(hd), SwiGLU MLP
`down(up(x) * silu(gate(x)))`, no biases, untied output head, no dropout.

RoPE's frequencies and angles are computed in FP32 exactly as megatron-core and llm.c do
(`1 / theta ** (arange(0, hd, 2) / hd)`, outer product with the positions), so that the
reference and the frameworks rotate by the same FP32 angles.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from lockstep.models.llama3.config import Llama3Config
from lockstep.models.reference import load_llmc


def rope_angles(head_dim: int, seq_len: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation of pair i at position t, (T, hd/2), FP32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
    return angles.cos(), angles.sin()


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (2i, 2i+1) of every head: x is (B, T, H, hd), cos/sin (T, hd/2)."""
    cos, sin = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q (B, T, NH, hd), k/v (B, T, kv, hd) -> (B, T, NH*hd); GQA by repeat_interleave, softmax in FP32."""
    B, T, NH, hd = q.shape
    group = NH // k.shape[2]
    q, k, v = q.transpose(1, 2), k.repeat_interleave(group, dim=2).transpose(1, 2), v.repeat_interleave(group, dim=2).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = att.masked_fill(~causal, float("-inf"))
    att = F.softmax(att.float(), dim=-1).to(v.dtype)
    return (att @ v).transpose(1, 2).reshape(B, T, NH * hd)


class Attention(nn.Module):
    def __init__(self, cfg: Llama3Config):
        super().__init__()
        self.n_head, self.n_kv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.c_attn = nn.Linear(cfg.channels, cfg.qkv_rows, bias=False)  # rows [Q; K; V] as in LLMC
        self.c_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.channels, bias=False)
        # The attention kernel, same signature in every family; the pytorch-fast runner swaps in SDPA.
        self.attention_kernel = causal_attention

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split([self.n_head * self.hd, self.n_kv * self.hd, self.n_kv * self.hd], dim=-1)
        q = rope_interleaved(q.view(B, T, self.n_head, self.hd), cos, sin)
        k = rope_interleaved(k.view(B, T, self.n_kv, self.hd), cos, sin)
        return self.c_proj(self.attention_kernel(q, k, v.view(B, T, self.n_kv, self.hd)))


class SwiGLU(nn.Module):
    def __init__(self, channels: int, hidden: int):
        super().__init__()
        self.c_fc = nn.Linear(channels, hidden, bias=False)  # up
        self.c_fc2 = nn.Linear(channels, hidden, bias=False)  # gate
        self.c_proj = nn.Linear(hidden, channels, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.c_fc(x) * F.silu(self.c_fc2(x)))


class Block(nn.Module):
    def __init__(self, cfg: Llama3Config):
        super().__init__()
        self.ln_1 = RMSNorm(cfg.channels, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ln_2 = RMSNorm(cfg.channels, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.channels, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class Llama3(nn.Module):
    block_type = Block  # Qwen3 (models/qwen3/model.py) differs only in its blocks

    def __init__(self, cfg: Llama3Config):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.channels)
        self.h = nn.ModuleList(self.block_type(cfg) for _ in range(cfg.num_layers))
        self.ln_f = RMSNorm(cfg.channels, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.channels, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        cos, sin = rope_angles(self.cfg.head_dim, idx.shape[1], self.cfg.rope_theta, idx.device)
        x = self.wte(idx)
        for block in self.h:
            x = block(x, cos, sin)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    def llmc_parameters(self) -> dict[str, nn.Parameter]:
        """Every parameter under its canonical LLMC name (`qkvw[3]`): the map both ways."""
        out = {"wte": self.wte.weight}
        for i, blk in enumerate(self.h):
            out |= {f"ln1w[{i}]": blk.ln_1.weight, f"qkvw[{i}]": blk.attn.c_attn.weight,
                    f"attprojw[{i}]": blk.attn.c_proj.weight, f"ln2w[{i}]": blk.ln_2.weight,
                    f"fcw[{i}]": blk.mlp.c_fc.weight, f"fcw2[{i}]": blk.mlp.c_fc2.weight,
                    f"fcprojw[{i}]": blk.mlp.c_proj.weight}
        return out | {"lnfw": self.ln_f.weight, "lm_head": self.lm_head.weight}

    @classmethod
    def from_llmc(cls, tensors: dict, cfg: Llama3Config) -> "Llama3":
        return load_llmc(cls(cfg), tensors, cfg)
