"""Qwen3's shape, exactly as its LLMC v4 header stores it (InfiniTrain PR #208;
docs/reference/formats.md#qwen3-magic-20240804-version-4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lockstep.formats.llmc import float32

from lockstep.models.llama3.config import GroupedAttentionShape, grouped_attention_problems


@dataclass(frozen=True)
class Qwen3Config(GroupedAttentionShape):
    max_seq_len: int = 40960
    vocab_size: int = 151936
    num_layers: int = 28
    num_heads: int = 16
    num_kv_heads: int = 8
    channels: int = 2048
    intermediate_size: int = 6144  # I, from the header (no multiplier rule)
    norm_eps: float = 1e-6  # every RMSNorm, QK-norm included
    rope_theta: float = 1000000.0

    family: ClassVar[str] = "qwen3"
    PER_LAYER: ClassVar[tuple[str, ...]] = ("ln1w", "qknormw", "qkvw", "attprojw", "ln2w", "fcw2", "fcw", "fcprojw")

    def __post_init__(self):
        # The header stores these as float32 bits: hold exactly what a file read back holds.
        for name in ('norm_eps', 'rope_theta'):
            object.__setattr__(self, name, float32(getattr(self, name)))

    @property
    def ffn_hidden(self) -> int:
        return self.intermediate_size

    def problems(self) -> list[str]:
        return grouped_attention_problems(self, ("max_seq_len", "vocab_size", "num_layers", "num_heads",
                                                 "num_kv_heads", "channels", "intermediate_size"))

    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """v4 order: q_norm/k_norm per layer before qkv; gate before up; untied lm_head last."""
        L, C, V, I, hd = self.num_layers, self.channels, self.vocab_size, self.intermediate_size, self.head_dim
        return [
            ("wte", (V, C)),
            ("ln1w", (L, C)),
            ("qknormw", (L, 2, hd)),  # [q_norm; k_norm] of each layer
            ("qkvw", (L, self.qkv_rows, C)),  # [Q; K; V]
            ("attprojw", (L, C, self.num_heads * hd)),  # o_proj
            ("ln2w", (L, C)),  # post_attention_layernorm
            ("fcw2", (L, I, C)),  # gate
            ("fcw", (L, I, C)),  # up
            ("fcprojw", (L, C, I)),  # down
            ("lnfw", (C,)),
            ("lm_head", (V, C)),
        ]

    def describe(self) -> str:
        return (f"L={self.num_layers} NH={self.num_heads} kv={self.num_kv_heads} C={self.channels} "
                f"I={self.intermediate_size} V={self.vocab_size}")

