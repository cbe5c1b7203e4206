"""The run directory of `lockstep run`: checked, locked, cleared and marked while a run owns it.

A run directory is lockstep's when its `run.json` says so: a JSON object whose "schema" is
`lockstep.run/1` (RUN_SCHEMA). Any other non-empty directory is someone else's, whatever it
holds (another tool's `run.json`, a `pytorch/` folder): refused unless `--force`, and even then
nothing in it is deleted or overwritten: what is in the way of lockstep's own names is moved
aside as `<name>.moved-by-lockstep-<UTC time>`, said on the terminal and listed in run.json.

While a run writes into a directory, it holds an exclusive `flock` on `.lockstep.lock` inside
it, so a second `lockstep run` into the same `--out` stops with one sentence before touching
anything. Only once the lock is held are an earlier run's outputs cleared, and only the files
that earlier run wrote (its run.json names its cases and frameworks): a user's file inside
`pytorch/` stays, and one that would be read as a record of this run is moved aside.
`run.json` is written first with status "running" and rewritten at the end as "finished", or
"interrupted" / "failed" when the run did not end; the summary is written only by a run that
got to its comparison, so no summary can speak for a run that never happened.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from lockstep.compare.pairing import EVIDENCE_DIR, STEP1_DIR, is_case_file_name
from lockstep.errors import LockstepError
from lockstep.formats.run_manifest import RUN_MANIFEST, RUN_SCHEMA, lockstep_manifest, read_manifest, write_manifest
from lockstep.fsutil import move_aside, os_problem

LOCK_NAME = ".lockstep.lock"
# What a run writes besides the framework directories (which are named after the runners);
# only these are cleared when a lockstep run directory is reused.
RUN_OUTPUT_FILES = ("summary.json", "report.html", "report.md")
RUN_OUTPUT_DIRS = ("report_files",)
# How lockstep knows these files for its own when a run reuses the directory (a user's file of
# the same name is moved aside, never deleted): the reports carry REPORT_MARK (report.html in its
# <head>, report.md in its last line), their plots carry it as the PNG's "Software" text chunk, and
# summary.json is a JSON object with the keys compare_run_dir writes.
REPORT_MARK = "lockstep.report/1"
SUMMARY_KEYS = ("run_dir", "baseline", "frameworks", "comparisons")
# What a run writes per case inside a framework directory (`<case>.save`: InfiniTrain's own
# checkpoint, made to read its final parameters back; `.certificate.json`: the pair's step-1
# certificate), in step1/<framework>/ (`<case>.npz`, the captures, and work/, what a capture
# run wrote on the way) and in evidence/ (`<case>.fp64.jsonl`); `<case>.log.partial` is the log of a
# case that was stopped before it ended (runners/base.py).
CASE_OUTPUT_SUFFIXES = (".log", ".jsonl", ".final.npz", ".certificate.json", ".npz", ".fp64.jsonl", ".log.partial")
CASE_OUTPUT_DIR_SUFFIX = ".save"
# A case's step folders, `<case>.checkpoints/` beside its log (runners/checkpoint_plan.checkpoints_root).
# Kept for a later resume when the run that wrote them was recorded; moved aside when that run was
# killed (its run.json still says "running"): its workers may have written them after lockstep died.
CHECKPOINTS_DIR_SUFFIX = ".checkpoints"
CAPTURE_WORK_DIR = "work"

STATUS_RUNNING, STATUS_FINISHED, STATUS_INTERRUPTED, STATUS_FAILED = "running", "finished", "interrupted", "failed"


class OutDirError(LockstepError):
    """`--out` cannot be used: not a directory, not writable, someone else's files, or in use."""


@dataclass(frozen=True)
class MovedAside:
    """Something lockstep did not write, found where it writes, and renamed (paths relative to --out)."""

    original: str
    moved_to: str

    def to_json(self) -> dict:
        return {"from": self.original, "to": self.moved_to}


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
        raise OutDirError(f"{out}: cannot list the output directory ({os_problem(e)})") from None


def _foreign_reason(out: Path) -> str | None:
    """Why `out` is someone else's directory, or None when it is empty or lockstep's own."""
    entries = _entries(out)
    if not entries:
        return None
    manifest, why_not = lockstep_manifest(out)
    if manifest is not None:
        return None
    shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
    return f"is not empty ({shown}) and was not written by lockstep run: {why_not}"


def _refuse_foreign(out: Path, force: bool, reason: str | None = None) -> None:
    reason = reason or _foreign_reason(out)
    if reason and not force:
        raise OutDirError(f"{out}: output directory {reason}; choose another --out, empty it, or pass --force "
                          "(lockstep then moves what is in its way aside, and deletes nothing)")


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
    """A locked run directory. Use as a context manager; `finish`/`interrupt` mark run.json.
    `moved_aside`: what this run found in its way and renamed (also in run.json)."""

    def __init__(self, path: Path, lock_fd: int):
        self.path = path
        self._lock_fd: int | None = lock_fd
        self.moved_aside: list[MovedAside] = []

    @property
    def manifest_path(self) -> Path:
        return self.path / RUN_MANIFEST

    def write_manifest(self, manifest: dict) -> None:
        write_manifest(self.path, manifest)

    def read_manifest(self) -> dict:
        return read_manifest(self.path)

    def update_manifest(self, **fields) -> None:
        self.write_manifest({**self.read_manifest(), **fields})

    def mark(self, status: str, **fields) -> None:
        """Record how the run ended. A run that did not finish leaves no summary behind (what is
        there now was written by this run: the earlier run's was cleared when it started)."""
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
    """Create or reuse `out`, lock it for this run, clear an earlier run's outputs (or, in a
    directory lockstep did not write, with `force`, move what is in the way aside) and write
    run.json marked "running". Raises OutDirError, having changed nothing, when `out` is not
    usable, someone else's (without `force`), or another run holds it."""
    out = Path(out)
    check_out_dir(out, force)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutDirError(f"{out}: cannot create the output directory ({os_problem(e)})") from None
    fd = _lock(out)
    run_dir = RunDir(out, fd)
    try:
        foreign = _foreign_reason(out)  # again, now that nobody else can be writing
        _refuse_foreign(out, force, foreign)
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        if foreign:
            run_dir.moved_aside = _move_foreign_aside(out, framework_dirs, stamp)
        else:
            earlier, _ = lockstep_manifest(out)
            coming = [c["name"] for c in manifest.get("cases", []) if isinstance(c, dict) and _safe_name(c.get("name"))]
            run_dir.moved_aside = _clear_earlier_outputs(out, framework_dirs, earlier or {}, coming, stamp)
        run_dir.write_manifest({"status": STATUS_RUNNING, "started_at": now_iso(), "pid": os.getpid(),
                                "command": shlex.join(sys.argv), **manifest,
                                "moved_aside": [m.to_json() for m in run_dir.moved_aside]})
    except BaseException:
        run_dir.release()
        raise
    return run_dir


def _lock(out: Path) -> int:
    """Take `out`'s exclusive lock, saying who holds it; OutDirError when another process does."""
    try:
        fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise OutDirError(f"{out}: output directory is not writable (cannot create {LOCK_NAME}: {os_problem(e)}); "
                          "choose another --out") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise OutDirError(_in_use_message(out)) from None
        raise OutDirError(f"{out}: cannot lock the output directory ({os_problem(e)})") from None
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
        raise OutDirError(f"{out}: cannot create the output directory ({os_problem(e)})") from None
    fd = _lock(out)
    try:
        yield out
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def lockstep_top_level_names(framework_dirs: list[str]) -> list[str]:
    """Every name a run writes at the top of --out (the lock file aside)."""
    return [RUN_MANIFEST, *RUN_OUTPUT_FILES, *RUN_OUTPUT_DIRS, *framework_dirs]


def _move_foreign_aside(out: Path, framework_dirs: list[str], stamp: str) -> list[MovedAside]:
    """In a directory lockstep did not write: rename every entry that has one of lockstep's names
    (a `run.json`, a `pytorch/` folder, ...) so that lockstep neither reads nor overwrites it."""
    moved = []
    for name in lockstep_top_level_names(framework_dirs):
        if os.path.lexists(out / name):
            moved.append(MovedAside(name, _move(out, out / name, stamp)))
    return moved


def _move(out: Path, path: Path, stamp: str) -> str:
    try:
        return str(move_aside(path, stamp).relative_to(out))
    except LockstepError as e:
        raise OutDirError(str(e)) from None


def report_image_name(case: str) -> str:
    """The file of a case's plot in `report_files/` (case names are file-name safe, but a path is not)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", case) + ".png"


def _clear_earlier_outputs(out: Path, framework_dirs: list[str], earlier: dict, coming_cases: list[str],
                           stamp: str) -> list[MovedAside]:
    """In lockstep's own directory: remove the outputs of the earlier run that its run.json
    accounts for (per framework directory, repeats included, `<case>.log`, `.jsonl`, `.final.npz`
    and `.save/` of its cases; summary.json, the reports and their plots), so that no stale record
    or summary is read as if it came from this run. A file lockstep would read as a record or log
    of this run but did not write is moved aside; anything else (a user's notes in `pytorch/`) stays."""
    cases = [c["name"] for c in earlier.get("cases", []) if isinstance(c, dict) and _safe_name(c.get("name"))]
    frameworks = {f for f in earlier.get("frameworks", []) if _safe_name(f)}
    moved: list[MovedAside] = []
    try:
        for name in RUN_OUTPUT_FILES:
            path = out / name
            if path.is_file() and not path.is_symlink() and is_lockstep_output(path):
                path.unlink()
            elif os.path.lexists(path):  # a user's file of that name: this run would write over it
                moved.append(MovedAside(name, _move(out, path, stamp)))
        images = out / RUN_OUTPUT_DIRS[0]
        if images.is_dir() and not images.is_symlink():
            for case in cases:
                path = images / report_image_name(case)
                if path.is_file() and not path.is_symlink() and is_lockstep_output(path):
                    path.unlink()
            for case in coming_cases:  # a plot this run would write over
                if os.path.lexists(images / report_image_name(case)):
                    path = images / report_image_name(case)
                    moved.append(MovedAside(str(path.relative_to(out)), _move(out, path, stamp)))
            _remove_if_empty(images)
        for top in framework_dirs:
            if (out / top).is_dir() and not (out / top).is_symlink():
                moved += _clear_tree(out, out / top, cases, frameworks, stamp,
                                     killed=earlier.get("status") == STATUS_RUNNING)
    except OSError as e:
        raise OutDirError(f"{e.filename or out}: cannot clear the earlier run's outputs ({os_problem(e)})") from None
    return moved


def is_lockstep_output(path: Path) -> bool:
    """Whether a file at the top of a run directory (or one of its report plots) is one lockstep
    wrote, by its content: a user's report.md or summary.json of the same name is not."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            tail = f.read()
    except OSError:
        return False
    if path.name == "summary.json":
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(doc, dict) and all(k in doc for k in SUMMARY_KEYS)
    mark = REPORT_MARK.encode()
    return mark in head or mark in tail


def _clear_tree(out: Path, top: Path, cases: list[str], frameworks: set[str], stamp: str,
                killed: bool = False) -> list[MovedAside]:
    """One of lockstep's directories (`pytorch/`, or `repeats/` holding `<k>/<framework>/`);
    `killed`: the earlier run never marked its end (see CHECKPOINTS_DIR_SUFFIX)."""
    moved: list[MovedAside] = []
    lockstep_dirs = [top]
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        dirnames.sort()
        if here.name in frameworks or here == top and top.name == EVIDENCE_DIR:
            lockstep_dirs.append(here)
            if here.parent.name == STEP1_DIR and (here / CAPTURE_WORK_DIR).is_dir():
                shutil.rmtree(here / CAPTURE_WORK_DIR)
                dirnames[:] = [d for d in dirnames if d != CAPTURE_WORK_DIR]
            if killed:
                moved += _move_checkpoints_aside(out, here, cases, stamp, dirnames)
            for case in cases:
                for suffix in CASE_OUTPUT_SUFFIXES:
                    if (here / f"{case}{suffix}").is_file():
                        (here / f"{case}{suffix}").unlink()
                save = here / f"{case}{CASE_OUTPUT_DIR_SUFFIX}"
                if save.is_dir() and not save.is_symlink():
                    shutil.rmtree(save)
                    dirnames[:] = [d for d in dirnames if d != save.name]
            if here.parent != top and here.parent.name.isdigit():
                lockstep_dirs.append(here.parent)  # repeats/<k>/
        for name in sorted(filenames):
            if not os.path.lexists(here / name):
                continue  # the earlier run's, removed above
            if is_case_file_name(name) or name.endswith(".final.npz"):
                moved.append(MovedAside(str((here / name).relative_to(out)), _move(out, here / name, stamp)))
    for d in sorted(set(lockstep_dirs), key=lambda p: len(p.parts), reverse=True):
        _remove_if_empty(d)
    return moved


def _move_checkpoints_aside(out: Path, here: Path, cases: list[str], stamp: str, dirnames: list[str]) -> list[MovedAside]:
    """The killed run's `<case>.checkpoints/` in one framework directory, moved aside (and not walked)."""
    moved: list[MovedAside] = []
    for case in cases:
        folder = here / f"{case}{CHECKPOINTS_DIR_SUFFIX}"
        if folder.is_dir() and not folder.is_symlink():
            moved.append(MovedAside(str(folder.relative_to(out)), _move(out, folder, stamp)))
            dirnames[:] = [d for d in dirnames if d != folder.name]
    return moved


def _remove_if_empty(directory: Path) -> None:
    """rmdir a directory lockstep made, only when nothing is left in it (a user's file keeps it)."""
    try:
        directory.rmdir()
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
            raise


def _safe_name(name) -> bool:
    """A case or framework name from run.json that names a file in one directory, nothing more."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
