"""The reference Qwen3, readable top to bottom: Llama 3 (models/llama3/model.py) plus two things.

- QK-norm: an RMSNorm over head_dim on every head of q and of k (its own weights per layer),
  before RoPE.
- RoPE on *half-split* pairs (dims i and i + hd/2 of a head; HF's `rotate_half`, megatron's
  `rotary_interleaved=False`), theta 1e6.
The rest is Llama 3's: RMSNorm, GQA with FP32 softmax, SwiGLU, no biases, untied head. The
header's eps serves every norm.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from lockstep.models.llama3.model import Llama3, RMSNorm, SwiGLU, causal_attention
from lockstep.models.qwen3.config import Qwen3Config


def rope_half_split(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + hd/2) of every head: x is (B, T, H, hd), cos/sin (T, hd/2)."""
    cos = torch.cat((cos, cos), dim=-1)[None, :, None, :].to(x.dtype)
    sin = torch.cat((sin, sin), dim=-1)[None, :, None, :].to(x.dtype)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.n_head, self.n_kv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.c_attn = nn.Linear(cfg.channels, cfg.qkv_rows, bias=False)  # rows [Q; K; V] as in LLMC
        # QK-norm weights as the file stores them: row 0 normalises q's heads, row 1 k's.
        self.qk_norm = nn.Parameter(torch.ones(2, cfg.head_dim))
        self.eps = cfg.norm_eps
        self.c_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.channels, bias=False)
        # The attention kernel, same signature in every family; the pytorch-fast runner swaps in SDPA.
        self.attention_kernel = causal_attention

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split([self.n_head * self.hd, self.n_kv * self.hd, self.n_kv * self.hd], dim=-1)
        q = F.rms_norm(q.view(B, T, self.n_head, self.hd), (self.hd,), self.qk_norm[0], self.eps)
        k = F.rms_norm(k.view(B, T, self.n_kv, self.hd), (self.hd,), self.qk_norm[1], self.eps)
        q, k = rope_half_split(q, cos, sin), rope_half_split(k, cos, sin)
        return self.c_proj(self.attention_kernel(q, k, v.view(B, T, self.n_kv, self.hd)))


class Block(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.ln_1 = RMSNorm(cfg.channels, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ln_2 = RMSNorm(cfg.channels, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.channels, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class Qwen3(Llama3):
    """Llama 3's embedding, final norm and untied head around Qwen3's blocks."""

    block_type = Block

    def llmc_parameters(self) -> dict[str, nn.Parameter]:
        """Llama 3's canonical map plus each layer's (2, hd) QK-norm weights."""
        out = super().llmc_parameters()
        for i, blk in enumerate(self.h):
            out[f"qknormw[{i}]"] = blk.attn.qk_norm
        return out
