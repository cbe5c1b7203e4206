"""llm.c's GPT-2 checkpoint (`gpt2_124M.bin`), the file InfiniTrain's `gpt2` reads.

Layout (SPEC section 2): 256 little-endian int32 header, then every tensor in the order of
`GPT2Config.tensor_shapes()`, fp32 (version 3) or bf16 (version 5). Nothing follows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep.errors import FormatError
from lockstep.fsutil import atomic_write
from lockstep.models.configs import GPT2Config

GPT2_MAGIC = 20240326
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
VERSION_FP32 = 3
VERSION_BF16 = 5
BYTES_PER_PARAM = {VERSION_FP32: 4, VERSION_BF16: 2}


@dataclass
class LLMCGPT2Checkpoint:
    """A decoded checkpoint. `tensors` are fp32 arrays in LLMC order (views of a memmap for v3)."""

    path: str
    version: int
    config: GPT2Config
    tensors: dict[str, np.ndarray]


def gpt2_file_size(config: GPT2Config, version: int = VERSION_FP32) -> int:
    return HEADER_BYTES + config.num_parameters() * BYTES_PER_PARAM[version]


def decode_gpt2_header(header: np.ndarray, path: str | os.PathLike) -> tuple[int, GPT2Config]:
    if int(header[0]) != GPT2_MAGIC:
        raise FormatError(path, f"wrong magic number {int(header[0])} for a GPT-2 checkpoint (expected {GPT2_MAGIC})")
    version = int(header[1])
    if version not in BYTES_PER_PARAM:
        raise FormatError(path, f"unsupported GPT-2 checkpoint version {version} (supported: 3 = fp32, 5 = bf16)")
    config = GPT2Config(
        max_seq_len=int(header[2]),
        vocab_size=int(header[3]),
        num_layers=int(header[4]),
        num_heads=int(header[5]),
        channels=int(header[6]),
        padded_vocab_size=int(header[7]),
    )
    problems = config.problems()
    if problems:
        raise FormatError(path, "header fields disagree: " + "; ".join(problems))
    return version, config


def read_gpt2_header(path: str | os.PathLike) -> tuple[int, GPT2Config]:
    """Decode and check the header and the file size, without reading the tensors."""
    path = Path(path)
    size = _file_size(path)
    if size < HEADER_BYTES:
        raise FormatError(path, f"truncated: {size} bytes is shorter than the {HEADER_BYTES}-byte header")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    version, config = decode_gpt2_header(header, path)
    expected = gpt2_file_size(config, version)
    if size < expected:
        raise FormatError(path, f"truncated: {size} bytes, but the header (L={config.num_layers}, C={config.channels}, "
                                f"Vp={config.padded_vocab_size}, version {version}) needs {expected}")
    if size > expected:
        raise FormatError(path, f"{size - expected} trailing bytes after the last tensor (file is {size} bytes, header needs {expected})")
    return version, config


def load_llmc_gpt2(path: str | os.PathLike) -> LLMCGPT2Checkpoint:
    """Memory-map a GPT-2 LLMC checkpoint; bf16 (v5) tensors are widened to fp32 exactly."""
    version, config = read_gpt2_header(path)
    if version == VERSION_FP32:
        flat = np.memmap(path, dtype="<f4", mode="r", offset=HEADER_BYTES)
    else:
        raw = np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES)
        flat = bf16_bits_to_fp32(raw)
    tensors, offset = {}, 0
    for name, shape in config.tensor_shapes():
        n = int(np.prod(shape))
        tensors[name] = flat[offset : offset + n].reshape(shape)
        offset += n
    return LLMCGPT2Checkpoint(path=str(path), version=version, config=config, tensors=tensors)


def write_llmc_gpt2(path: str | os.PathLike, config: GPT2Config, tensors: dict[str, np.ndarray],
                    version: int = VERSION_FP32) -> None:
    """Write a checkpoint atomically. Version 5 rounds fp32 to bf16 (round to nearest even)."""
    problems = config.problems()
    if problems:
        raise FormatError(path, "cannot write a checkpoint whose shape is inconsistent: " + "; ".join(problems))
    if version not in BYTES_PER_PARAM:
        raise FormatError(path, f"cannot write GPT-2 checkpoint version {version} (supported: 3, 5)")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [GPT2_MAGIC, version, config.max_seq_len, config.vocab_size, config.num_layers,
                  config.num_heads, config.channels, config.padded_vocab_size]
    with atomic_write(path) as f:
        f.write(header.tobytes())
        for name, shape in config.tensor_shapes():
            t = np.asarray(tensors[name], dtype=np.float32)
            if t.shape != shape:
                raise FormatError(path, f"tensor {name} has shape {t.shape}, the header needs {shape}")
            f.write((fp32_to_bf16_bits(t) if version == VERSION_BF16 else t.astype("<f4")).tobytes())


def bf16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round fp32 to bf16 bit patterns the way hardware and torch do: to nearest, ties to even."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    # In uint32 (not uint64: 124M parameters would need ~2 GB of temporaries): u + 0x7FFF + lsb
    # stays below 2**32 for every non-NaN value (the largest is -inf, 0xFF800000); NaNs, whose
    # sums may wrap, are overwritten below.
    rounded = (u >> 16) & np.uint32(1)
    rounded += u
    rounded += np.uint32(0x7FFF)
    rounded >>= 16
    out = rounded.astype("<u2")
    out[np.isnan(x)] = 0x7FC0
    return out


def _file_size(path: Path) -> int:
    if path.is_dir():  # np.fromfile would raise IsADirectoryError, a traceback instead of a sentence
        raise FormatError(path, "is a directory, not a checkpoint file")
    try:
        return path.stat().st_size
    except FileNotFoundError:
        raise FormatError(path, "no such file") from None
    except OSError as e:
        raise FormatError(path, f"cannot be read ({e.strerror})") from None
