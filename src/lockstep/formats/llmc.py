"""The LLMC checkpoint container every family shares: a 256-int32 header, then tensors.

llm.c's checkpoints (and InfiniTrain's readers of them) are one little-endian block of 256
int32 header words, then every tensor of the model back to back, grouped by kind across layers,
with nothing after the last one. What differs per family is the header's meaning and the tensor
table; those live with the family (`lockstep.models.<family>.checkpoint`), which hands this
module a `CheckpointLayout`. Everything about bytes on disk is here: the size check, memory
mapping, bf16 widening and rounding, atomic writing.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from lockstep.errors import FormatError
from lockstep.fsutil import atomic_write, read_head, regular_file_size

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
DTYPE_BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True)
class CheckpointLayout:
    """What a family's header decoded to: the shape, and how the tensors that follow are stored."""

    version: int
    config: Any  # the family's config dataclass
    dtype: str  # "fp32" | "bf16": how the tensors are stored

    @property
    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return self.config.tensor_shapes()

    @property
    def file_size(self) -> int:
        return HEADER_BYTES + self.config.num_parameters() * DTYPE_BYTES[self.dtype]


@dataclass
class LLMCCheckpoint:
    """A decoded checkpoint: fp32 arrays in LLMC order (views of a memmap for fp32 files)."""

    path: str
    family: str
    version: int
    config: Any
    tensors: dict[str, np.ndarray]


def read_header(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """The 256 header ints and the file size; FormatError for anything that is not such a file."""
    path = Path(path)
    size = file_size(path)
    if size < HEADER_BYTES:
        raise FormatError(path, f"truncated: {size} bytes is shorter than the {HEADER_BYTES}-byte header")
    header = np.frombuffer(read_head(path, HEADER_BYTES, "checkpoint file"), dtype="<i4")
    return header, size


def check_size(path: str | os.PathLike, layout: CheckpointLayout, size: int, what: str) -> None:
    expected = layout.file_size
    if size < expected:
        raise FormatError(path, f"truncated: {size} bytes, but the header ({what}) needs {expected}")
    if size > expected:
        raise FormatError(path, f"{size - expected} trailing bytes after the last tensor "
                                f"(file is {size} bytes, header needs {expected})")


def map_tensors(path: str | os.PathLike, layout: CheckpointLayout) -> dict[str, np.ndarray]:
    """Memory-map the tensors that follow the header; bf16 tensors are widened to fp32 exactly."""
    if layout.dtype == "fp32":
        flat = np.memmap(path, dtype="<f4", mode="r", offset=HEADER_BYTES)
    else:
        flat = bf16_bits_to_fp32(np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES))
    tensors, offset = {}, 0
    for name, shape in layout.tensor_shapes:
        n = math.prod(shape)
        tensors[name] = flat[offset : offset + n].reshape(shape)
        offset += n
    return tensors


def write_checkpoint(path: str | os.PathLike, header: np.ndarray, layout: CheckpointLayout,
                     tensors: dict[str, np.ndarray], order: list[tuple[str, tuple[int, ...]]] | None = None) -> None:
    """Write header + tensors atomically, checking every tensor's shape against the layout;
    `order`: another reader's order of the same tensors (default the layout's)."""
    if header.shape != (HEADER_INTS,):
        raise FormatError(path, f"an LLMC header is {HEADER_INTS} int32 words, got {header.shape}")
    with atomic_write(path, what="LLMC checkpoint", size=layout.file_size) as f:
        f.write(np.asarray(header, dtype="<i4").tobytes())
        for name, shape in order if order is not None else layout.tensor_shapes:
            if name not in tensors:
                raise FormatError(path, f"tensor {name} is missing")
            t = np.asarray(tensors[name], dtype=np.float32)
            if t.shape != shape:
                raise FormatError(path, f"tensor {name} has shape {t.shape}, the header needs {shape}")
            f.write((fp32_to_bf16_bits(t) if layout.dtype == "bf16" else t.astype("<f4")).tobytes())


def write_checkpoint_by_layer(path: str | os.PathLike, header: np.ndarray, layout: CheckpointLayout,
                              tensor: Callable[[str, int | None], np.ndarray]) -> None:
    """Write header + tensors atomically, asking `tensor(name, layer)` for one layer's slice of
    each per-layer tensor (the config's PER_LAYER) and `tensor(name, None)` for the others, in
    LLMC order: a converter then holds one layer of one kind at a time, never the whole model.
    Each slice's shape is checked; on any error nothing is left at `path`."""
    if header.shape != (HEADER_INTS,):
        raise FormatError(path, f"an LLMC header is {HEADER_INTS} int32 words, got {header.shape}")
    per_layer = set(layout.config.PER_LAYER)
    with atomic_write(path) as f:
        f.write(np.asarray(header, dtype="<i4").tobytes())
        for name, shape in layout.tensor_shapes:
            parts = [(layer, shape[1:]) for layer in range(shape[0])] if name in per_layer else [(None, shape)]
            for layer, part_shape in parts:
                t = np.asarray(tensor(name, layer), dtype=np.float32)
                if t.shape != part_shape:
                    where = f"{name}[{layer}]" if layer is not None else name
                    raise FormatError(path, f"tensor {where} has shape {t.shape}, the header needs {part_shape}")
                f.write((fp32_to_bf16_bits(t) if layout.dtype == "bf16" else t.astype("<f4")).tobytes())


def float_bits(value: float) -> int:
    """A float32 stored in an int32 header word (Llama 3 / Qwen3 keep eps and theta so)."""
    return int(np.array([value], dtype="<f4").view("<i4")[0])


def float32(value: float) -> float:
    """`value` rounded to the nearest float32, as a Python float."""
    return float(np.float32(value))


def bits_float(bits: int) -> float:
    return float(np.array([bits], dtype="<i4").view("<f4")[0])


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


def file_size(path: Path) -> int:
    return regular_file_size(path, "checkpoint file")  # a directory, FIFO or device: one sentence


def non_finite_tensors(tensors: dict[str, np.ndarray], skip_rows: dict[str, int] | None = None,
                       chunk: int = 1 << 22) -> list[tuple[str, int, int]]:
    """(tensor, count of NaN, count of ±Inf) for every tensor holding non-finite values.

    `skip_rows` names tensors whose rows from that index on are padding (GPT-2's wte rows
    V..Vp-1): they are reported separately by the caller, since padding may hold anything.
    """
    out = []
    for name, t in tensors.items():
        limit = (skip_rows or {}).get(name)
        flat = (t[:limit] if limit is not None else t).reshape(-1)
        nan = inf = 0
        for i in range(0, flat.shape[0], chunk):
            part = np.asarray(flat[i : i + chunk])
            finite = np.isfinite(part)
            if not finite.all():
                bad = part[~finite]
                nan += int(np.isnan(bad).sum())
                inf += int(bad.size - np.isnan(bad).sum())
        if nan or inf:
            out.append((name, nan, inf))
    return out
