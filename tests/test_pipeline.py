"""`run_pipeline` (lockstep.pipeline), through `lockstep run`: one comparison per run, one account
of the run (the terminal's verdict line and time are the report's and run.json's), every output
path checked before the first case trains, and the history never holding a run that run.json
calls failed."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sqlite3

import pytest

import lockstep.compare.comparison as comparison
from lockstep.cli import main
from lockstep.errors import LockstepError

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)


def run_cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(["run", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def history_rows(path) -> int:
    if not path.exists():
        return 0
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]


@pytest.fixture(scope="module")
def pytorch_megatron_run(tmp_path_factory, tiny_checkpoint, training_tokens):
    """One pytorch,megatron run of gpt2_1 (2 steps, certified), each judge_case call counted."""
    root = tmp_path_factory.mktemp("pipeline")
    judged: list[str] = []
    real = comparison.judge_case
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCKSTEP_HISTORY", str(root / "history.sqlite"))
        mp.setattr(comparison, "judge_case", lambda case, *a, **k: (judged.append(case), real(case, *a, **k))[1])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["run", "--frameworks", "pytorch,megatron", "--cases", "gpt2_1", "--steps", "2",
                       "--device", "cpu", "--llmc", str(tiny_checkpoint), "--data", str(training_tokens),
                       "--out", str(root / "o")])
    return {"rc": rc, "out": out.getvalue(), "judged": judged, "dir": root / "o", "history": root / "history.sqlite"}


def test_a_run_computes_its_comparison_once(pytorch_megatron_run):
    run = pytorch_megatron_run
    assert run["rc"] == 0, run["out"]
    # The terminal's table, summary.json and the report all come from this one judgement.
    assert run["judged"] == ["gpt2_1"]
    summary = json.loads((run["dir"] / "summary.json").read_text())
    assert [c["case"] for c in summary["comparisons"][0]["cases"]] == ["gpt2_1"]
    assert summary["comparisons"][0]["cases"][0]["certificate"]["holds"] is True  # certified, and it agrees


def test_the_terminal_the_report_and_run_json_give_one_account(pytorch_megatron_run):
    run = pytorch_megatron_run
    out, manifest = run["out"], json.loads((run["dir"] / "run.json").read_text())
    head = next(line for line in out.splitlines() if line.startswith("PASS:"))
    assert manifest["verdict_lines"][0] == head
    assert f"**{head}**" in (run["dir"] / "report.md").read_text()
    total = manifest["timing"]["total_s"]
    assert re.search(rf"^time: {total:.1f} s \(", out, re.M)
    assert f"lockstep run took {total:.1f} s" in (run["dir"] / "report.md").read_text()
    # The history gained the run after run.json said it finished.
    assert manifest["status"] == "finished" and history_rows(run["history"]) == 1


def test_a_junit_path_that_is_a_directory_is_refused_before_anything_trains(capsys, tmp_path, tiny_checkpoint,
                                                                          training_tokens, private_history):
    (tmp_path / "junit_dir").mkdir()
    rc, out, err = run_cli(capsys, "--frameworks", "pytorch", "--cases", "gpt2_1", "--steps", "1", "--device", "cpu",
                           "--llmc", str(tiny_checkpoint), "--data", str(training_tokens), "--out", str(tmp_path / "o"),
                           "--junit", str(tmp_path / "junit_dir"))
    assert rc == 1 and "Traceback" not in err
    assert err.strip() == f"lockstep: error: {tmp_path / 'junit_dir'}: is a directory; give a file name for the JUnit XML"
    assert not (tmp_path / "o").exists() and history_rows(private_history) == 0


def test_a_history_path_that_cannot_be_written_is_refused_before_anything_trains(capsys, tmp_path, tiny_checkpoint,
                                                                               training_tokens):
    (tmp_path / "a_file").write_text("not a directory\n")
    history = tmp_path / "a_file" / "history.sqlite"
    rc, out, err = run_cli(capsys, "--frameworks", "pytorch", "--cases", "gpt2_1", "--steps", "1", "--device", "cpu",
                           "--llmc", str(tiny_checkpoint), "--data", str(training_tokens), "--out", str(tmp_path / "o"),
                           "--history", str(history))
    assert rc == 1 and "Traceback" not in err
    assert err.strip() == (f"lockstep: error: {history}: cannot write the history database: "
                           f"{tmp_path / 'a_file'} is not a directory")
    assert not (tmp_path / "o").exists()


def test_a_run_that_fails_after_its_comparison_is_not_in_the_history(capsys, tmp_path, tiny_checkpoint,
                                                                   training_tokens, private_history, monkeypatch):
    """The report cannot be written (here: it raises): run.json says failed, and the history,
    which would otherwise gain the run, stays without it."""
    import lockstep.report as report

    def broken(*args, **kwargs):
        raise LockstepError("the report cannot be written (planted)")

    monkeypatch.setattr(report, "write_report", broken)
    rc, out, err = run_cli(capsys, "--frameworks", "pytorch", "--cases", "gpt2_1", "--steps", "1", "--device", "cpu",
                           "--llmc", str(tiny_checkpoint), "--data", str(training_tokens), "--out", str(tmp_path / "o"),
                           "--no-certify")
    assert rc == 1 and "the report cannot be written (planted)" in err
    manifest = json.loads((tmp_path / "o" / "run.json").read_text())
    assert manifest["status"] == "failed"
    assert history_rows(private_history) == 0
    # Negative control: the same run with the report working is appended.
    monkeypatch.undo()
    monkeypatch.setenv("LOCKSTEP_HISTORY", str(private_history))
    rc, out, err = run_cli(capsys, "--frameworks", "pytorch", "--cases", "gpt2_1", "--steps", "1", "--device", "cpu",
                           "--llmc", str(tiny_checkpoint), "--data", str(training_tokens), "--out", str(tmp_path / "o"),
                           "--no-certify")
    # pytorch alone compares nothing (exit 1, issue 36 item 10), but the run finished: it is history.
    assert rc == 1 and "nothing was compared" in out, err
    assert json.loads((tmp_path / "o" / "run.json").read_text())["status"] == "finished"
    assert history_rows(private_history) == 1


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_junit_file_in_a_read_only_directory_is_refused_before_anything_trains(capsys, tmp_path, tiny_checkpoint,
                                                                               training_tokens):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        rc, out, err = run_cli(capsys, "--frameworks", "pytorch", "--cases", "gpt2_1", "--steps", "1", "--device",
                               "cpu", "--llmc", str(tiny_checkpoint), "--data", str(training_tokens),
                               "--out", str(tmp_path / "o"), "--junit", str(locked / "junit.xml"))
    finally:
        locked.chmod(0o755)
    assert rc == 1 and "Traceback" not in err
    assert err.strip() == (f"lockstep: error: {locked / 'junit.xml'}: cannot write the JUnit XML: permission denied "
                           f"({locked} is not writable)")
    assert not (tmp_path / "o").exists()
