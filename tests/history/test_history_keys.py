"""History entries are keyed by the records' content and the case's inputs (issue 36 item 14):
a second `lockstep compare` of the same records adds nothing, and a trend never mixes runs of
different steps or weights under one case name. A history of schema 1 is read and migrated."""

from __future__ import annotations

import json
import sqlite3


from lockstep.cli import main
from lockstep.compare import compare_run_dir
from lockstep.history import HistoryStore, ResultRow, RunRow, run_from_summary, trend
from lockstep.history.keys import case_inputs_sha256

from history_runs import BASE_LOSSES, make_run, write_record


def _history(tmp_path):
    return tmp_path / "history.sqlite"


def test_a_second_compare_of_the_same_records_adds_nothing(tmp_path, capsys):
    run = tmp_path / "r"
    make_run(run, "c0ffee1", "aaaa111", drift=1e-7)
    hist = _history(tmp_path)
    for _ in range(3):
        rc = main(["compare", str(run / "pytorch"), str(run / "infinitrain"), "--history", str(hist)])
        assert rc == 0
    capsys.readouterr()
    store = HistoryStore(hist)
    assert len(store.runs()) == 1
    assert len(trend(store, "gpt2_1", "infinitrain")) == 1

    # Negative control: a changed record is a new entry.
    write_record(run, "infinitrain", "gpt2_1", [v + 2e-7 * (i + 1) for i, v in enumerate(BASE_LOSSES)],
                 {"framework_version": "infinitrain", "infinitrain_commit": "aaaa111"})
    assert main(["compare", str(run / "pytorch"), str(run / "infinitrain"), "--history", str(hist)]) == 0
    assert len(store.runs()) == 2


def test_a_run_dir_added_twice_is_one_entry_and_append_names_it(tmp_path):
    run = tmp_path / "r"
    summary = make_run(run, "c0ffee1", "aaaa111", drift=1e-7)
    store = HistoryStore(_history(tmp_path))
    first = run_from_summary(summary, run)
    assert store.append(first) is None
    assert store.append(run_from_summary(summary, run)) == first.run_id
    assert [r.run_id for r in store.runs()] == [first.run_id]


def _run_with_inputs(run_dir, steps: int, checkpoint: str, drift: float) -> dict:
    meta = {"case_spec": {"name": "gpt2_1", "dtype": "float32", "model": "gpt2-tiny", "steps": steps},
            "checkpoint_sha256": checkpoint, "data_sha256": "d" * 64, "lockstep_commit": "l1"}
    losses = (BASE_LOSSES * 2)[:steps]
    write_record(run_dir, "pytorch", "gpt2_1", losses, meta, tps=[100.0] * steps)
    write_record(run_dir, "infinitrain", "gpt2_1", [v + drift for v in losses],
                 {**meta, "infinitrain_commit": f"it{steps}{checkpoint[:2]}"}, tps=[100.0] * steps)
    (run_dir / "run.json").write_text(json.dumps({"baseline": "pytorch"}))
    return compare_run_dir(run_dir, "pytorch")


def test_trend_keeps_runs_of_other_steps_or_weights_apart(tmp_path, capsys):
    store = HistoryStore(_history(tmp_path))
    for i, (steps, ckpt) in enumerate([(4, "a" * 64), (8, "a" * 64), (4, "b" * 64), (4, "a" * 64)]):
        d = tmp_path / f"r{i}"
        store.append(run_from_summary(_run_with_inputs(d, steps, ckpt, drift=i * 1e-7), d))
    points = trend(store, "gpt2_1", "infinitrain")
    assert [p.steps for p in points] == [4, 4]  # the latest run's inputs: 4 steps from weights a
    assert [p.commit for p in points] == ["it4aa", "it4aa"]
    other = trend(store, "gpt2_1", "infinitrain", inputs=case_inputs_sha256(
        {"case_spec": {"dtype": "float32", "model": "gpt2-tiny", "steps": 8}, "checkpoint_sha256": "a" * 64,
         "data_sha256": "d" * 64})[:10])
    assert [p.steps for p in other] == [8]
    rc = main(["history", "trend", "--case", "gpt2_1", "--framework", "infinitrain", "--history",
               str(_history(tmp_path)), "--png", str(tmp_path / "t.png")])
    out = capsys.readouterr().out
    assert rc == 0 and "2 run(s) of other inputs" in out


def test_a_schema_1_history_is_migrated_and_still_read(tmp_path):
    hist = _history(tmp_path)
    conn = sqlite3.connect(hist)
    conn.executescript("""
        CREATE TABLE schema_version (version INTEGER NOT NULL);
        INSERT INTO schema_version VALUES (1);
        CREATE TABLE runs (run_id TEXT PRIMARY KEY, recorded_at TEXT NOT NULL, kind TEXT NOT NULL,
            source TEXT NOT NULL, lockstep_commit TEXT, baseline_framework TEXT, passed INTEGER, host TEXT);
        CREATE TABLE results (run_id TEXT NOT NULL, case_name TEXT NOT NULL, framework TEXT NOT NULL,
            role TEXT NOT NULL, verdict TEXT, reason TEXT, framework_commit TEXT, framework_version TEXT,
            framework_build TEXT, torch_version TEXT, megatron_core_version TEXT, device TEXT, device_name TEXT,
            dtype TEXT, steps INTEGER, losses TEXT, max_abs_diff REAL, max_diff_step INTEGER, threshold REAL,
            tps_median REAL, tps_min REAL, tps_max REAL, tps_cv REAL, PRIMARY KEY (run_id, case_name, framework));
        INSERT INTO runs VALUES ('old1', '2026-11-01T00:00:00+00:00', 'run', '/r', 'abc', 'pytorch', 1, 'h');
        INSERT INTO results (run_id, case_name, framework, role, steps, losses, tps_median)
            VALUES ('old1', 'gpt2_1', 'pytorch', 'baseline', 2, '[1.0, 0.5]', 100.0);
    """)
    conn.commit()
    conn.close()
    store = HistoryStore(hist)
    [old] = store.runs()
    assert old.run_id == "old1" and old.results[0].losses == [1.0, 0.5] and old.results[0].inputs_sha256 is None
    with sqlite3.connect(hist) as c:
        assert max(v for (v,) in c.execute("SELECT version FROM schema_version")) == 3
    again = RunRow("new", "2026-12-01T00:00:00+00:00", "run", "/r", "abc", "pytorch", True, "h",
                   [ResultRow("gpt2_1", "pytorch", "baseline", losses=[1.0, 0.5], tps_median=100.0)])
    assert store.append(again) == "old1"  # the migrated row has its content key
    assert store.integrity_check() == "ok"


def test_a_run_and_a_later_compare_of_its_records_are_one_point(tmp_path, capsys):
    run = tmp_path / "r"
    # A third framework in the run: the compare of one pair says less than the run, so it is kept.
    write_record(run, "megatron", "gpt2_1", BASE_LOSSES, {"framework_version": "megatron-core 0.16.1"})
    summary = make_run(run, "c0ffee1", "aaaa111", drift=1e-7)
    hist = _history(tmp_path)
    store = HistoryStore(hist)
    store.append(run_from_summary(summary, run))
    assert main(["compare", str(run / "pytorch"), str(run / "infinitrain"), "--history", str(hist)]) == 0
    capsys.readouterr()
    assert [r.kind for r in store.runs()] == ["run", "compare"]  # two comparisons, kept
    [point] = trend(store, "gpt2_1", "infinitrain")  # one record, one verdict: one point
    assert point.run_id == store.runs()[0].run_id
    from lockstep.history.site.model import build_model

    model = build_model(store.runs())
    [series] = [s for s in model.series.values() if s.framework == "infinitrain"]
    assert len(series.points) == 1


def test_the_share_of_the_roofline_is_kept_and_a_schema_2_history_gains_its_column(tmp_path, capsys):
    from lockstep.history.site import build_site
    from lockstep.roofline import RUN_JSON_KEY, ShapeRoofline

    run = tmp_path / "r"
    make_run(run, "c0ffee1", "aaaa111", drift=1e-7)
    # 4 tokens per micro step in 0.02 s: 200 tok/s; infinitrain's median 100 tok/s is half of it.
    roofline = ShapeRoofline("cpu test", "float32", 1, 4, 1, 0.02, 10**9, False, 0.5).to_json()
    manifest = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**manifest, RUN_JSON_KEY: {"gpt2_1": roofline}}))
    hist = _history(tmp_path)
    store = HistoryStore(hist)
    store.append(run_from_summary(compare_run_dir(run, "pytorch"), run))
    [kept] = store.runs()
    assert {r.framework: r.roofline_fraction for r in kept.results} == {"pytorch": 0.5, "infinitrain": 0.5}
    build_site(store, tmp_path / "site")
    page = (tmp_path / "site" / "runs" / f"{kept.run_id}.html").read_text()
    assert "<th>% of roofline</th>" in page and "50.0%" in page
    capsys.readouterr()
    assert main(["history", "--history", str(hist), "trend", "--case", "gpt2_1", "--framework", "infinitrain",
                 "--png", str(tmp_path / "trend.png")]) == 0
    table = capsys.readouterr().out
    assert "% of roofline" in table and "50.0%" in table

    # The same file as schema 2 wrote it: no roofline column, version 2. Opened, it is migrated.
    with sqlite3.connect(hist) as conn:
        conn.execute("ALTER TABLE results DROP COLUMN roofline_fraction")
        conn.execute("DELETE FROM schema_version")
        conn.execute("INSERT INTO schema_version VALUES (2)")
    [old] = HistoryStore(hist).runs()
    assert old.run_id == kept.run_id and {r.roofline_fraction for r in old.results} == {None}
    with sqlite3.connect(hist) as conn:
        assert [v for (v,) in conn.execute("SELECT version FROM schema_version")] == [2, 3]
    assert HistoryStore(hist).integrity_check() == "ok"
