"""The run history: runs appended and read back, trends across commits, diffs, concurrent
writers, and a damaged database file."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from lockstep.cli import main
from lockstep.errors import LockstepError
from lockstep.history import HistoryStore, ResultRow, RunRow, diff_runs, run_from_summary, trend

from history_runs import BASE_LOSSES, make_run

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def history_file(tmp_path):
    return tmp_path / "hist" / "history.sqlite"


def test_two_runs_appended_and_read_back(tmp_path, history_file):
    store = HistoryStore(history_file)
    s1 = make_run(tmp_path / "r1", "c0ffee1", "aaaa111", drift=1e-7)
    s2 = make_run(tmp_path / "r2", "c0ffee2", "bbbb222", drift=1e-5, tps_scale=1.1,
                  skipped=[{"case": "gpt2_1_bfloat16", "framework": "infinitrain", "reason": "BF16 on CPU"}])
    run1, run2 = run_from_summary(s1, tmp_path / "r1"), run_from_summary(s2, tmp_path / "r2")
    store.append(run1)
    store.append(run2)

    runs = store.runs()
    assert [r.run_id for r in runs] == [run1.run_id, run2.run_id]
    assert [r.lockstep_commit for r in runs] == ["c0ffee1", "c0ffee2"]
    assert [r.passed for r in runs] == [True, False]  # drift 1e-5 per step: 4e-5 at step 4 > 1e-5
    res = {(r.case, r.framework): r for r in runs[1].results}
    base, test = res[("gpt2_1", "pytorch")], res[("gpt2_1", "infinitrain")]
    assert base.role == "baseline" and base.verdict is None and base.losses == BASE_LOSSES
    assert base.framework_commit == "c0ffee2"  # lockstep's own trainer: lockstep's commit
    assert test.verdict == "FAIL unexplained" and test.max_diff_step == 4 and test.max_abs_diff == pytest.approx(4e-5, rel=1e-6)
    assert test.framework_commit == "bbbb222" and test.framework_build == "/opt/InfiniTrain/build"
    assert test.threshold == 1e-5 and test.dtype == "float32" and test.device == "cpu" and test.torch_version == "2.13.0"
    assert test.losses == [v + 1e-5 * (i + 1) for i, v in enumerate(BASE_LOSSES)]
    # tok/s over steps 2..4 (110, 121, 99): median, min, max, CV
    vals = [100.0 * 1.1, 110.0 * 1.1, 90.0 * 1.1]
    assert (test.tps_median, test.tps_min, test.tps_max) == (statistics.median(vals), min(vals), max(vals))
    assert test.tps_cv == pytest.approx(statistics.stdev(vals) / statistics.fmean(vals))  # the report's CV
    assert res[("gpt2_1_bfloat16", "infinitrain")].verdict == "SKIPPED"
    assert res[("gpt2_1_bfloat16", "infinitrain")].reason == "BF16 on CPU"
    assert store.integrity_check() == "ok"
    with sqlite3.connect(history_file) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(2,)]


def test_trend_over_three_commits_and_cli(tmp_path, history_file, capsys):
    store = HistoryStore(history_file)
    commits = ["aaaa1111", "bbbb2222", "cccc3333"]
    for i, (commit, drift) in enumerate(zip(commits, [0.0, 2e-6, 1e-5])):
        store.append(run_from_summary(make_run(tmp_path / f"r{i}", "lockstep1", commit, drift, tps_scale=1 + i),
                                      tmp_path / f"r{i}"))
    points = trend(store, "gpt2_1", "infinitrain")
    assert [p.commit for p in points] == commits
    assert [p.verdict for p in points] == ["PASS", "PASS", "FAIL unexplained"]
    assert points[0].max_abs_diff == 0.0
    assert points[1].max_abs_diff == pytest.approx(8e-6, rel=1e-6) and points[2].max_abs_diff == pytest.approx(4e-5, rel=1e-6)
    assert [p.tps_median for p in points] == [100.0, 200.0, 300.0]

    png = tmp_path / "trend.png"
    rc = main(["history", "trend", "--case", "gpt2_1", "--framework", "infinitrain", "--png", str(png),
               "--history", str(history_file)])
    out = capsys.readouterr().out
    assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for commit in commits:
        assert commit in out
    assert "4.000e-05" in out and "FAIL" in out

    rc = main(["history", "--history", str(history_file)])
    out = capsys.readouterr().out
    assert rc == 0 and all(r.run_id in out for r in store.runs())

    runs = store.runs()
    rc = main(["history", "--history", str(history_file), "diff", runs[0].run_id, runs[2].run_id])
    out = capsys.readouterr().out
    assert rc == 0 and "PASS -> FAIL" in out and "1 verdict change(s)" in out
    rows = {(r.case, r.framework): r for r in diff_runs(runs[0], runs[2])}
    assert rows[("gpt2_1", "infinitrain")].loss_delta == pytest.approx(4e-5, rel=1e-6)
    assert rows[("gpt2_1", "infinitrain")].loss_delta_step == 4
    assert rows[("gpt2_1", "infinitrain")].tps_ratio == pytest.approx(3.0)
    assert rows[("gpt2_1", "pytorch")].loss_delta == 0.0 and not rows[("gpt2_1", "pytorch")].verdict_changed


def _append_runs(path: str, writer: int, n: int) -> None:
    store = HistoryStore(path)
    for k in range(n):
        store.append(RunRow(run_id=f"w{writer}-{k}", recorded_at=f"2026-11-30T00:00:{k:02d}.{writer:06d}+00:00",
                            kind="run", source=f"writer {writer}", lockstep_commit="abc", baseline_framework="pytorch",
                            passed=True, results=[ResultRow(f"case{c}", "pytorch", "baseline",
                                                            losses=[1.0 + writer + k / 100, 0.5 + c])
                                                  for c in range(20)]))


def test_concurrent_writers_keep_every_run(history_file):
    ctx = multiprocessing.get_context("fork")
    writers, per_writer = 6, 8
    procs = [ctx.Process(target=_append_runs, args=(str(history_file), w, per_writer)) for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * writers
    store = HistoryStore(history_file)
    runs = store.runs()
    assert sorted(r.run_id for r in runs) == sorted(f"w{w}-{k}" for w in range(writers) for k in range(per_writer))
    assert all(len(r.results) == 20 for r in runs)  # a run is in the file whole, never in part
    assert store.integrity_check() == "ok"


def test_corrupted_database_is_one_sentence(tmp_path, capsys):
    bad = tmp_path / "history.sqlite"
    bad.write_bytes(b"this is not SQLite, it is a spreadsheet export\n" * 200)
    rc = main(["history", "--history", str(bad)])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert err.strip().splitlines() == [f"lockstep: error: {bad}: cannot use it as the lockstep history database "
                                        "(SQLite: file is not a database); move the file away or choose another "
                                        "with --history"]
    with pytest.raises(LockstepError, match="file is not a database"):
        HistoryStore(bad).append(RunRow("x", "2026-11-30T00:00:00+00:00", "run", "src"))


def test_no_history_yet_is_one_sentence(tmp_path, capsys):
    rc = main(["history", "--history", str(tmp_path / "none.sqlite")])
    assert rc == 1 and "no history database there yet" in capsys.readouterr().err


def test_a_run_that_cannot_be_added_leaves_nothing_behind(history_file):
    store = HistoryStore(history_file)
    _append_runs(str(history_file), 0, 1)
    twice = ResultRow("case0", "pytorch", "baseline", losses=[1.0])
    with pytest.raises(LockstepError, match="nothing of it was written"):
        store.append(RunRow("broken", "2026-11-30T01:00:00+00:00", "run", "src", results=[twice, twice]))
    assert [r.run_id for r in store.runs()] == ["w0-0"]
    with sqlite3.connect(history_file) as conn:
        assert conn.execute("SELECT COUNT(*) FROM results WHERE run_id = 'broken'").fetchone() == (0,)


# Appends a run too big for RLIMIT_FSIZE (a full disk or a quota, without filling this machine's).
APPEND_UNDER_LIMIT = """
import resource, sys
from lockstep.errors import LockstepError
from lockstep.history import HistoryStore, ResultRow, RunRow
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
big = [ResultRow(f"case{c}", "pytorch", "baseline", losses=[0.5] * 2000) for c in range(40)]
try:
    HistoryStore(sys.argv[1]).append(RunRow("big", "2026-12-01T00:00:00+00:00", "run", "src", results=big))
except LockstepError as e:
    print(e)
"""


def test_a_history_write_cut_by_a_file_size_limit_says_so_and_keeps_the_file_whole(history_file):
    _append_runs(str(history_file), 0, 1)
    proc = subprocess.run([sys.executable, "-c", APPEND_UNDER_LIMIT, str(history_file)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == (f"{history_file}: cannot write the history database: file too large (this "
                                   "process may write files of at most 200 kB)")
    store = HistoryStore(history_file)
    assert [r.run_id for r in store.runs()] == ["w0-0"] and store.integrity_check() == "ok"


def test_a_full_disk_under_sqlite_is_no_space_not_a_damaged_file(history_file):
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorname = "SQLITE_FULL"  # what SQLite sets when write() fails with ENOSPC
    assert str(HistoryStore(history_file)._problem(full)) == (
        f"{history_file}: cannot write the history database: no space left on device")


def _someone_elses_database(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL);"
                       "INSERT INTO invoices VALUES (1, 12.5);")
    conn.commit()
    conn.close()
    os.utime(path, (1_700_000_000, 1_700_000_000))
    return path


@pytest.mark.parametrize("command", [[], ["trend", "--case", "gpt2_1", "--framework", "pytorch"],
                                     ["diff", "a", "b"], ["site", "SITE"]], ids=lambda c: c[0] if c else "list")
def test_reading_someone_elses_sqlite_file_refuses_it_and_leaves_it_untouched(tmp_path, capsys, command):
    theirs = _someone_elses_database(tmp_path / "accounts.sqlite")
    before = (theirs.read_bytes(), theirs.stat().st_mtime_ns)
    argv = [str(tmp_path / "site") if a == "SITE" else a for a in command]
    rc = main(["history", "--history", str(theirs), *argv])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert err.strip().splitlines() == [f"lockstep: error: {theirs}: an SQLite database that is not a lockstep "
                                        "history (its tables: invoices); it was left untouched, choose another "
                                        "with --history"]
    assert (theirs.read_bytes(), theirs.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["accounts.sqlite"]  # no -wal, -shm, site or journal


def test_appending_to_someone_elses_sqlite_file_refuses_it(tmp_path):
    theirs = _someone_elses_database(tmp_path / "accounts.sqlite")
    before = (theirs.read_bytes(), theirs.stat().st_mtime_ns)
    with pytest.raises(LockstepError, match="not a lockstep history"):
        HistoryStore(theirs).append(RunRow("x", "2026-11-30T00:00:00+00:00", "run", "src"))
    assert (theirs.read_bytes(), theirs.stat().st_mtime_ns) == before



def test_reading_an_empty_file_says_so_and_writes_nothing_into_it(tmp_path, capsys):
    empty = tmp_path / "history.sqlite"
    empty.write_bytes(b"")
    assert main(["history", "--history", str(empty)]) == 1
    assert "an empty file, no lockstep history yet" in capsys.readouterr().err
    assert empty.read_bytes() == b"" and sorted(p.name for p in tmp_path.iterdir()) == ["history.sqlite"]
