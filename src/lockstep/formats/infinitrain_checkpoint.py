"""InfiniTrain's own checkpoint file (`--save DIR` writes DIR/checkpoint_step_NNNNNN/model.ckpt).

Magic "CKPT" (0x54504B43), version 1, a tensor count, then per tensor its name, an int8 dtype
(11 = FP32), ndim, int64 dims, a uint64 byte count and the data (infini_train/src/checkpoint/
checkpoint.cc at b24d92f). Names are InfiniTrain's module paths (transformer.h.0.attn.c_attn.weight);
runners/infinitrain/families.py maps them to LLMC names.
"""

from __future__ import annotations

import math
import mmap
import os
import struct

import numpy as np

from lockstep.errors import FormatError

CKPT_MAGIC = 0x54504B43
CKPT_VERSION = 1
INFINITRAIN_FP32 = 11


def read_infinitrain_checkpoint(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The FP32 tensors of an InfiniTrain `model.ckpt`, by InfiniTrain's names (other dtypes are
    skipped): read-only views of the memory-mapped file, read from disk when used (a 1B model's
    is 5 GB). The file may be removed while they live; its space is freed with the last of them."""
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            data = b""
    if len(data) < 12:
        raise FormatError(path, "too short for an InfiniTrain checkpoint")
    magic, version, count = struct.unpack_from("<III", data, 0)
    if magic != CKPT_MAGIC:
        raise FormatError(path, f"wrong magic number {magic:#x} for an InfiniTrain checkpoint (expected {CKPT_MAGIC:#x})")
    if version != CKPT_VERSION:
        raise FormatError(path, f"unsupported InfiniTrain checkpoint version {version} (supported: {CKPT_VERSION})")
    pos, out = 12, {}
    try:
        for _ in range(count):
            (n,) = struct.unpack_from("<I", data, pos)
            name = data[pos + 4 : pos + 4 + n].decode()
            pos += 4 + n
            dtype, ndim = struct.unpack_from("<bI", data, pos)
            pos += 5
            dims = struct.unpack_from(f"<{ndim}q", data, pos)
            pos += 8 * ndim
            (nbytes,) = struct.unpack_from("<Q", data, pos)
            pos += 8
            if dtype != INFINITRAIN_FP32:  # e.g. a non-parameter buffer: not a weight, skipped
                if pos + nbytes > len(data):
                    raise FormatError(path, f"tensor {name}: {nbytes} bytes, but the file ends early")
                pos += nbytes
                continue
            if nbytes != 4 * math.prod(dims) or pos + nbytes > len(data):
                raise FormatError(path, f"tensor {name}: {nbytes} bytes for shape {list(dims)}, or the file ends early")
            out[name] = np.frombuffer(data, dtype="<f4", count=math.prod(dims), offset=pos).reshape(dims)
            pos += nbytes
    except struct.error:
        raise FormatError(path, "ends in the middle of a tensor entry") from None
    if pos != len(data):
        raise FormatError(path, f"{len(data) - pos} trailing bytes after {count} tensors")
    return out


def write_infinitrain_checkpoint(path: str | os.PathLike, tensors: dict[str, np.ndarray]) -> None:
    """The same layout, for tests (InfiniTrain's own writer is the real source of these files)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<III", CKPT_MAGIC, CKPT_VERSION, len(tensors)))
        for name, a in tensors.items():
            a = np.ascontiguousarray(a, dtype="<f4")
            raw = name.encode()
            f.write(struct.pack("<I", len(raw)) + raw + struct.pack("<bI", INFINITRAIN_FP32, a.ndim))
            f.write(struct.pack(f"<{a.ndim}q", *a.shape) + struct.pack("<Q", a.nbytes) + a.tobytes())
