"""File formats: LLMC checkpoints, llm.c token streams, run records and log lines.

`detect(path)` reads the magic number and says which format a file is in; new formats
register here and every caller (`lockstep inspect`, the runners) picks them up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from lockstep.errors import FormatError
from lockstep.formats import llmc_gpt2, llmc_llama, tokens


@dataclass(frozen=True)
class FileFormat:
    name: str
    kind: str  # "checkpoint" | "token stream"
    describe: Callable[[Path], "FileInfo"]


@dataclass
class FileInfo:
    path: str
    format: str
    kind: str
    fields: dict = field(default_factory=dict)  # header fields as stored
    derived: dict = field(default_factory=dict)  # sizes and counts computed from them


def _describe_gpt2(path: Path) -> FileInfo:
    version, cfg = llmc_gpt2.read_gpt2_header(path)
    return FileInfo(str(path), "llmc-gpt2", "checkpoint",
                    fields={"magic": llmc_gpt2.GPT2_MAGIC, "version": version, "maxT": cfg.max_seq_len,
                            "V": cfg.vocab_size, "L": cfg.num_layers, "NH": cfg.num_heads, "C": cfg.channels,
                            "Vp": cfg.padded_vocab_size},
                    derived={"dtype": "fp32" if version == 3 else "bf16", "head_dim": cfg.head_dim,
                             "parameters": cfg.num_parameters(), "bytes": llmc_gpt2.gpt2_file_size(cfg, version)})


def _describe_llama(path: Path) -> FileInfo:
    version, cfg = llmc_llama.read_llama_header(path)
    return FileInfo(str(path), f"llmc-{cfg.family}", "checkpoint", fields={"version": version, **cfg.to_dict()},
                    derived={"head_dim": cfg.head_dim, "parameters": cfg.num_parameters()})


def _describe_tokens(path: Path) -> FileInfo:
    ts = tokens.read_token_stream(path)
    return FileInfo(str(path), f"tokens-{ts.kind.name}", "token stream",
                    fields={"magic": ts.kind.magic, "version": ts.kind.version, "count": ts.count},
                    derived={"dtype": np.dtype(ts.kind.dtype).name, "vocab_limit": ts.kind.vocab_size,
                             "max_id": int(ts.tokens.max()) if ts.count else None,
                             "bytes": tokens.HEADER_BYTES + ts.count * np.dtype(ts.kind.dtype).itemsize})


FORMATS_BY_MAGIC: dict[int, FileFormat] = {
    llmc_gpt2.GPT2_MAGIC: FileFormat("llmc-gpt2", "checkpoint", _describe_gpt2),
    llmc_llama.LLAMA3_MAGIC: FileFormat("llmc-llama3", "checkpoint", _describe_llama),
    llmc_llama.QWEN3_MAGIC: FileFormat("llmc-qwen3", "checkpoint", _describe_llama),
    **{m: FileFormat(f"tokens-{k.name}", "token stream", _describe_tokens) for m, k in tokens.TOKEN_STREAM_KINDS.items()},
}


def detect(path: str | os.PathLike) -> FileFormat:
    path = Path(path)
    if not path.is_file():
        raise FormatError(path, "no such file")
    with open(path, "rb") as f:
        head = f.read(4)
    if len(head) < 4:
        raise FormatError(path, f"truncated: {len(head)} bytes, too short to hold a magic number")
    magic = int(np.frombuffer(head, dtype="<i4")[0])
    fmt = FORMATS_BY_MAGIC.get(magic)
    if fmt is None:
        known = ", ".join(f"{m} ({f.name})" for m, f in FORMATS_BY_MAGIC.items())
        raise FormatError(path, f"unknown magic number {magic}; known: {known}")
    return fmt


def inspect_file(path: str | os.PathLike) -> FileInfo:
    """Identify a file by its magic number and validate it fully. Raises FormatError."""
    return detect(path).describe(Path(path))
