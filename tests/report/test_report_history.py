"""report.html shows the history trend of the run's cases when the history holds earlier runs."""

from __future__ import annotations

import json

from lockstep.compare import compare_run_dir
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record
from lockstep.history import HistoryStore, run_from_summary
from lockstep.report import write_report


def make_run(run, commit, drift):
    for fw, extra in (("pytorch", 0.0), ("megatron", drift)):
        write_run_record(run / fw / "gpt2_1.jsonl", RunRecord(
            framework=fw, case="gpt2_1", meta={"case_spec": {"dtype": "float32"}, "lockstep_commit": commit},
            steps=[StepRecord(step=i + 1, loss=11.0 - 0.1 * i + extra * i, tokens_per_s=100.0 + i) for i in range(3)]))
    (run / "run.json").write_text(json.dumps({"baseline": "pytorch"}))
    return compare_run_dir(run, "pytorch")


def test_history_section_only_with_history(tmp_path):
    hist = tmp_path / "history.sqlite"
    run = tmp_path / "r2"
    summary = make_run(run, "c2", 1e-7)
    html, _ = write_report(run, "pytorch", history_path=hist)
    assert "<h2>History</h2>" not in html.read_text()  # no history file yet
    store = HistoryStore(hist)
    store.append(run_from_summary(make_run(tmp_path / "r1", "c1", 0.0), tmp_path / "r1"))
    store.append(run_from_summary(summary, run))
    html, _ = write_report(run, "pytorch", history_path=hist)
    text = html.read_text()
    assert "<h2>History</h2>" in text and "gpt2_1 on megatron: 2 runs" in text and "gpt2_1 on pytorch: 2 runs" in text
    html, _ = write_report(run, "pytorch", history_path=None)
    assert "<h2>History</h2>" not in html.read_text()
