"""llm.c token streams (`tiny_shakespeare_train.bin`): 256 int32 header, then the tokens.

`[0]` magic, `[1]` version, `[2]` token count. GPT-2 streams are 20240520 / v1 / uint16
(kind "gpt2"); Llama 3 and Qwen3 streams share 20240801 / v7 / uint32 (kind "uint32": llm.c
named it for Llama 3, Qwen3 reuses it for its 151,936-entry vocabulary), docs/reference/formats.md#token-streams. The
payload must hold exactly `count` tokens: llm.c and InfiniTrain trust the count, so a lying
count misreads silently.

Which ids are valid depends on the model, not the file: readers pass the model's
`vocab_size`; without it, the kind's limit admits every family that writes the kind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep.errors import FormatError
from lockstep.fsutil import atomic_write, read_head, regular_file_size

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


@dataclass(frozen=True)
class TokenStreamKind:
    name: str
    magic: int
    version: int
    dtype: str
    vocab_size: int  # ids must be below this when the caller names no model vocabulary
    families: tuple[str, ...]  # the tokenizers that write this kind


# Qwen3's model vocabulary (151,936 rows, ids up to 151,935) is the largest that uses uint32.
UINT32_ID_LIMIT = 151_936

TOKEN_STREAM_KINDS: dict[int, TokenStreamKind] = {
    20240520: TokenStreamKind("gpt2", 20240520, 1, "<u2", 50257, ("gpt2",)),
    20240801: TokenStreamKind("uint32", 20240801, 7, "<u4", UINT32_ID_LIMIT, ("llama3", "qwen3")),
}
KIND_BY_NAME = {k.name: k for k in TOKEN_STREAM_KINDS.values()}
# The family names of the uint32 kind still select it (`kind="llama3"` predates Qwen3).
KIND_BY_NAME.update({family: k for k in TOKEN_STREAM_KINDS.values() for family in k.families})


@dataclass
class TokenStream:
    """A checked, memory-mapped token file."""

    path: str
    kind: TokenStreamKind
    tokens: np.ndarray  # memmap of `count` ids

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def count(self) -> int:
        return len(self)


def read_token_stream(path: str | os.PathLike, vocab_size: int | None = None, check_ids: bool = True) -> TokenStream:
    path = Path(path)
    size = regular_file_size(path, "token file")
    if size < HEADER_BYTES:
        raise FormatError(path, f"truncated: {size} bytes is shorter than the {HEADER_BYTES}-byte header")
    header = np.frombuffer(read_head(path, HEADER_BYTES, "token file"), dtype="<i4")
    magic, version, count = int(header[0]), int(header[1]), int(header[2])
    kind = TOKEN_STREAM_KINDS.get(magic)
    if kind is None:
        known = ", ".join(f"{m} ({k.name})" for m, k in TOKEN_STREAM_KINDS.items())
        raise FormatError(path, f"wrong magic number {magic} for a token stream (known: {known})")
    if version != kind.version:
        raise FormatError(path, f"unsupported {kind.name} token stream version {version} (expected {kind.version})")
    if count < 0:
        raise FormatError(path, f"header token count {count} is negative")
    width = np.dtype(kind.dtype).itemsize
    payload = size - HEADER_BYTES
    if payload != count * width:
        actual = payload / width
        actual_s = f"{int(actual)}" if payload % width == 0 else f"{actual:.1f}"
        raise FormatError(path, f"header says {count} tokens but the file holds {actual_s} "
                                f"({payload} payload bytes of {width}-byte tokens)")
    tokens = np.memmap(path, dtype=kind.dtype, mode="r", offset=HEADER_BYTES, shape=(count,)) if count else np.zeros(0, kind.dtype)
    limit = vocab_size if vocab_size is not None else kind.vocab_size
    if check_ids and count:
        top = _max_in_chunks(tokens)
        if top >= limit:
            where = int(np.argmax(tokens >= limit))
            raise FormatError(path, f"token id {int(tokens[where])} at position {where} is outside the vocabulary of {limit}")
    return TokenStream(path=str(path), kind=kind, tokens=tokens)


def token_stream_kind(name: str) -> TokenStreamKind:
    """The kind called `name` ("gpt2", "uint32", or a family that writes uint32: "llama3", "qwen3")."""
    try:
        return KIND_BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown token stream kind {name!r} (known: {', '.join(sorted(KIND_BY_NAME))})") from None


def write_token_stream(path: str | os.PathLike, tokens, kind: str = "gpt2", vocab_size: int | None = None) -> None:
    """Write a token file atomically, byte for byte as llm.c's `write_datafile` does.

    Ids must lie below `vocab_size` (the tokenizer's or model's) when given, else below the kind's limit.
    """
    k = token_stream_kind(kind)
    # Never above what the kind's integer width holds: a wider id would wrap silently.
    limit = min(vocab_size if vocab_size is not None else k.vocab_size, int(np.iinfo(k.dtype).max) + 1)
    arr = np.asarray(tokens)
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= limit):
        raise FormatError(path, f"token ids must lie in [0, {limit}) for a {k.name} stream")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = [k.magic, k.version, arr.size]
    with atomic_write(path, what="token file", size=header.nbytes + arr.size * np.dtype(k.dtype).itemsize) as f:
        f.write(header.tobytes())
        f.write(arr.astype(k.dtype).tobytes())


def _max_in_chunks(tokens: np.ndarray, chunk: int = 1 << 24) -> int:
    return max(int(tokens[i : i + chunk].max()) for i in range(0, tokens.shape[0], chunk))
