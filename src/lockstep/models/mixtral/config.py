"""Mixtral's shape, exactly as InfiniTrain's tiny_mixtral LLMC v2 header stores it (docs/reference/mixtral.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from lockstep.formats.llmc import float32
from lockstep.models.llama3.config import GroupedAttentionShape, grouped_attention_problems

# One layer's tensors in file order (the v2 file is layer-major: layer 0's tensors, then layer 1's).
ATTENTION_ROLES = ("ln1w", "qkvw", "attprojw", "ln2w", "routerw")
EXPERT_ROLES = ("fcw2", "fcw", "fcprojw")  # gate (Mixtral w1), up (w3), down (w2)


def expert_tensor(expert: int, role: str, layer: int) -> str:
    """The canonical name of one expert's matrix in one layer: `expert3.fcw2[1]`."""
    return f"expert{expert}.{role}[{layer}]"


@dataclass(frozen=True)
class MixtralConfig(GroupedAttentionShape):
    # Defaults: the branch's own tiny_mixtral shape (its config.h), the one its binary accepts.
    max_seq_len: int = 32768
    vocab_size: int = 128256  # Llama 3's vocabulary: the branch trains on Llama 3 token ids
    num_layers: int = 32
    num_heads: int = 4
    num_kv_heads: int = 1
    channels: int = 512
    num_experts: int = 8
    router_topk: int = 2
    moe_ffn_hidden_size: int = 1792  # F, every expert's SwiGLU width
    # Stored and compared by InfiniTrain, but no MoE layer uses it (its experts are F wide).
    ffn_expansion_ratio: float = 3.5
    norm_eps: float = 1e-5
    rope_theta: float = 1000000.0

    family: ClassVar[str] = "mixtral"
    # Every tensor is named per layer already (`ln1w[0]`): the file is layer-major, not stacked.
    PER_LAYER: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        # The header stores these as float32 bits: hold exactly what a file read back holds.
        for name in ("ffn_expansion_ratio", "norm_eps", "rope_theta"):
            object.__setattr__(self, name, float32(getattr(self, name)))

    @property
    def ffn_hidden(self) -> int:
        return self.moe_ffn_hidden_size

    def problems(self) -> list[str]:
        out = grouped_attention_problems(self, ("max_seq_len", "vocab_size", "num_layers", "num_heads",
                                                "num_kv_heads", "channels", "num_experts", "router_topk",
                                                "moe_ffn_hidden_size"))
        if not out and self.router_topk > self.num_experts:
            out.append(f"router top-k {self.router_topk} is more than the {self.num_experts} experts")
        return out

    def layer_tensor_shapes(self, layer: int) -> list[tuple[str, tuple[int, ...]]]:
        C, F, E = self.channels, self.moe_ffn_hidden_size, self.num_experts
        out = [(f"ln1w[{layer}]", (C,)),
               (f"qkvw[{layer}]", (self.qkv_rows, C)),  # [Q of all heads; K of all kv heads; V]
               (f"attprojw[{layer}]", (C, self.num_heads * self.head_dim)),
               (f"ln2w[{layer}]", (C,)),
               (f"routerw[{layer}]", (E, C))]
        for e in range(E):
            out += [(expert_tensor(e, "fcw2", layer), (F, C)),  # gate
                    (expert_tensor(e, "fcw", layer), (F, C)),  # up
                    (expert_tensor(e, "fcprojw", layer), (C, F))]  # down
        return out

    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """tiny_mixtral's checkpoint_loader.cc order: wte, then layer by layer, then lnfw, lm_head."""
        out = [("wte", (self.vocab_size, self.channels))]
        for layer in range(self.num_layers):
            out += self.layer_tensor_shapes(layer)
        return out + [("lnfw", (self.channels,)), ("lm_head", (self.vocab_size, self.channels))]

    def matmul_parameters(self) -> int:
        """Parameters one token multiplies by (active parameters): all but wte, and of each layer's
        E experts only the top-k a token is routed to."""
        inactive_experts = self.num_experts - self.router_topk
        per_expert = 3 * self.channels * self.moe_ffn_hidden_size
        return super().matmul_parameters() - self.num_layers * inactive_experts * per_expert

    def describe(self) -> str:
        return (f"L={self.num_layers} NH={self.num_heads} kv={self.num_kv_heads} C={self.channels} "
                f"E={self.num_experts} top-{self.router_topk} F={self.moe_ffn_hidden_size} V={self.vocab_size}")

    def to_dict(self) -> dict:
        return {"family": self.family, **asdict(self)}
