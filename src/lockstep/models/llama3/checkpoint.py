"""llm.c's Llama 3 checkpoint (magic 20240803, version 3 = fp32), the file InfiniTrain's `llama3` reads.

Header words (docs/reference/formats.md#llama-3-magic-20240803-version-3):
[2] max seq len, [3] V, [4] L, [5] NH, [6] n_kv_head, [7] C,
[8] ffn_dim_multiplier (float32 bits), [9] multiple_of, [10] norm_eps (float32 bits),
[11] rope_theta (float32 bits), [12] use_scaled_rope, [13] max_gen_batch_size, [14]/[15]
version major/minor. Tensors in `Llama3Config.tensor_shapes()` order.
"""

from __future__ import annotations

import os

import numpy as np

from lockstep.errors import FormatError
from lockstep.formats.llmc import HEADER_INTS, CheckpointLayout, bits_float, float_bits
from lockstep.models.llama3.config import Llama3Config

LLAMA3_MAGIC = 20240803
VERSION_FP32 = 3


def decode_header(header: np.ndarray, path: str | os.PathLike) -> CheckpointLayout:
    magic, version = int(header[0]), int(header[1])
    if magic != LLAMA3_MAGIC:
        raise FormatError(path, f"wrong magic number {magic} for a Llama 3 checkpoint (expected {LLAMA3_MAGIC})")
    if version != VERSION_FP32:
        raise FormatError(path, f"unsupported Llama 3 checkpoint version {version} (supported: 3 = fp32)")
    config = Llama3Config(
        max_seq_len=int(header[2]), vocab_size=int(header[3]), num_layers=int(header[4]), num_heads=int(header[5]),
        num_kv_heads=int(header[6]), channels=int(header[7]), ffn_dim_multiplier=bits_float(int(header[8])),
        multiple_of=int(header[9]), norm_eps=bits_float(int(header[10])), rope_theta=bits_float(int(header[11])),
        use_scaled_rope=bool(header[12]), max_gen_batch_size=int(header[13]), version_major=int(header[14]),
        version_minor=int(header[15]))
    problems = config.problems()
    if problems:
        raise FormatError(path, "header fields disagree: " + "; ".join(problems))
    return CheckpointLayout(version=version, config=config, dtype="fp32")


def encode_header(layout: CheckpointLayout) -> np.ndarray:
    c: Llama3Config = layout.config
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:16] = [LLAMA3_MAGIC, layout.version, c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads,
                   c.num_kv_heads, c.channels, float_bits(c.ffn_dim_multiplier), c.multiple_of,
                   float_bits(c.norm_eps), float_bits(c.rope_theta), int(c.use_scaled_rope), c.max_gen_batch_size,
                   c.version_major, c.version_minor]
    return header
