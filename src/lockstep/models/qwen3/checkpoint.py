"""The Qwen3 LLMC checkpoint (magic 20240804, version 4): InfiniTrain PR #208's layout.

Header words (docs/reference/formats.md#qwen3-magic-20240804-version-4): 20240804, 4, max seq len, V, L, NH, n_kv_head, C,
intermediate size I, 1, rms eps (float32 bits), rope_theta (float32 bits), 0, 4, 1, 0.
Tensors fp32 in `Qwen3Config.tensor_shapes()` order; the file size must match exactly.
A version 3 file (a Llama-style header with no intermediate size) is refused.
"""

from __future__ import annotations

import os

import numpy as np

from lockstep.errors import FormatError
from lockstep.formats.llmc import HEADER_INTS, CheckpointLayout, bits_float, float_bits
from lockstep.models.qwen3.config import Qwen3Config

QWEN3_MAGIC = 20240804
VERSION_FP32 = 4
# Words [9] and [12..15] hold constants in PR #208's writer; written as it writes them.
CONSTANT_WORDS = {9: 1, 12: 0, 13: 4, 14: 1, 15: 0}


def decode_header(header: np.ndarray, path: str | os.PathLike) -> CheckpointLayout:
    magic, version = int(header[0]), int(header[1])
    if magic != QWEN3_MAGIC:
        from lockstep.models.llama3.checkpoint import LLAMA3_MAGIC

        what = " (that is a Llama 3 checkpoint)" if magic == LLAMA3_MAGIC else ""
        raise FormatError(path, f"wrong magic number {magic} for a Qwen3 checkpoint (expected {QWEN3_MAGIC}){what}")
    if version != VERSION_FP32:
        raise FormatError(path, f"unsupported Qwen3 checkpoint version {version}: lockstep reads version 4 "
                                f"(InfiniTrain PR #208's layout, which stores the intermediate size)")
    config = Qwen3Config(max_seq_len=int(header[2]), vocab_size=int(header[3]), num_layers=int(header[4]),
                         num_heads=int(header[5]), num_kv_heads=int(header[6]), channels=int(header[7]),
                         intermediate_size=int(header[8]), norm_eps=bits_float(int(header[10])),
                         rope_theta=bits_float(int(header[11])))
    problems = config.problems()
    if problems:
        raise FormatError(path, "header fields disagree: " + "; ".join(problems))
    return CheckpointLayout(version=version, config=config, dtype="fp32")


def encode_header(layout: CheckpointLayout) -> np.ndarray:
    c: Qwen3Config = layout.config
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:12] = [QWEN3_MAGIC, layout.version, c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads,
                   c.num_kv_heads, c.channels, c.intermediate_size, 0, float_bits(c.norm_eps), float_bits(c.rope_theta)]
    for word, value in CONSTANT_WORDS.items():
        header[word] = value
    return header
