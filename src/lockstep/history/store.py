"""The run history: one SQLite file that every `lockstep run` and `lockstep compare` appends to.

Why SQLite: CI jobs on one machine append at the same time, and a reader must never see half a
run. WAL lets readers go on while one writer writes; `busy_timeout` makes a second writer wait
for the first instead of failing; each run is one `BEGIN IMMEDIATE ... COMMIT`, so a run is in
the file whole or not at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from lockstep.errors import LockstepError, WriteError
from lockstep.fsutil import write_failure_hint

SCHEMA_VERSION = 2
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
    host TEXT,
    content_sha256 TEXT               -- v2: what the run says (RunRow.content_key), one run per content
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
    inputs_sha256 TEXT,               -- v2: the case's inputs (weights, tokens, steps, hyper-parameters)
    record_sha256 TEXT,               -- v2: the record file's bytes
    peak_mem_mb REAL,                 -- v2: peak allocated device memory
    mfu REAL,                         -- v2: model FLOPs utilisation at the median tok/s
    machine TEXT,                     -- v2: the host the framework ran on (its record's)
    PRIMARY KEY (run_id, case_name, framework)
);
CREATE INDEX IF NOT EXISTS results_by_case ON results (case_name, framework);
CREATE INDEX IF NOT EXISTS runs_by_content ON runs (content_sha256);
"""

# Version 1 -> 2: the columns that key a run by its content and a case by its inputs, and what
# the history site shows per point. Rows of version 1 keep NULL there (their records are not at
# hand); their content key is worked out from what they stored.
_MIGRATE_1_TO_2 = [
    "ALTER TABLE runs ADD COLUMN content_sha256 TEXT",
    "ALTER TABLE results ADD COLUMN inputs_sha256 TEXT",
    "ALTER TABLE results ADD COLUMN record_sha256 TEXT",
    "ALTER TABLE results ADD COLUMN peak_mem_mb REAL",
    "ALTER TABLE results ADD COLUMN mfu REAL",
    "ALTER TABLE results ADD COLUMN machine TEXT",
    "CREATE INDEX IF NOT EXISTS runs_by_content ON runs (content_sha256)",
]


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
    inputs_sha256: str | None = None
    record_sha256: str | None = None
    peak_mem_mb: float | None = None
    mfu: float | None = None
    machine: str | None = None
    steps: int | None = None  # len(losses) as stored; read back even when the losses are not (runs(losses=False))

    def content(self) -> list:
        """What this result says, for the run's content key: the record's bytes where the row
        came from a record file, else the figures it stored."""
        said = [self.case, self.framework, self.role, self.verdict, self.threshold, self.max_abs_diff,
                self.inputs_sha256]
        if self.record_sha256:
            return said + [self.record_sha256]
        return said + [self.reason, self.losses, self.tps_median, self.tps_min, self.tps_max, self.tps_cv,
                       self.framework_commit, self.framework_version, self.device_name]


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

    def content_key(self) -> str:
        """Two runs with this key say the same thing about the same records: the second
        `lockstep compare` of unchanged records, or a run re-read. Where it ran from and when
        are not part of it; which baseline and what was judged are."""
        body = [self.baseline_framework, self.passed, sorted((r.content() for r in self.results), key=json.dumps)]
        return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=True).encode()).hexdigest()


_RESULT_COLUMNS = ["case_name", "framework", "role", "verdict", "reason", "framework_commit", "framework_version",
                   "framework_build", "torch_version", "megatron_core_version", "device", "device_name", "dtype",
                   "steps", "losses", "max_abs_diff", "max_diff_step", "threshold", "tps_median", "tps_min",
                   "tps_max", "tps_cv", "inputs_sha256", "record_sha256", "peak_mem_mb", "mfu", "machine"]


_RUN_COLUMNS = "run_id, recorded_at, kind, source, lockstep_commit, baseline_framework, passed, host"


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
        """A connection to the history: create=True for a writer (the file and its schema are made
        where missing); else read-only, so that reading never writes into the file it reads."""
        if not create and not self.path.is_file():
            raise LockstepError(f"{self.path}: no history database there yet (lockstep run and compare "
                                "write it; --history FILE or LOCKSTEP_HISTORY choose another)")
        if not create and self._schema_version_read_only() == 1:
            with self._connect(create=True):  # lockstep's own file of an older schema: migrated once
                pass
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # isolation_level=None: we say BEGIN/COMMIT ourselves, so a run is exactly one transaction.
                conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            else:
                conn = self._open_read_only()
        except (sqlite3.Error, OSError) as e:
            raise LockstepError(f"{self.path}: cannot open the history database ({e})") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._refuse_foreign(conn)
            if create:
                self._set_wal(conn)
                self._ensure_schema(conn)
            else:
                self._check_version(conn)
            yield conn
        except sqlite3.IntegrityError as e:
            raise LockstepError(f"{self.path}: a run could not be added ({e}); nothing of it was written") from None
        except sqlite3.DatabaseError as e:
            raise self._problem(e) from None
        finally:
            conn.close()

    def _open_read_only(self) -> sqlite3.Connection:
        return sqlite3.connect(f"{self.path.absolute().as_uri()}?mode=ro", uri=True,
                               timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)

    def _schema_version_read_only(self) -> int | None:
        """The file's schema version, looked at without writing; None where it cannot say (the
        connection proper then reports why)."""
        try:
            conn = self._open_read_only()
        except (sqlite3.Error, OSError):
            return None
        try:
            return conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
        except sqlite3.Error:
            return None
        finally:
            conn.close()

    def _refuse_foreign(self, conn: sqlite3.Connection) -> None:
        """An SQLite file with tables but not lockstep's is someone else's: it is left as it is."""
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        if tables and "schema_version" not in tables:
            shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
            raise LockstepError(f"{self.path}: an SQLite database that is not a lockstep history (its tables: "
                                f"{shown}); it was left untouched, choose another with --history")

    def _check_version(self, conn: sqlite3.Connection) -> None:
        if not self._has_version(conn):  # only a reader gets here without the schema: it never writes one
            raise LockstepError(f"{self.path}: an empty file, no lockstep history yet (lockstep run and compare "
                                "write it; --history FILE or LOCKSTEP_HISTORY choose another)")
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        if row is None or row[0] != SCHEMA_VERSION:
            raise LockstepError(f"{self.path}: history schema version {row[0] if row else None}, this lockstep "
                                f"reads version {SCHEMA_VERSION}; use a matching lockstep or another --history file")

    @staticmethod
    def _has_version(conn: sqlite3.Connection) -> bool:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'").fetchone() \
            is not None

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
        if not self._has_version(conn):
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
        if row is not None and row[0] == 1:
            self._migrate_1_to_2(conn)
        self._check_version(conn)

    def _migrate_1_to_2(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == 1:  # not done meanwhile
                for stmt in _MIGRATE_1_TO_2:
                    conn.execute(stmt)
                for row in conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs").fetchall():
                    run = self._run_from_row(conn, row)
                    conn.execute("UPDATE runs SET content_sha256 = ? WHERE run_id = ?", (run.content_key(), run.run_id))
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    # -- writing ----------------------------------------------------------------------------

    def append(self, run: RunRow) -> str | None:
        """Add one run and all its results in one transaction, unless the history already holds
        a run with the same content (docs/reference/history-site.md: one entry per content):
        then nothing is written and that run's id is returned."""
        return self.append_many([run])[0]

    def append_many(self, runs: list[RunRow]) -> list[str | None]:
        """append() of each run, in one connection and one transaction (an import, a test's
        long history): all of them or none. Per run: None, or the run it duplicates."""
        out: list[str | None] = []
        with self._connect(create=True) as conn:
            conn.execute("BEGIN IMMEDIATE")  # the look-ups and the inserts under one write lock
            try:
                for run in runs:
                    out.append(self._insert(conn, run))
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
        return out

    @staticmethod
    def _insert(conn: sqlite3.Connection, run: RunRow) -> str | None:
        key = run.content_key()
        same = conn.execute("SELECT run_id FROM runs WHERE content_sha256 = ? ORDER BY rowid LIMIT 1", (key,)).fetchone()
        if same:
            return same[0]
        conn.execute("INSERT INTO runs (run_id, recorded_at, kind, source, lockstep_commit, baseline_framework, "
                     "passed, host, content_sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (run.run_id, run.recorded_at, run.kind, run.source, run.lockstep_commit,
                      run.baseline_framework, None if run.passed is None else int(run.passed), run.host, key))
        marks = ", ".join("?" * (len(_RESULT_COLUMNS) + 1))
        for r in run.results:
            d = asdict(r)
            values = [run.run_id, r.case] + [
                json.dumps(r.losses) if c == "losses" else len(r.losses) if c == "steps" else d[c]
                for c in _RESULT_COLUMNS[1:]]
            conn.execute(f"INSERT INTO results (run_id, {', '.join(_RESULT_COLUMNS)}) VALUES ({marks})", values)
        return None

    # -- reading ----------------------------------------------------------------------------

    def runs(self, limit: int | None = None, since: str | None = None, losses: bool = True) -> list[RunRow]:
        """Runs, oldest first (the last `limit` of them; those recorded at or after `since`, an
        ISO date or time), with their results. Two queries whatever the number of runs. With
        losses=False the per-step losses are not decoded (a result's `steps` still says how
        many): most of the time of reading a long history."""
        with self._connect(create=False) as conn:
            where, params = ("WHERE recorded_at >= ?", (since,)) if since else ("", ())
            rows = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs {where} ORDER BY recorded_at, rowid",
                                params).fetchall()
            if limit is not None:
                rows = rows[-limit:] if limit > 0 else []
            runs = [self._run_only(row) for row in rows]
            by_id = {r.run_id: r for r in runs}
            cols = ", ".join(_RESULT_COLUMNS)
            for values in conn.execute(f"SELECT run_id, {cols} FROM results ORDER BY run_id, case_name, role, framework"):
                run = by_id.get(values[0])
                if run is not None:
                    run.results.append(_result_from_values(values[1:], losses))
            return runs

    def runs_by_id(self, run_ids) -> dict[str, RunRow]:
        """These runs, whole (losses included), in one connection."""
        ids = list(dict.fromkeys(run_ids))
        out: dict[str, RunRow] = {}
        cols = ", ".join(_RESULT_COLUMNS)
        with self._connect(create=False) as conn:
            for i in range(0, len(ids), 500):  # SQLite's limit on bound parameters
                chunk = ids[i:i + 500]
                marks = ", ".join("?" * len(chunk))
                for row in conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id IN ({marks})", chunk):
                    out[row[0]] = self._run_only(row)
                for values in conn.execute(f"SELECT run_id, {cols} FROM results WHERE run_id IN ({marks}) "
                                           "ORDER BY run_id, case_name, role, framework", chunk):
                    out[values[0]].results.append(_result_from_values(values[1:]))
        return out

    def run(self, run_id: str) -> RunRow:
        """The run with this id, or the one run whose id starts with it."""
        with self._connect(create=False) as conn:
            rows = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ? OR run_id LIKE ? ESCAPE '\\' ORDER BY rowid",
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
                row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
                run = self._run_from_row(conn, row)
                out.append((run, next(r for r in run.results if r.case == case and r.framework == framework)))
            return out

    def integrity_check(self) -> str:
        with self._connect(create=False) as conn:
            return conn.execute("PRAGMA integrity_check").fetchone()[0]

    @staticmethod
    def _run_only(row) -> RunRow:
        return RunRow(run_id=row[0], recorded_at=row[1], kind=row[2], source=row[3], lockstep_commit=row[4],
                      baseline_framework=row[5], passed=None if row[6] is None else bool(row[6]), host=row[7])

    @classmethod
    def _run_from_row(cls, conn: sqlite3.Connection, row) -> RunRow:
        run = cls._run_only(row)
        cols = ", ".join(_RESULT_COLUMNS)
        for values in conn.execute(f"SELECT {cols} FROM results WHERE run_id = ? ORDER BY case_name, role, framework",
                                   (run.run_id,)):
            run.results.append(_result_from_values(values))
        return run


def _result_from_values(values, losses: bool = True) -> ResultRow:
    d = dict(zip(_RESULT_COLUMNS, values))
    d["case"] = d.pop("case_name")
    d["losses"] = json.loads(d["losses"]) if d["losses"] and losses else []
    return ResultRow(**d)


def _rollback(conn: sqlite3.Connection) -> None:
    """Undo the open transaction, if SQLite has not already (it rolls back by itself when a write
    fails, e.g. on a full disk): a failing ROLLBACK must not hide the error that caused it."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
