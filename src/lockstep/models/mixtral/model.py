"""The reference Mixtral, readable top to bottom (docs/reference/mixtral.md).

Llama 3's attention (models/llama3/model.py: RMSNorm, RoPE on interleaved pairs, GQA, FP32
softmax, no biases) with a sparse mixture of SwiGLU experts in place of the dense MLP, and an
untied head. Each layer's MoE block, for the B*T tokens flattened:

1. router logits `h @ routerw.T`, (N, E), FP32, no bias;
2. top-k on the *logits* (InfiniTrain's and megatron-core's `router_pre_softmax=False`); among
   equal logits the lower expert index wins (a stable descending sort);
3. routing weights = softmax over the k chosen logits: the renormalised top-k of the full
   softmax, the same numbers as Mixtral's softmax-topk-divide-by-sum; no scaling factor;
4. every token goes to its k experts (no capacity, nothing dropped); expert e's SwiGLU
   `down(up(x) * silu(gate(x)))` runs on its tokens in token order, experts in index order,
   and each token's output is the weighted sum of its experts' outputs.

The load-balancing loss is megatron-core's `switch_load_balancing_loss_func` per layer and
micro batch, summed over layers; the contract's coefficient (`AUX_LOSS_COEFF`) is 0, as
InfiniTrain's tiny_mixtral trains (it has no aux loss), so the training loss is the CE alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from lockstep.models.llama3.model import Attention, RMSNorm, SwiGLU, rope_angles
from lockstep.models.mixtral.config import EXPERT_ROLES, MixtralConfig, expert_tensor
from lockstep.models.reference import load_llmc

# The coefficient of the load-balancing loss in the training loss: 0 (tiny_mixtral has none;
# megatron-core is run with moe_aux_loss_coeff=0). Change it only with the contract.
AUX_LOSS_COEFF = 0.0


@dataclass
class Routing:
    """One layer's router decisions for its N = B*T tokens (row n is token n of the flattened batch)."""

    logits: torch.Tensor  # (N, E) router logits
    experts: torch.Tensor  # (N, k) chosen experts, highest logit first
    weights: torch.Tensor  # (N, k) their routing weights, summing to 1 per token


def route(logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(experts, weights) of each token: top-k of the logits, ties to the lower expert index,
    weights softmax over the chosen k."""
    experts = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :topk]
    weights = F.softmax(logits.gather(-1, experts).float(), dim=-1).to(logits.dtype)
    return experts, weights


def switch_aux_loss(routing: Routing, num_experts: int) -> torch.Tensor:
    """megatron-core's switch load-balancing loss of one layer and micro batch, coefficient 1:
    E * sum_i f_i * P_i, f_i = (tokens routed to i) / (N*k), P_i = mean softmax prob of i."""
    N, k = routing.experts.shape
    probs = F.softmax(routing.logits.float(), dim=-1)
    tokens_per_expert = torch.bincount(routing.experts.reshape(-1), minlength=num_experts).to(probs.dtype)
    return (probs.sum(dim=0) * tokens_per_expert).sum() * (num_experts / (k * N * N))


class MoE(nn.Module):
    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.topk = cfg.router_topk
        self.router = nn.Linear(cfg.channels, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(cfg.channels, cfg.moe_ffn_hidden_size) for _ in range(cfg.num_experts))
        self.route = route  # the routing rule; a test swaps in a wrong one to see the comparison fail

    def forward(self, x: torch.Tensor, routings: list[Routing]) -> torch.Tensor:
        """The block's output (a tensor, like every reference module's: the capture hooks read
        it); its `Routing` is appended to `routings`."""
        B, T, C = x.shape
        h = x.reshape(B * T, C)
        logits = self.router(h)
        experts, weights = self.route(logits, self.topk)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(experts == e)  # its tokens, in token order
            if token.numel():
                # Under BF16 autocast an expert's output is BF16 while the stream stays FP32: its
                # weighted share is summed into the FP32 stream, as a dense MLP's output is added.
                out = out.index_add(0, token, (expert(h[token]) * weights[token, slot, None]).to(out.dtype))
        routings.append(Routing(logits, experts, weights))
        return out.view(B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.ln_1 = RMSNorm(cfg.channels, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ln_2 = RMSNorm(cfg.channels, cfg.norm_eps)
        self.mlp = MoE(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, routings: list[Routing]) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x), routings)


class Mixtral(nn.Module):
    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.channels)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = RMSNorm(cfg.channels, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.channels, cfg.vocab_size, bias=False)
        self.aux_loss_coeff = AUX_LOSS_COEFF

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                routings: list[Routing] | None = None):
        """(logits, loss): loss = mean CE + coeff * aux loss when `targets` are given. Each layer's
        `Routing` is appended to `routings` when a list is passed."""
        cos, sin = rope_angles(self.cfg.head_dim, idx.shape[1], self.cfg.rope_theta, idx.device)
        layers: list[Routing] = [] if routings is None else routings
        x = self.wte(idx)
        for block in self.h:
            x = block(x, cos, sin, layers)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        ce = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, ce + self.aux_loss_coeff * self.aux_loss(layers)

    def aux_loss(self, routings: list[Routing]) -> torch.Tensor:
        """The load-balancing loss of one micro batch, coefficient 1: summed over layers."""
        return sum(switch_aux_loss(r, self.cfg.num_experts) for r in routings)

    def layer_aux_loss(self, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """One layer's load-balancing loss (coefficient 1) from its router logits and chosen experts."""
        return switch_aux_loss(Routing(logits, experts, torch.empty(0)), self.cfg.num_experts)

    def llmc_parameters(self) -> dict[str, nn.Parameter]:
        """Every parameter under its canonical LLMC name (`qkvw[3]`, `expert5.fcw2[3]`): the map both ways."""
        out = {"wte": self.wte.weight}
        for i, blk in enumerate(self.h):
            out |= {f"ln1w[{i}]": blk.ln_1.weight, f"qkvw[{i}]": blk.attn.c_attn.weight,
                    f"attprojw[{i}]": blk.attn.c_proj.weight, f"ln2w[{i}]": blk.ln_2.weight,
                    f"routerw[{i}]": blk.mlp.router.weight}
            for e, expert in enumerate(blk.mlp.experts):
                weights = {"fcw2": expert.c_fc2.weight, "fcw": expert.c_fc.weight, "fcprojw": expert.c_proj.weight}
                out |= {expert_tensor(e, role, i): weights[role] for role in EXPERT_ROLES}
        return out | {"lnfw": self.ln_f.weight, "lm_head": self.lm_head.weight}

    @classmethod
    def from_llmc(cls, tensors: dict, cfg: MixtralConfig) -> "Mixtral":
        return load_llmc(cls(cfg), tensors, cfg)
