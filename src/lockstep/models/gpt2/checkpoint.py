"""llm.c's GPT-2 checkpoint (`gpt2_124M.bin`), the file InfiniTrain's `gpt2` reads.

Header words (docs/reference/formats.md#gpt-2-magic-20240326): [0] 20240326, [1] version (3 = fp32 tensors, 5 = bf16),
[2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp. Tensors in `GPT2Config.tensor_shapes()` order.
"""

from __future__ import annotations

import os

import numpy as np

from lockstep.errors import FormatError
from lockstep.formats.llmc import HEADER_INTS, CheckpointLayout
from lockstep.models.gpt2.config import GPT2Config

GPT2_MAGIC = 20240326
VERSION_FP32 = 3
VERSION_BF16 = 5
DTYPE_OF_VERSION = {VERSION_FP32: "fp32", VERSION_BF16: "bf16"}


def decode_header(header: np.ndarray, path: str | os.PathLike) -> CheckpointLayout:
    if int(header[0]) != GPT2_MAGIC:
        raise FormatError(path, f"wrong magic number {int(header[0])} for a GPT-2 checkpoint (expected {GPT2_MAGIC})")
    version = int(header[1])
    if version not in DTYPE_OF_VERSION:
        raise FormatError(path, f"unsupported GPT-2 checkpoint version {version} (supported: 3 = fp32, 5 = bf16)")
    config = GPT2Config(max_seq_len=int(header[2]), vocab_size=int(header[3]), num_layers=int(header[4]),
                        num_heads=int(header[5]), channels=int(header[6]), padded_vocab_size=int(header[7]))
    problems = config.problems()
    if problems:
        raise FormatError(path, "header fields disagree: " + "; ".join(problems))
    return CheckpointLayout(version=version, config=config, dtype=DTYPE_OF_VERSION[version])


def encode_header(layout: CheckpointLayout) -> np.ndarray:
    c: GPT2Config = layout.config
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [GPT2_MAGIC, layout.version, c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads, c.channels,
                  c.padded_vocab_size]
    return header
