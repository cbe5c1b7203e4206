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


def test_history_leaves_out_skipped_pairs_and_names_each_plot_once(tmp_path):
    # issue 36, item 15: a pair every run skipped got a plot of empty 0-1 axes, and every plot's title
    # was said twice (a heading above the plot, and the plot's own title).
    import html
    import re

    from lockstep.report.html import HISTORY_NOTE

    hist = tmp_path / "history.sqlite"
    store = HistoryStore(hist)
    for name, commit in (("r1", "c1"), ("r2", "c2")):
        run = tmp_path / name
        make_run(run, commit, 0.0)
        write_run_record(run / "pytorch" / "gpt2_1_bfloat16.jsonl", RunRecord(
            framework="pytorch", case="gpt2_1_bfloat16", meta={"case_spec": {"dtype": "bfloat16"}, "lockstep_commit": commit},
            steps=[StepRecord(step=i + 1, loss=11.0 - 0.1 * i, tokens_per_s=100.0) for i in range(3)]))
        (run / "run.json").write_text(json.dumps({"baseline": "pytorch", "skipped": [
            {"case": "gpt2_1_bfloat16", "framework": "megatron", "reason": "megatron-core's bf16 needs CUDA"}]}))
        store.append(run_from_summary(compare_run_dir(run, "pytorch"), run))
    text = write_report(tmp_path / "r2", "pytorch", history_path=hist)[0].read_text()
    labels = re.findall(r'<img alt="([^"]*): max \|Δloss\| and tok/s across commits"', text)
    assert labels == ["gpt2_1 on pytorch: 2 runs", "gpt2_1 on megatron: 2 runs", "gpt2_1_bfloat16 on pytorch: 2 runs"]
    assert "gpt2_1_bfloat16 on megatron" not in text  # skipped in both runs: nothing to draw
    assert "<h3>gpt2_1 on" not in text and text.count("gpt2_1 on megatron: 2 runs") == 1
    assert html.escape(HISTORY_NOTE) in text and "tok/s" in HISTORY_NOTE and "warm-up" in HISTORY_NOTE


def test_diagnose_rewrites_the_report_with_its_history_section(tmp_path):
    # issue 36, item 15: `lockstep diagnose RUN_DIR` rewrote report.html without the History section.
    import argparse

    from lockstep.commands.ci_options import history_path
    from lockstep.commands.diagnose import rewrite_report

    hist = tmp_path / "history.sqlite"
    for name, commit in (("r1", "c1"), ("r2", "c2")):
        HistoryStore(hist).append(run_from_summary(make_run(tmp_path / name, commit, 0.0), tmp_path / name))
    run = tmp_path / "r2"
    write_report(run, "pytorch", history_path=hist)
    args = argparse.Namespace(history=hist, no_history=False)
    assert "<h2>History</h2>" in rewrite_report(run, "pytorch", history_path(args)).read_text()
    args = argparse.Namespace(history=hist, no_history=True)  # asked for none: none
    assert "<h2>History</h2>" not in rewrite_report(run, "pytorch", history_path(args)).read_text()
