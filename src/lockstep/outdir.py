"""The run directory of `lockstep run`: checked, locked, cleared and marked while a run owns it.

A run directory is lockstep's when it holds `run.json`. While a run writes into it, that run
holds an exclusive `flock` on `.lockstep.lock` inside it, so a second `lockstep run` into the
same `--out` stops with one sentence before touching anything. Old outputs of an earlier run
are cleared only once the lock is held. `run.json` is written first with status "running" and
rewritten at the end as "finished", or "interrupted" / "failed" when the run did not end; the
summary is written only by a run that got to its comparison, so no summary can speak for a run
that never happened.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Iterator

from lockstep.errors import LockstepError
from lockstep.fsutil import atomic_write

RUN_MANIFEST = "run.json"
LOCK_NAME = ".lockstep.lock"
# What a run writes besides the framework directories (which are named after the runners);
# only these are cleared when a lockstep run directory is reused.
RUN_OUTPUT_FILES = ("summary.json", "report.html", "report.md")
RUN_OUTPUT_DIRS = ("report_files",)

STATUS_RUNNING, STATUS_FINISHED, STATUS_INTERRUPTED, STATUS_FAILED = "running", "finished", "interrupted", "failed"


class OutDirError(LockstepError):
    """`--out` cannot be used: not a directory, not writable, someone else's files, or in use."""


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def check_out_dir(out: Path, force: bool = False) -> None:
    """Refuse an unusable `--out` before anything is planned or written (creates nothing)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutDirError(f"{out}: --out is a file, not a directory; choose another --out")
    if out.is_dir():
        if not os.access(out, os.W_OK | os.X_OK):
            raise OutDirError(f"{out}: output directory is not writable; choose another --out")
        _refuse_foreign(out, force)
        _refuse_if_locked(out)
    else:
        parent = _existing_parent(out)
        if not parent.is_dir():
            raise OutDirError(f"{out}: cannot create the output directory ({parent} is a file)")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutDirError(f"{out}: cannot create the output directory ({parent} is not writable)")


def _existing_parent(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _entries(out: Path) -> list[str]:
    try:
        return sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME)
    except OSError as e:
        raise OutDirError(f"{out}: cannot list the output directory ({_reason(e)})") from None


def _refuse_foreign(out: Path, force: bool) -> None:
    entries = _entries(out)
    if entries and RUN_MANIFEST not in entries and not force:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise OutDirError(f"{out}: output directory is not empty ({shown}) and was not written by lockstep run; "
                          "choose another --out, empty it, or pass --force to write into it anyway")


def _holder(lock_path: Path) -> str:
    try:
        info = lock_path.read_text().strip()
    except OSError:
        return ""
    return f" ({info})" if info else ""


def _refuse_if_locked(out: Path) -> None:
    lock_path = out / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return  # no lock file: nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise OutDirError(_in_use_message(out)) from None
    finally:
        os.close(fd)


def _in_use_message(out: Path) -> str:
    return (f"{out}: another lockstep run is writing to this directory{_holder(out / LOCK_NAME)}; "
            "wait for it to end or choose another --out")


class RunDir:
    """A locked run directory. Use as a context manager; `finish`/`interrupt` mark run.json."""

    def __init__(self, path: Path, lock_fd: int):
        self.path = path
        self._lock_fd: int | None = lock_fd

    @property
    def manifest_path(self) -> Path:
        return self.path / RUN_MANIFEST

    def write_manifest(self, manifest: dict) -> None:
        try:
            with atomic_write(self.manifest_path, "w") as f:
                json.dump(manifest, f, indent=2)
                f.write("\n")
        except OSError as e:
            raise OutDirError(f"{self.manifest_path}: cannot write the run manifest ({_reason(e)})") from None

    def read_manifest(self) -> dict:
        try:
            return json.loads(self.manifest_path.read_text())
        except (OSError, ValueError):
            return {}

    def update_manifest(self, **fields) -> None:
        self.write_manifest({**self.read_manifest(), **fields})

    def mark(self, status: str, **fields) -> None:
        """Record how the run ended. A run that did not finish leaves no summary behind."""
        if status != STATUS_FINISHED:
            for name in RUN_OUTPUT_FILES:
                (self.path / name).unlink(missing_ok=True)
        self.update_manifest(status=status, finished_at=now_iso(), **fields)

    def release(self) -> None:
        if self._lock_fd is not None:
            # The lock file stays (removing it would race with a run that is just opening it);
            # an unlocked file holds no lock.
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is not None and self.read_manifest().get("status") == STATUS_RUNNING:
                interrupted = issubclass(exc_type, KeyboardInterrupt)
                try:
                    self.mark(STATUS_INTERRUPTED if interrupted else STATUS_FAILED,
                              **({} if interrupted else {"error": str(exc) or exc_type.__name__}))
                except (OSError, LockstepError):
                    pass  # the original error says more than a failure to record it
        finally:
            self.release()


def open_run_dir(out: Path, framework_dirs: list[str], manifest: dict, force: bool = False) -> RunDir:
    """Create or reuse `out`, lock it for this run, clear an earlier run's outputs and write
    run.json marked "running". Raises OutDirError, having changed nothing, when `out` is not
    usable or another run holds it."""
    out = Path(out)
    check_out_dir(out, force)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutDirError(f"{out}: cannot create the output directory ({_reason(e)})") from None
    fd = _lock(out)
    run_dir = RunDir(out, fd)
    try:
        _refuse_foreign(out, force)  # again, now that nobody else can be writing
        _clear_earlier_outputs(out, framework_dirs)
        run_dir.write_manifest({"status": STATUS_RUNNING, "started_at": now_iso(), "pid": os.getpid(),
                                "command": shlex.join(sys.argv), **manifest})
    except BaseException:
        run_dir.release()
        raise
    return run_dir


def _lock(out: Path) -> int:
    """Take `out`'s exclusive lock, saying who holds it; OutDirError when another process does."""
    try:
        fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise OutDirError(f"{out}: output directory is not writable (cannot create {LOCK_NAME}: {_reason(e)}); "
                          "choose another --out") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise OutDirError(_in_use_message(out)) from None
        raise OutDirError(f"{out}: cannot lock the output directory ({_reason(e)})") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, started {now_iso()}\n".encode())
    except BaseException:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def locked_dir(out: Path) -> Iterator[Path]:
    """Hold `out`'s lock for a command that owns the whole directory (`lockstep bisect`, whose
    run directories lie inside it), the way a run holds its run directory: a second command into
    the same `out` gets one sentence. The caller checks what `out` holds."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutDirError(f"{out}: cannot create the output directory ({_reason(e)})") from None
    fd = _lock(out)
    try:
        yield out
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _clear_earlier_outputs(out: Path, framework_dirs: list[str]) -> None:
    """Remove lockstep's own outputs of an earlier run, so that no stale record or summary is
    read as if it came from this one. Nothing else in the directory is touched."""
    try:
        for name in framework_dirs:
            if (out / name).is_dir():
                shutil.rmtree(out / name)
        for name in RUN_OUTPUT_FILES:
            (out / name).unlink(missing_ok=True)
        for name in RUN_OUTPUT_DIRS:
            if (out / name).is_dir():
                shutil.rmtree(out / name)
    except OSError as e:
        raise OutDirError(f"{e.filename or out}: cannot clear the earlier run's outputs ({_reason(e)})") from None


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
