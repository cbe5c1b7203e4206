"""Which format is a file in? The magic number says; every registered format is listed here.

Checkpoint formats come from the model families (`lockstep.models.FAMILIES`), token streams
from `formats.tokens`; a new family or stream kind is picked up by `lockstep inspect` and the
runners without a change here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lockstep.errors import FormatError
from lockstep.formats import llmc, tokens
from lockstep.fsutil import read_head


@dataclass
class FileInfo:
    path: str
    format: str  # "llmc-gpt2", "tokens-gpt2", ...
    kind: str  # "checkpoint" | "token stream"
    fields: dict = field(default_factory=dict)  # header fields as stored
    derived: dict = field(default_factory=dict)  # sizes and counts computed from them
    family: str | None = None  # model family of a checkpoint


def known_magics() -> dict[int, str]:
    from lockstep.models import FAMILIES

    out = {f.magic: f"llmc-{f.name}" for f in FAMILIES.values()}
    out.update({m: f"tokens-{k.name}" for m, k in tokens.TOKEN_STREAM_KINDS.items()})
    return out


INFINITRAIN_CHECKPOINT = "infinitrain-checkpoint"  # a folder, not a file: checkpoint_step_NNNNNN/


def detect(path: str | os.PathLike) -> str:
    """The format name of the file, from its magic number (a folder InfiniTrain's checkpoint
    writer made: INFINITRAIN_CHECKPOINT)."""
    path = Path(path)
    if path.is_dir():
        from lockstep.formats.infinitrain_checkpoint import is_checkpoint_folder

        if is_checkpoint_folder(path):
            return INFINITRAIN_CHECKPOINT
    head = read_head(path, 4, "checkpoint or token file")
    if len(head) < 4:
        raise FormatError(path, f"truncated: {len(head)} bytes, too short to hold a magic number")
    magic = int(np.frombuffer(head, dtype="<i4")[0])
    magics = known_magics()
    if magic not in magics:
        known = ", ".join(f"{m} ({name})" for m, name in magics.items())
        raise FormatError(path, f"unknown magic number {magic}; known: {known}")
    return magics[magic]


def inspect_file(path: str | os.PathLike) -> FileInfo:
    """Identify a file by its magic number and validate its header and size. Raises FormatError."""
    path = Path(path)
    fmt = detect(path)
    if fmt.startswith("llmc-"):
        from lockstep.models import read_checkpoint_layout

        fam, layout = read_checkpoint_layout(path)
        cfg = layout.config
        return FileInfo(str(path), fmt, "checkpoint", family=fam.name,
                        fields={"magic": fam.magic, "version": layout.version, **cfg.header_fields()},
                        derived={"dtype": layout.dtype, "head_dim": cfg.head_dim, "parameters": cfg.num_parameters(),
                                 "bytes": layout.file_size})
    ts = tokens.read_token_stream(path)
    return FileInfo(str(path), fmt, "token stream",
                    fields={"magic": ts.kind.magic, "version": ts.kind.version, "count": ts.count},
                    derived={"dtype": np.dtype(ts.kind.dtype).name, "vocab_limit": ts.kind.vocab_size,
                             "max_id": int(ts.tokens.max()) if ts.count else None,
                             "bytes": llmc.HEADER_BYTES + ts.count * np.dtype(ts.kind.dtype).itemsize})
