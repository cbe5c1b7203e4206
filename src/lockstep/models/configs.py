"""Model shapes, registered in one small table.

A shape is the header of an LLMC checkpoint: when the user gives `--llmc FILE`, the shape
comes from that file's header instead of this table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lockstep.errors import LockstepError


@dataclass(frozen=True)
class GPT2Config:
    """GPT-2 hyper-parameters exactly as the LLMC header stores them."""

    max_seq_len: int = 1024  # maxT
    vocab_size: int = 50257  # V
    num_layers: int = 12  # L
    num_heads: int = 12  # NH
    channels: int = 768  # C
    padded_vocab_size: int = 50304  # Vp: wte rows V..Vp-1 are padding

    family = "gpt2"

    @property
    def head_dim(self) -> int:
        return self.channels // self.num_heads

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
        """LLMC tensor order: grouped by kind across layers (SPEC section 2)."""
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

    def num_parameters(self) -> int:
        total = 0
        for _, shape in self.tensor_shapes():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def to_dict(self) -> dict:
        return {"family": self.family, **asdict(self)}


# Registered shapes. gpt2-tiny keeps NH=12: InfiniTrain's GPT-2 loader rejects any other
# head count (SPEC section 9), and C=96 keeps a CPU step well under a second.
MODEL_SHAPES: dict[str, GPT2Config] = {
    "gpt2": GPT2Config(max_seq_len=1024, vocab_size=50257, num_layers=12, num_heads=12, channels=768, padded_vocab_size=50304),
    "gpt2-tiny": GPT2Config(max_seq_len=1024, vocab_size=50257, num_layers=2, num_heads=12, channels=96, padded_vocab_size=50304),
}


def model_shape(name: str) -> GPT2Config:
    try:
        return MODEL_SHAPES[name]
    except KeyError:
        raise LockstepError(f"unknown model {name!r}; known models: {', '.join(MODEL_SHAPES)}") from None
