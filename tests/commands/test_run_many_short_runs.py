"""Many short `lockstep run`s, each a process of its own, all end as designed (issue 36, item 5): about 1 in
6 used to end, after writing everything, with "Fatal Python error: PyThreadState_Get ...
finalizing" (exit 134). The report's plotting was imported in a daemon thread as soon as the
run only waited on worker groups, which every run reached, worker groups or not, and --no-report
or not; a run that ended before the import did was finalized under it. Now that thread starts
only for a run that waits on a worker group and will write a report, and the run joins it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import lockstep

SRC = Path(lockstep.__file__).resolve().parents[1]
RUNS = 12
pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_a_dozen_short_runs_all_end_as_designed(tmp_path, tiny_checkpoint, training_tokens):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "o"
    for i in range(RUNS):
        done = subprocess.run([sys.executable, "-m", "lockstep", "run", "--frameworks", "pytorch", "--cases", "gpt2_1",
                               "--steps", "1", "--device", "cpu", "--llmc", str(tiny_checkpoint),
                               "--data", str(training_tokens), "--no-report", "--no-certify", "--force",
                               "--no-history", "--out", str(out)],
                              env=env, capture_output=True, text=True, timeout=300)
        # pytorch alone compares nothing, so a run that ends as designed exits 1 saying so (a crash at
        # interpreter shutdown was exit 134, after the verdict line).
        assert done.returncode == 1, f"run {i + 1} of {RUNS}: exit {done.returncode}\n{done.stderr[-2000:]}"
        assert "RAN: pytorch only (one framework): nothing was compared" in done.stdout and "Fatal Python error" not in done.stderr
        assert '"status": "finished"' in (out / "run.json").read_text()


def test_no_thread_of_lockstep_outlives_a_run(tmp_path, tiny_checkpoint, training_tokens, monkeypatch):
    """In process, deterministic: a run with --no-report starts no report-import thread (before, every
    run did, the moment its in-process pairs were done), and a run leaves no lockstep thread alive."""
    import threading

    import lockstep.commands.run as run_command
    from lockstep.cli import main

    started = []
    real = run_command.import_report_beside
    monkeypatch.setattr(run_command, "import_report_beside", lambda: started.append(1) or real())
    for extra in (["--no-report"], []):
        rc = main(["run", "--frameworks", "pytorch", "--cases", "gpt2_1", "--steps", "1", "--device", "cpu",
                   "--llmc", str(tiny_checkpoint), "--data", str(training_tokens), "--no-certify", "--force",
                   "--no-history", "--out", str(tmp_path / "o"), *extra])
        assert rc == 1  # pytorch alone: nothing compared, the run itself finished
        assert [t.name for t in threading.enumerate() if t.name.startswith("lockstep-")] == []
    assert started == []  # pytorch's one-device pairs run in this process: it never waits on a worker group
