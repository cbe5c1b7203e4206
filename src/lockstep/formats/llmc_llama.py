"""Headers of llm.c-style Llama 3 (20240803) and Qwen3 (20240804) checkpoints.

Only the header and the size check live here for now (enough for `lockstep inspect` and for
rejecting a bad file early); the Llama 3 and Qwen3 runners will add tensor loading.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lockstep.errors import FormatError

LLAMA3_MAGIC = 20240803
QWEN3_MAGIC = 20240804
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


@dataclass(frozen=True)
class LlamaConfig:
    family: str
    max_seq_len: int
    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    channels: int
    ffn_hidden: int
    norm_eps: float
    rope_theta: float

    @property
    def head_dim(self) -> int:
        return self.channels // self.num_heads

    def num_parameters(self) -> int:
        L, C, V, F, hd = self.num_layers, self.channels, self.vocab_size, self.ffn_hidden, self.head_dim
        qkv = C + 2 * self.num_kv_heads * hd
        n = V * C + L * C + L * qkv * C + L * C * C + L * C + 3 * L * F * C + C + V * C
        if self.family == "qwen3":
            n += 2 * L * hd  # q_norm and k_norm per layer
        return n

    def to_dict(self) -> dict:
        return asdict(self)


def _f32(bits: int) -> float:
    return float(np.array([bits], dtype="<i4").view("<f4")[0])


def decode_llama_header(header: np.ndarray, path: str | os.PathLike) -> tuple[int, LlamaConfig]:
    magic, version = int(header[0]), int(header[1])
    family = {LLAMA3_MAGIC: "llama3", QWEN3_MAGIC: "qwen3"}.get(magic)
    if family is None:
        raise FormatError(path, f"wrong magic number {magic} for a Llama 3 / Qwen3 checkpoint")
    C, NH = int(header[7]), int(header[5])
    if family == "llama3":
        if version != 3:
            raise FormatError(path, f"unsupported Llama 3 checkpoint version {version} (supported: 3 = fp32)")
        mult, multiple_of = _f32(int(header[8])), int(header[9])
        if multiple_of <= 0:
            raise FormatError(path, f"header multiple_of is {multiple_of}, must be positive")
        # llround (halves away from zero) as SPEC section 2 says; Python's round() sends halves to even.
        hidden = int(math.floor(mult * (2 * 4 * C / 3) + 0.5))
        ffn = multiple_of * ((hidden + multiple_of - 1) // multiple_of)
    else:
        if version != 4:
            raise FormatError(path, f"unsupported Qwen3 checkpoint version {version} (supported: 4)")
        ffn = int(header[8])
    cfg = LlamaConfig(family=family, max_seq_len=int(header[2]), vocab_size=int(header[3]), num_layers=int(header[4]),
                      num_heads=NH, num_kv_heads=int(header[6]), channels=C, ffn_hidden=ffn,
                      norm_eps=_f32(int(header[10])), rope_theta=_f32(int(header[11])))
    for name in ("max_seq_len", "vocab_size", "num_layers", "num_heads", "num_kv_heads", "channels", "ffn_hidden"):
        if getattr(cfg, name) <= 0:
            raise FormatError(path, f"header field {name} is {getattr(cfg, name)}, must be positive")
    if C % NH:
        raise FormatError(path, f"header fields disagree: channels C={C} is not divisible by heads NH={NH}")
    if NH % cfg.num_kv_heads:
        raise FormatError(path, f"header fields disagree: heads NH={NH} is not divisible by kv heads {cfg.num_kv_heads}")
    return version, cfg


def read_llama_header(path: str | os.PathLike) -> tuple[int, LlamaConfig]:
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise FormatError(path, "no such file") from None
    if size < HEADER_BYTES:
        raise FormatError(path, f"truncated: {size} bytes is shorter than the {HEADER_BYTES}-byte header")
    version, cfg = decode_llama_header(np.fromfile(path, dtype="<i4", count=HEADER_INTS), path)
    expected = HEADER_BYTES + 4 * cfg.num_parameters()
    if size < expected:
        raise FormatError(path, f"truncated: {size} bytes, but the header needs {expected}")
    if size > expected:
        raise FormatError(path, f"{size - expected} trailing bytes after the last tensor (header needs {expected})")
    return version, cfg
