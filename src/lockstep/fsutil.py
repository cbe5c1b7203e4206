"""File access in one place: reads that turn every I/O and decoding error into a FormatError
naming the file, and writes whose every failure is a WriteError naming the file and the reason
in words ("no space left on device", "file too large", "permission denied").

Writes are atomic (written aside, renamed into place only when complete): a file lockstep failed
to write never exists under its final name. The file written aside is named so that it can be
recognised later, `.<name>.lockstep-<host>-<pid>-<random>.tmp`: a process killed outright (SIGKILL,
the OOM killer, a power cut) cannot remove it, so the next write of the same file removes every
such temporary of a process of this host that no longer runs (`remove_stale_temps`). A file that more than one lockstep process may make
at once (a cached checkpoint) is made by one of them under a lock while the others wait and
reuse it (`write_once`). What lockstep finds in its way and did not write is moved aside, never
deleted (`move_aside`).

Only regular files are read: opening a FIFO would block forever and a device may never end, so
both are refused before anything is read from them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import os
import re
import resource
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator

from lockstep.errors import FormatError, WriteError

# The reasons the user reads, fixed here: the C library's strerror may be translated by the
# locale, and says "operation not permitted" for EPERM where the user needs "permission denied".
_REASONS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only file system",
    errno.EIO: "input/output error",
    errno.ENOENT: "no such file or directory",
    errno.ENOTDIR: "not a directory",
    errno.EISDIR: "is a directory",
    errno.ENAMETOOLONG: "file name too long",
    errno.EMFILE: "too many open files",
}

# Below this much free space a failed write is put down to a full disk (write_failure_hint).
NEARLY_FULL_BYTES = 1 << 20

# What lockstep appends to the name of something it found in its way and moved aside.
MOVED_ASIDE_MARK = ".moved-by-lockstep-"
# The middle of an atomic write's temporary name: `.<name>.lockstep-<host>-<pid>-<random>.tmp`.
TEMP_MARK = ".lockstep-"
TEMP_SUFFIX = ".tmp"


def os_problem(e: OSError) -> str:
    """An OSError as the end of a sentence: "permission denied", "no space left on device"."""
    if e.errno in _REASONS:
        return _REASONS[e.errno]
    if isinstance(e, PermissionError):
        return "permission denied"
    text = e.strerror or (os.strerror(e.errno) if e.errno else str(e))
    return (text or type(e).__name__).lower()


def write_error(path: str | os.PathLike, e: OSError, what: str = "file") -> WriteError:
    """The one sentence every failed write of lockstep's ends in: the path, what it was, and why."""
    return WriteError(path, f"cannot write the {what}: {os_problem(e)}")


def os_error_sentence(e: OSError) -> str:
    """An OSError of unknown origin as a sentence naming its file where it has one."""
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{os_problem(e)}"


def format_bytes(n: int) -> str:
    """1,234,567,890 -> "1.23 GB" (decimal units, as disks are sold and `df -H` shows them)."""
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def free_bytes(directory: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem holding `directory` (or its
    nearest existing ancestor); None when the filesystem does not say."""
    p = Path(directory).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def write_failure_hint(directory: str | os.PathLike) -> str | None:
    """The likely reason a write into `directory` failed when the failing code could not say (SQLite's
    "disk I/O error", a file found cut short): "no space left on device (...)" when the filesystem is
    (nearly) full, "file too large (...)" when this process has a file-size limit; else None."""
    free = free_bytes(directory)
    if free is not None and free < NEARLY_FULL_BYTES:
        return f"no space left on device ({format_bytes(free)} free on the filesystem holding {directory})"
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY:
        return f"file too large (this process may write files of at most {format_bytes(soft)})"
    return None


def check_free_space(directory: str | os.PathLike, need_bytes: int, what: str,
                     path: str | os.PathLike | None = None) -> None:
    """Refuse, before any work, a write of `need_bytes` that the filesystem holding `directory`
    has no room for: one sentence naming the directory (or the file `path` about to be written
    there), what was to be written, how much it needs and how much is free, rather than a full
    disk after minutes of work."""
    free = free_bytes(directory)
    if free is not None and free < need_bytes:
        room = f"{directory} has {format_bytes(free)} free" if path is not None else f"{format_bytes(free)} are free"
        raise WriteError(path if path is not None else directory,
                         f"no space left on device for the {what}: it needs {format_bytes(need_bytes)}, {room}")


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
        raise write_error(path, e, what) from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise WriteError(path, f"cannot write the {what}: permission denied ({path.parent} is not writable)")
    return path


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", what: str = "file",
                 size: int | None = None) -> Iterator[IO]:
    """Write to a temporary file beside `path` and rename it into place only on success.

    Every OSError on the way (a parent that cannot be made, a read-only directory, a full disk
    or a file-size limit while writing, a directory in the way of the rename) becomes a
    WriteError naming `path` and the reason; the temporary file is removed. With `size` (the
    bytes about to be written) a filesystem without room for them is refused before writing."""
    path = check_writable_target(path, what)
    remove_stale_temps(path)  # before the free-space check: what they hold is free again
    if size is not None:
        check_free_space(path.parent, size, what, path=path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=TEMP_SUFFIX, dir=path.parent)
    except OSError as e:
        raise write_error(path, e, what) from None
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
            raise write_error(path, e, what) from None
        raise


def _host() -> str:
    # Only [A-Za-z0-9_] so that the name parses back unambiguously whatever the hostname holds.
    return re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"


def temp_prefix(path: Path, pid: int | None = None) -> str:
    """The start of the temporary name an atomic write of `path` by process `pid` uses."""
    return f".{path.name}{TEMP_MARK}{_host()}-{os.getpid() if pid is None else pid}-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def stale_temps(path: str | os.PathLike) -> list[tuple[Path, int]]:
    """(temporary file, pid) of every atomic write of `path` whose process, on this host, no longer
    runs. A temporary of another host (a shared filesystem) or of a live process is never stale:
    that write may still be going on. A pid reused since only keeps a stale file until it ends."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}{re.escape(TEMP_MARK)}{re.escape(_host())}-(\d+)-"
                         rf"[A-Za-z0-9_]+{re.escape(TEMP_SUFFIX)}")
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    out = []
    for name in names:
        m = pattern.fullmatch(name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            out.append((path.parent / name, int(m.group(1))))
    return sorted(out)


@dataclass(frozen=True)
class StaleTemp:
    """A temporary file of an atomic write whose process ended before renaming it, now removed."""

    path: Path
    pid: int
    size: int


def remove_stale_temps(path: str | os.PathLike) -> list[StaleTemp]:
    """Remove what `stale_temps` finds (regular files only); returns what was removed."""
    removed = []
    for tmp, pid in stale_temps(path):
        try:
            st = os.lstat(tmp)
            if stat.S_ISREG(st.st_mode):
                os.unlink(tmp)
                removed.append(StaleTemp(tmp, pid, st.st_size))
        except OSError:
            pass  # gone already (another writer cleaned it), or not ours to remove: leave it
    return removed


class NamedWrites:
    """A text file being streamed (a native log) whose failed writes say which file and why,
    as a WriteError, instead of a bare "[Errno 27] File too large" from deep in a training loop."""

    def __init__(self, f: IO, path: str | os.PathLike, what: str):
        self._f, self.path, self.what = f, Path(path), what

    def write(self, text: str) -> int:
        try:
            return self._f.write(text)
        except OSError as e:
            raise write_error(self.path, e, self.what) from None

    def flush(self) -> None:
        try:
            self._f.flush()
        except OSError as e:
            raise write_error(self.path, e, self.what) from None

    def __getattr__(self, name):
        return getattr(self._f, name)


@contextlib.contextmanager
def open_for_streaming(path: str | os.PathLike, what: str = "log") -> Iterator[NamedWrites]:
    """Open a text file that is written while something runs (so it cannot be written aside):
    every failure to open, write or close it is a WriteError naming it."""
    path = Path(path)
    try:
        f = open(path, "w")
    except OSError as e:
        raise write_error(path, e, what) from None
    try:
        yield NamedWrites(f, path, what)
    finally:
        try:
            f.close()
        except OSError as e:
            raise write_error(path, e, what) from None


def move_aside(path: str | os.PathLike, stamp: str) -> Path:
    """Rename `path` (a file or a directory lockstep did not write, in the way of one it will) to
    `<name>.moved-by-lockstep-<stamp>` beside it, never over anything that exists; returns the
    new path. Nothing is deleted."""
    path = Path(path)
    for i in itertools.count(1):
        target = path.with_name(f"{path.name}{MOVED_ASIDE_MARK}{stamp}" + (f"-{i}" if i > 1 else ""))
        if not os.path.lexists(target):
            break
    try:
        os.rename(path, target)
    except OSError as e:
        raise WriteError(path, f"cannot move it aside to {target.name}: {os_problem(e)}") from None
    return target


def lock_path_for(path: str | os.PathLike) -> Path:
    """The lock file that guards the making of `path`: a hidden sibling, `.<name>.lock`."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def exclusive_lock(lock_path: str | os.PathLike, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path` for the block, across processes. When another process
    holds it, `on_wait` is called once and this one waits (a signal still interrupts the wait).
    The lock file stays: removing it would race with a process that is just opening it."""
    lock_path = Path(lock_path)
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as e:
        raise write_error(lock_path, e, "lock file") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def write_once(path: str | os.PathLike, is_complete: Callable[[Path], bool], write: Callable[[Path], None],
               on_wait: Callable[[], None] | None = None) -> bool:
    """Make `path` with `write` (which must write atomically) unless `is_complete` says a good one
    is there; when several processes need it at once, one writes while the others wait on its
    lock file and then reuse what it wrote. Returns True when this process wrote it."""
    path = Path(path)
    if is_complete(path):
        return False
    with exclusive_lock(lock_path_for(path), on_wait):
        if is_complete(path):  # another process made it while this one waited
            return False
        write(path)
        return True


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
