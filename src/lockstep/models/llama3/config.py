"""Llama 3's shape, exactly as its LLMC header stores it (docs/reference/formats.md#llama-3-magic-20240803-version-3)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import ClassVar

from lockstep.formats.llmc import float32
from lockstep.models.family import LLMCConfig


def llama3_ffn_hidden(channels: int, ffn_dim_multiplier: float, multiple_of: int) -> int:
    """round_up(llround(multiplier * int(2*4C/3)), multiple_of): int() first, then llround
    (halves away from zero; Python's round() would send halves to even), as llm.c and
    InfiniTrain compute it."""
    hidden = int(2 * 4 * channels / 3)
    hidden = int(math.floor(ffn_dim_multiplier * hidden + 0.5))
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def grouped_attention_problems(config, positive: tuple[str, ...]) -> list[str]:
    """Why a Llama-style shape (GQA heads, RoPE pairs) is inconsistent; empty when it is fine."""
    out = [f"{n} is {getattr(config, n)}, must be positive" for n in positive if getattr(config, n) <= 0]
    if out:
        return out
    if config.channels % config.num_heads:
        out.append(f"channels C={config.channels} is not divisible by heads NH={config.num_heads}")
    if config.num_heads % config.num_kv_heads:
        out.append(f"heads NH={config.num_heads} is not divisible by kv heads {config.num_kv_heads}")
    if config.head_dim % 2:
        out.append(f"head dim {config.head_dim} is odd; RoPE rotates pairs")
    return out


class GroupedAttentionShape(LLMCConfig):
    """What Llama 3 and Qwen3 shapes share: GQA head sizes, FLOPs, and the header as stored."""

    @property
    def head_dim(self) -> int:
        return self.channels // self.num_heads  # Qwen3's v4 layout too: head_dim = C/NH

    @property
    def qkv_rows(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def matmul_parameters(self) -> int:
        """Parameters that take part in a matmul per token: all but the input embedding wte (a
        lookup; the untied lm_head counts)."""
        return self.num_parameters() - self.vocab_size * self.channels

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token, PaLM's convention (appendix B): 6·N over the matmul
        parameters plus 12·L·T·(NH·hd) for QKᵀ and AV forward and backward (GQA shares K/V
        heads but every query head still does its own products), no discount for the causal
        mask. Norms, RoPE and SwiGLU's elementwise work are not counted."""
        return 6 * self.matmul_parameters() + 12 * self.num_layers * seq_len * self.num_heads * self.head_dim

    def header_fields(self) -> dict:
        return self.to_dict()


@dataclass(frozen=True)
class Llama3Config(GroupedAttentionShape):
    max_seq_len: int = 8192
    vocab_size: int = 128256  # V (no padded vocab: the file holds V rows)
    num_layers: int = 16
    num_heads: int = 32
    num_kv_heads: int = 8
    channels: int = 2048
    ffn_dim_multiplier: float = 1.5  # stored as float32 bits
    multiple_of: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_scaled_rope: bool = False  # the contract trains without RoPE scaling
    max_gen_batch_size: int = 4
    version_major: int = 3
    version_minor: int = 2

    family: ClassVar[str] = "llama3"
    PER_LAYER: ClassVar[tuple[str, ...]] = ("ln1w", "qkvw", "attprojw", "ln2w", "fcw", "fcw2", "fcprojw")

    def __post_init__(self):
        # The header stores these as float32 bits: hold exactly what a file read back holds.
        for name in ('ffn_dim_multiplier', 'norm_eps', 'rope_theta'):
            object.__setattr__(self, name, float32(getattr(self, name)))

    @property
    def ffn_hidden(self) -> int:
        return llama3_ffn_hidden(self.channels, self.ffn_dim_multiplier, self.multiple_of)

    def problems(self) -> list[str]:
        out = grouped_attention_problems(self, ("max_seq_len", "vocab_size", "num_layers", "num_heads",
                                                "num_kv_heads", "channels", "multiple_of"))
        if not out and not self.ffn_dim_multiplier > 0:
            out.append(f"ffn_dim_multiplier is {self.ffn_dim_multiplier}, must be positive")
        return out

    def training_problems(self) -> list[str]:
        if self.use_scaled_rope:
            # Every framework lockstep drives rotates with plain RoPE frequencies: training a
            # scaled-RoPE model would silently train a different model.
            return ["use_scaled_rope is 1 (Llama 3.1 RoPE scaling), which lockstep's frameworks do not implement; "
                    "convert with `lockstep convert --no-rope-scaling` to train it with plain RoPE"]
        return []

    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """LLMC order (llm.c's train_llama3.py): c_fc is "up", c_fc2 is "gate", then the down projection."""
        L, C, V, F = self.num_layers, self.channels, self.vocab_size, self.ffn_hidden
        return [
            ("wte", (V, C)),
            ("ln1w", (L, C)),
            ("qkvw", (L, self.qkv_rows, C)),  # [Q of all heads; K of all kv heads; V]
            ("attprojw", (L, C, C)),
            ("ln2w", (L, C)),
            ("fcw", (L, F, C)),  # up
            ("fcw2", (L, F, C)),  # gate
            ("fcprojw", (L, C, F)),  # down
            ("lnfw", (C,)),
            ("lm_head", (V, C)),
        ]

    def describe(self) -> str:
        return (f"L={self.num_layers} NH={self.num_heads} kv={self.num_kv_heads} C={self.channels} "
                f"FFN={self.ffn_hidden} V={self.vocab_size}")

    def to_dict(self) -> dict:
        return {"family": self.family, **asdict(self), "ffn_hidden": self.ffn_hidden}
