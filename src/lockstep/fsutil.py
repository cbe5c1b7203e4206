"""File access in one place: reads that turn every I/O and decoding error into a FormatError
naming the file, and atomic writes (a reader never sees a half-written file under its final
name) whose failures (read-only directory, disk full, a directory in the way) do the same.

Only regular files are read: opening a FIFO would block forever and a device may never end, so
both are refused before anything is read from them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Iterator

from lockstep.errors import FormatError


def os_problem(e: OSError) -> str:
    """An OSError as the end of a sentence: "permission denied", "no space left on device"."""
    if isinstance(e, PermissionError):
        return "permission denied"
    text = e.strerror or (os.strerror(e.errno) if e.errno else str(e))
    return (text or type(e).__name__).lower()


def regular_file_size(path: str | os.PathLike, what: str = "file") -> int:
    """The size of `path` after checking that it is a regular file that exists and can be
    stat'ed; raises FormatError naming the file and calling it `what` otherwise."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FormatError(path, "no such file") from None
    except OSError as e:
        raise FormatError(path, f"cannot read the {what}: {os_problem(e)}") from None
    _check_regular(path, st, what)
    return st.st_size


def _check_regular(path: Path, st: os.stat_result, what: str) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise FormatError(path, f"is a directory, not a {what}")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise FormatError(path, f"is {kind}, not a {what} (only regular files are read)")


def read_bytes(path: str | os.PathLike, what: str = "file", limit: int = -1) -> bytes:
    """The whole content of a regular file; FormatError naming the file for anything else."""
    path = Path(path)
    regular_file_size(path, what)  # before open(): opening a FIFO for reading blocks
    try:
        # O_NONBLOCK: should a FIFO replace the file after the check, open() still returns.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FormatError(path, "no such file") from None
    except OSError as e:
        raise FormatError(path, f"cannot read the {what}: {os_problem(e)}") from None
    try:
        _check_regular(path, os.fstat(fd), what)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit)
    except OSError as e:
        raise FormatError(path, f"cannot read the {what}: {os_problem(e)}") from None
    finally:
        os.close(fd)


def read_head(path: str | os.PathLike, size: int, what: str = "file") -> bytes:
    """The first `size` bytes (fewer when the file is shorter) of a regular file, e.g. a header."""
    return read_bytes(path, what, limit=size)


def read_text(path: str | os.PathLike, what: str = "file", errors: str = "strict") -> str:
    """A regular file decoded as UTF-8; FormatError naming the file and the first bad byte when it
    is not UTF-8 (with `errors="replace"` undecodable bytes become U+FFFD instead)."""
    raw = read_bytes(path, what)
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise FormatError(path, f"is not UTF-8 text: byte 0x{raw[e.start]:02x} at offset {e.start} "
                                f"(line {line}) cannot be decoded; is it a {what}?") from None


def check_writable_target(path: str | os.PathLike, what: str = "file") -> Path:
    """Refuse, before any work, an output path that can never be written as a file: a directory,
    something that is not a regular file, or a parent that is a file."""
    path = Path(path)
    if path.is_dir():
        raise FormatError(path, f"is a directory; give a file name for the {what}")
    if path.exists() and not path.is_file():
        raise FormatError(path, f"exists and is not a regular file; cannot write the {what} there")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise FormatError(path, f"cannot write the {what}: {parent} is not a directory")
            break
    return path


def prepare_output_file(path: str | os.PathLike, what: str = "file") -> Path:
    """Check an output path before the work that fills it, and make its directory: a path that
    can never be written fails now, with one sentence, instead of after minutes of work."""
    path = check_writable_target(path, what)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FormatError(path, f"cannot write the {what}: {os_problem(e)}") from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise FormatError(path, f"cannot write the {what}: {path.parent} is not writable")
    return path


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", what: str = "file") -> Iterator[IO]:
    """Write to a temporary file beside `path` and rename it into place only on success.

    Every OSError on the way (a parent that cannot be made, a read-only directory, a full disk
    while writing, a directory in the way of the rename) becomes a FormatError naming `path`."""
    path = check_writable_target(path, what)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise FormatError(path, f"cannot write the {what}: {os_problem(e)}") from None
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file 0600; give it the mode a plain open() would have.
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise FormatError(path, f"cannot write the {what}: {os_problem(e)}") from None
        raise


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    regular_file_size(path)
    try:
        with open(path, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
    except OSError as e:
        raise FormatError(path, f"cannot be read: {os_problem(e)}") from None
    return h.hexdigest()


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
