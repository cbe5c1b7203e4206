"""The run history: one SQLite file that every `lockstep run` and `lockstep compare` appends to.

Why SQLite: CI jobs on one machine append at the same time, and a reader must never see half a
run. WAL lets readers go on while one writer writes; `busy_timeout` makes a second writer wait
for the first instead of failing; each run is one `BEGIN IMMEDIATE ... COMMIT`, so a run is in
the file whole or not at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from lockstep.errors import LockstepError, WriteError
from lockstep.fsutil import write_failure_hint

SCHEMA_VERSION = 1
HISTORY_ENV = "LOCKSTEP_HISTORY"
BUSY_TIMEOUT_MS = 60_000  # a writer waits this long for another run's transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    recorded_at TEXT NOT NULL,        -- UTC, ISO 8601
    kind TEXT NOT NULL,               -- "run" | "compare"
    source TEXT NOT NULL,             -- the run dir, or "BASELINE vs TEST" for compare
    lockstep_commit TEXT,
    baseline_framework TEXT,
    passed INTEGER,                   -- 1, 0, or NULL when nothing was judged
    host TEXT
);
CREATE TABLE IF NOT EXISTS results (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    case_name TEXT NOT NULL,
    framework TEXT NOT NULL,
    role TEXT NOT NULL,               -- "baseline" | "test"
    verdict TEXT,                     -- a policy class (PASS, PASS within logging precision, FAIL, FAIL unexplained,
                                      -- ERROR), SKIPPED, or NULL (baseline, or not compared)
    reason TEXT,                      -- the error or skip reason
    framework_commit TEXT,            -- InfiniTrain build commit, else lockstep's commit for pytorch/megatron
    framework_version TEXT,
    framework_build TEXT,             -- InfiniTrain build dir
    torch_version TEXT,
    megatron_core_version TEXT,
    device TEXT,
    device_name TEXT,
    dtype TEXT,
    steps INTEGER,
    losses TEXT,                      -- JSON list, step 1 first
    max_abs_diff REAL,
    max_diff_step INTEGER,
    threshold REAL,
    tps_median REAL,                  -- tok/s over steps 2..N
    tps_min REAL,
    tps_max REAL,
    tps_cv REAL,                      -- sample stdev / mean (compare's coefficient_of_variation)
    PRIMARY KEY (run_id, case_name, framework)
);
CREATE INDEX IF NOT EXISTS results_by_case ON results (case_name, framework);
"""


@dataclass
class ResultRow:
    """One (case, framework) of a run as the history keeps it."""

    case: str
    framework: str
    role: str
    verdict: str | None = None
    reason: str | None = None
    framework_commit: str | None = None
    framework_version: str | None = None
    framework_build: str | None = None
    torch_version: str | None = None
    megatron_core_version: str | None = None
    device: str | None = None
    device_name: str | None = None
    dtype: str | None = None
    losses: list[float] = field(default_factory=list)
    max_abs_diff: float | None = None
    max_diff_step: int | None = None
    threshold: float | None = None
    tps_median: float | None = None
    tps_min: float | None = None
    tps_max: float | None = None
    tps_cv: float | None = None


@dataclass
class RunRow:
    run_id: str
    recorded_at: str
    kind: str
    source: str
    lockstep_commit: str | None = None
    baseline_framework: str | None = None
    passed: bool | None = None
    host: str | None = None
    results: list[ResultRow] = field(default_factory=list)


_RESULT_COLUMNS = ["case_name", "framework", "role", "verdict", "reason", "framework_commit", "framework_version",
                   "framework_build", "torch_version", "megatron_core_version", "device", "device_name", "dtype",
                   "steps", "losses", "max_abs_diff", "max_diff_step", "threshold", "tps_median", "tps_min",
                   "tps_max", "tps_cv"]


def default_history_path() -> Path:
    """$LOCKSTEP_HISTORY, else $XDG_DATA_HOME/lockstep/history.sqlite, else ~/.local/share/lockstep/..."""
    if os.environ.get(HISTORY_ENV):
        return Path(os.environ[HISTORY_ENV]).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "lockstep" / "history.sqlite"


class HistoryStore:
    """Open with `HistoryStore(path)`; every method opens and closes its own connection, so a
    store object can be handed to another process by its path alone."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    # -- connections ------------------------------------------------------------------------

    def _problem(self, e: sqlite3.Error) -> LockstepError:
        """A failed write is not a damaged file: it says why (the disk, a limit, permission), and
        the file is left as it was (the transaction is rolled back)."""
        name = getattr(e, "sqlite_errorname", "") or ""
        if name == "SQLITE_FULL":
            return WriteError(self.path, "cannot write the history database: no space left on device")
        if name.startswith("SQLITE_READONLY"):
            return WriteError(self.path, "cannot write the history database: permission denied or a read-only "
                                         "file system")
        if name.startswith("SQLITE_IOERR"):
            # SQLite reports ENOSPC as SQLITE_FULL, but every other failed write (a file-size limit,
            # a quota) only as "disk I/O error": say the likely cause where the machine shows one.
            reason = write_failure_hint(self.path.absolute().parent) or f"disk I/O error ({name})"
            return WriteError(self.path, f"cannot write the history database: {reason}")
        return LockstepError(f"{self.path}: cannot use it as the lockstep history database "
                             f"(SQLite: {e}); move the file away or choose another with --history")

    @contextlib.contextmanager
    def _connect(self, create: bool) -> Iterator[sqlite3.Connection]:
        if not create and not self.path.is_file():
            raise LockstepError(f"{self.path}: no history database there yet (lockstep run and compare "
                                "write it; --history FILE or LOCKSTEP_HISTORY choose another)")
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we say BEGIN/COMMIT ourselves, so a run is exactly one transaction.
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        except (sqlite3.Error, OSError) as e:
            raise LockstepError(f"{self.path}: cannot open the history database ({e})") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._set_wal(conn)
            self._ensure_schema(conn)
            yield conn
        except sqlite3.IntegrityError as e:
            raise LockstepError(f"{self.path}: a run could not be added ({e}); nothing of it was written") from None
        except sqlite3.DatabaseError as e:
            raise self._problem(e) from None
        finally:
            conn.close()

    @staticmethod
    def _set_wal(conn: sqlite3.Connection) -> None:
        # Switching to WAL takes a lock of its own that busy_timeout does not always cover while
        # another process creates the file; retry for a while rather than fail a finished run.
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL").fetchone()
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        has_version = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'").fetchone()
        if not has_version:
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Statement by statement: executescript() would COMMIT behind our back.
                for stmt in filter(str.strip, _SCHEMA.split(";")):
                    conn.execute(stmt)
                if not conn.execute("SELECT version FROM schema_version").fetchone():
                    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        if row is None or row[0] != SCHEMA_VERSION:
            raise LockstepError(f"{self.path}: history schema version {row[0] if row else None}, this lockstep "
                                f"reads version {SCHEMA_VERSION}; use a matching lockstep or another --history file")

    # -- writing ----------------------------------------------------------------------------

    def append(self, run: RunRow) -> None:
        """Add one run and all its results in one transaction."""
        with self._connect(create=True) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("INSERT INTO runs (run_id, recorded_at, kind, source, lockstep_commit, baseline_framework, "
                             "passed, host) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             (run.run_id, run.recorded_at, run.kind, run.source, run.lockstep_commit,
                              run.baseline_framework, None if run.passed is None else int(run.passed), run.host))
                marks = ", ".join("?" * (len(_RESULT_COLUMNS) + 1))
                for r in run.results:
                    d = asdict(r)
                    values = [run.run_id, r.case] + [
                        json.dumps(r.losses) if c == "losses" else len(r.losses) if c == "steps" else d[c]
                        for c in _RESULT_COLUMNS[1:]]
                    conn.execute(f"INSERT INTO results (run_id, {', '.join(_RESULT_COLUMNS)}) VALUES ({marks})", values)
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

    # -- reading ----------------------------------------------------------------------------

    def runs(self, limit: int | None = None) -> list[RunRow]:
        """Runs, oldest first (the last `limit` of them), with their results."""
        with self._connect(create=False) as conn:
            rows = conn.execute("SELECT run_id, recorded_at, kind, source, lockstep_commit, baseline_framework, passed, "
                                "host FROM runs ORDER BY recorded_at, rowid").fetchall()
            if limit is not None:
                rows = rows[-limit:] if limit > 0 else []
            return [self._run_from_row(conn, row) for row in rows]

    def run(self, run_id: str) -> RunRow:
        """The run with this id, or the one run whose id starts with it."""
        with self._connect(create=False) as conn:
            rows = conn.execute("SELECT run_id, recorded_at, kind, source, lockstep_commit, baseline_framework, passed, "
                                "host FROM runs WHERE run_id = ? OR run_id LIKE ? ESCAPE '\\' ORDER BY rowid",
                                (run_id, run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
                                ).fetchall()
            exact = [r for r in rows if r[0] == run_id]
            if exact:
                rows = exact
            if not rows:
                raise LockstepError(f"{self.path}: no run {run_id} in the history (lockstep history lists them)")
            if len(rows) > 1:
                raise LockstepError(f"{self.path}: {len(rows)} runs start with {run_id} "
                                    f"({', '.join(r[0] for r in rows[:3])}...); give more of the id")
            return self._run_from_row(conn, rows[0])

    def results_for(self, case: str, framework: str) -> list[tuple[RunRow, ResultRow]]:
        """Every run's result for one (case, framework), oldest first."""
        with self._connect(create=False) as conn:
            ids = [r[0] for r in conn.execute(
                "SELECT runs.run_id FROM results JOIN runs ON runs.run_id = results.run_id "
                "WHERE case_name = ? AND framework = ? ORDER BY runs.recorded_at, runs.rowid", (case, framework))]
            out = []
            for run_id in ids:
                row = conn.execute("SELECT run_id, recorded_at, kind, source, lockstep_commit, baseline_framework, "
                                   "passed, host FROM runs WHERE run_id = ?", (run_id,)).fetchone()
                run = self._run_from_row(conn, row)
                out.append((run, next(r for r in run.results if r.case == case and r.framework == framework)))
            return out

    def integrity_check(self) -> str:
        with self._connect(create=False) as conn:
            return conn.execute("PRAGMA integrity_check").fetchone()[0]

    @staticmethod
    def _run_from_row(conn: sqlite3.Connection, row) -> RunRow:
        run = RunRow(run_id=row[0], recorded_at=row[1], kind=row[2], source=row[3], lockstep_commit=row[4],
                     baseline_framework=row[5], passed=None if row[6] is None else bool(row[6]), host=row[7])
        cols = ", ".join(_RESULT_COLUMNS)
        for values in conn.execute(f"SELECT {cols} FROM results WHERE run_id = ? ORDER BY case_name, role, framework",
                                   (run.run_id,)):
            d = dict(zip(_RESULT_COLUMNS, values))
            d["case"] = d.pop("case_name")
            d.pop("steps")
            d["losses"] = json.loads(d["losses"]) if d["losses"] else []
            run.results.append(ResultRow(**d))
        return run


def _rollback(conn: sqlite3.Connection) -> None:
    """Undo the open transaction, if SQLite has not already (it rolls back by itself when a write
    fails, e.g. on a full disk): a failing ROLLBACK must not hide the error that caused it."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
