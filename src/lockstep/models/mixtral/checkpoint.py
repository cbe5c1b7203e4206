"""InfiniTrain's tiny_mixtral checkpoint (magic 20260513, version 2 = fp32), as its
`example/tiny_mixtral/checkpoint_loader.cc` reads it (docs/reference/mixtral.md).

Header words: [0] 20260513, [1] 2, [2] max seq len, [3] V, [4] L, [5] NH, [6] n_kv_head, [7] C,
[8] num_experts, [9] ffn_expansion_ratio (float32 bits), [10]/[11] unread (written 0),
[12] norm_eps (float32 bits), [13] rope_theta (float32 bits), [14] use_scaled_rope (must be 0),
[15] router top-k, [16] expert FFN size F; the rest 0. Tensors fp32, layer-major, in
`MixtralConfig.tensor_shapes()` order; the file size must match exactly (the loader checks EOF).
"""

from __future__ import annotations

import os

import numpy as np

from lockstep.errors import FormatError
from lockstep.formats.llmc import HEADER_INTS, CheckpointLayout, bits_float, float_bits
from lockstep.models.mixtral.config import MixtralConfig

MIXTRAL_MAGIC = 20260513
VERSION_FP32 = 2


def decode_header(header: np.ndarray, path: str | os.PathLike) -> CheckpointLayout:
    magic, version = int(header[0]), int(header[1])
    if magic != MIXTRAL_MAGIC:
        raise FormatError(path, f"wrong magic number {magic} for a Mixtral checkpoint (expected {MIXTRAL_MAGIC})")
    if version != VERSION_FP32:
        raise FormatError(path, f"unsupported Mixtral checkpoint version {version} (supported: 2 = fp32, "
                                "InfiniTrain's tiny_mixtral layout)")
    if int(header[14]) != 0:
        raise FormatError(path, f"use_scaled_rope (header word 14) is {int(header[14])}; tiny_mixtral trains "
                                "with plain RoPE only and refuses a scaled one")
    config = MixtralConfig(
        max_seq_len=int(header[2]), vocab_size=int(header[3]), num_layers=int(header[4]), num_heads=int(header[5]),
        num_kv_heads=int(header[6]), channels=int(header[7]), num_experts=int(header[8]),
        ffn_expansion_ratio=bits_float(int(header[9])), norm_eps=bits_float(int(header[12])),
        rope_theta=bits_float(int(header[13])), router_topk=int(header[15]), moe_ffn_hidden_size=int(header[16]))
    problems = config.problems()
    if problems:
        raise FormatError(path, "header fields disagree: " + "; ".join(problems))
    return CheckpointLayout(version=version, config=config, dtype="fp32")


def encode_header(layout: CheckpointLayout) -> np.ndarray:
    c: MixtralConfig = layout.config
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:17] = [MIXTRAL_MAGIC, layout.version, c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads,
                   c.num_kv_heads, c.channels, c.num_experts, float_bits(c.ffn_expansion_ratio), 0, 0,
                   float_bits(c.norm_eps), float_bits(c.rope_theta), 0, c.router_topk, c.moe_ffn_hidden_size]
    return header
