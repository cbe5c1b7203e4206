"""GPT-2's shape, exactly as its LLMC header stores it (docs/reference/formats.md#gpt-2-magic-20240326)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lockstep.models.family import LLMCConfig


@dataclass(frozen=True)
class GPT2Config(LLMCConfig):
    max_seq_len: int = 1024  # maxT
    vocab_size: int = 50257  # V
    num_layers: int = 12  # L
    num_heads: int = 12  # NH
    channels: int = 768  # C
    padded_vocab_size: int = 50304  # Vp: wte rows V..Vp-1 are padding

    family: ClassVar[str] = "gpt2"
    # Tensors stacked over layers in the file (canonical names split them as `qkvw[3]`).
    PER_LAYER: ClassVar[tuple[str, ...]] = ("ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b",
                                            "fcw", "fcb", "fcprojw", "fcprojb")

    @property
    def head_dim(self) -> int:
        return self.channels // self.num_heads

    @property
    def num_kv_heads(self) -> int:
        return self.num_heads

    @property
    def ffn_hidden(self) -> int:
        return 4 * self.channels

    def problems(self) -> list[str]:
        """Reasons this shape is inconsistent; empty when it is fine."""
        out = []
        for name in ("max_seq_len", "vocab_size", "num_layers", "num_heads", "channels", "padded_vocab_size"):
            if getattr(self, name) <= 0:
                out.append(f"{name} is {getattr(self, name)}, must be positive")
        if out:
            return out
        if self.padded_vocab_size < self.vocab_size:
            out.append(f"padded vocab Vp={self.padded_vocab_size} is smaller than vocab V={self.vocab_size}")
        if self.channels % self.num_heads:
            out.append(f"channels C={self.channels} is not divisible by heads NH={self.num_heads}")
        return out

    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """LLMC tensor order: grouped by kind across layers."""
        L, C, Vp, maxT = self.num_layers, self.channels, self.padded_vocab_size, self.max_seq_len
        return [
            ("wte", (Vp, C)),
            ("wpe", (maxT, C)),
            ("ln1w", (L, C)),
            ("ln1b", (L, C)),
            ("qkvw", (L, 3 * C, C)),
            ("qkvb", (L, 3 * C)),
            ("attprojw", (L, C, C)),
            ("attprojb", (L, C)),
            ("ln2w", (L, C)),
            ("ln2b", (L, C)),
            ("fcw", (L, 4 * C, C)),
            ("fcb", (L, 4 * C)),
            ("fcprojw", (L, C, 4 * C)),
            ("fcprojb", (L, C)),
            ("lnfw", (C,)),
            ("lnfb", (C,)),
        ]

    def matmul_parameters(self) -> int:
        """Parameters that take part in a matmul per token: all but the position table wpe (a
        lookup); wte counts once, as the tied output head (nanoGPT's `get_num_params` convention)."""
        return self.num_parameters() - self.max_seq_len * self.channels

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token, PaLM's convention (Chowdhery et al. 2022, appendix B):
        6·N (forward 2·N, backward 4·N over the matmul parameters N) plus 12·L·T·C for the
        attention scores and the weighted sum (QKᵀ and AV, forward and backward), with no
        discount for the causal mask. Norms, GELU and softmax are not counted."""
        return 6 * self.matmul_parameters() + 12 * self.num_layers * seq_len * self.channels

    def describe(self) -> str:
        return f"L={self.num_layers} NH={self.num_heads} C={self.channels} V={self.vocab_size} Vp={self.padded_vocab_size}"

    def header_fields(self) -> dict:
        """The header words under the names llm.c gives them (for `lockstep inspect`)."""
        return {"maxT": self.max_seq_len, "V": self.vocab_size, "L": self.num_layers, "NH": self.num_heads,
                "C": self.channels, "Vp": self.padded_vocab_size}
