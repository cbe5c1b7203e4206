"""`lockstep run` stopped by a signal, and a second run into the same --out, with real processes:
the CLI in a subprocess, torchrun with two gloo workers, SIGTERM / SIGHUP, /proc to find the tree."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lockstep.cli import main, stop_on_signals
from lockstep.errors import Interrupted

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

SRC = Path(__file__).resolve().parents[2] / "src"
STEP_LINE = re.compile(r"step\s+\d+/\d+ \| train loss")


def long_matrix(path: Path, dp: int) -> Path:
    """One case that trains long enough (hundreds of tiny CPU steps) to be stopped mid-run."""
    path.write_text(f'[[case]]\nname = "long_dp{dp}"\nmodel = "gpt2"\ndtype = "float32"\nmicro_batch = 2\n'
                    f'seq_len = 32\ntotal_batch = {64 * dp}\ndp = {dp}\nsteps = 400\nlr = 1e-4\n')
    return path


def start_run(tmp_path: Path, checkpoint: Path, tokens: Path, dp: int, out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "lockstep", "run", "--matrix", str(long_matrix(tmp_path / f"m{dp}.toml", dp)),
           "--frameworks", "pytorch", "--llmc", str(checkpoint), "--data", str(tokens), "--device", "cpu",
           "--out", str(out), "--no-report"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=open(tmp_path / "stdout.txt", "w"), stderr=open(tmp_path / "stderr.txt", "w"),
                            env=env, start_new_session=True)


def wait_for_first_step(proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"lockstep run ended early with {proc.returncode}"
        if log.is_file() and STEP_LINE.search(log.read_text(errors="replace")):
            return
        time.sleep(0.2)
    raise AssertionError(f"no step line in {log} after {timeout_s} s")


def proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, start time) of every live process, from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        table[int(entry)] = (int(fields[1]), fields[0], fields[19])
    return table


def descendants(root: int) -> dict[int, str]:
    """pid -> start time of every process below `root` (any session: torchrun starts its own)."""
    table = proc_table()
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, start) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                frontier.append(pid)
    return found


def still_alive(procs: dict[int, str]) -> list[int]:
    table = proc_table()
    # The same pid with the same start time is the same process; a zombie has ended.
    return [pid for pid, start in procs.items() if pid in table and table[pid][2] == start and table[pid][1] != "Z"]



def kill_everything(proc, tree) -> None:
    """Whatever a failed test left running: the lockstep process and every descendant still alive."""
    for pid in [proc.pid, *still_alive(tree)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()

def test_sigterm_stops_torchrun_and_its_workers_and_marks_nothing_passed(tmp_path, tiny_checkpoint,
                                                                         tiny_shakespeare_train):
    out = tmp_path / "out"
    proc = start_run(tmp_path, tiny_checkpoint, tiny_shakespeare_train, dp=2, out=out)
    tree: dict[int, str] = {}
    try:
        wait_for_first_step(proc, out / "pytorch" / "long_dp2.log.partial")
        tree = descendants(proc.pid)
        assert len(tree) >= 3, tree  # torchrun and its two workers (at least)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        deadline = time.monotonic() + 5
        while still_alive(tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert still_alive(tree) == [], f"left running after SIGTERM: {still_alive(tree)}"
    finally:
        kill_everything(proc, tree)
    assert rc == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in (tmp_path / "stderr.txt").read_text()
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "interrupted"
    assert not (out / "summary.json").exists()
    assert not (out / "pytorch" / "long_dp2.jsonl").exists()  # the stopped case has no record to compare


STAND_IN_BUILD = ("#!/bin/sh\nsleep 300 &\n"
                  "echo 'E20251021 14:16:23.511394 140590029197312 main.cc:262] step    1/10 | train loss 10.9 | "
                  "lr 1.00e-04 | (2506.24 ms | 102 tok/s)' >&2\nsleep 300\n")


def stand_in_build(build: Path) -> Path:
    """A stand-in `gpt2` executable that logs a step, starts a child of its own and trains on."""
    build.mkdir(parents=True)
    exe = build / "gpt2"
    exe.write_text(STAND_IN_BUILD)
    exe.chmod(0o755)
    return build


def sigterm_stops_everything(tmp_path: Path, args: list[str], partial_logs: list[Path], processes: int) -> None:
    """`lockstep run ARGS` until every log in `partial_logs` has a step; then SIGTERM: exit 128+15, run.json
    says interrupted, and none of the (at least `processes`) processes it started is left."""
    cmd = [sys.executable, "-m", "lockstep", "run", *args, "--device", "cpu", "--out", str(tmp_path / "out"),
           "--no-report"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "stderr.txt", "w"),
                            env={**os.environ, "PYTHONPATH": str(SRC)}, start_new_session=True)
    tree: dict[int, str] = {}
    try:
        for log in partial_logs:
            wait_for_first_step(proc, log, timeout_s=60)
        tree = descendants(proc.pid)
        assert len(tree) >= processes, tree
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        assert still_alive(tree) == [], f"left running after SIGTERM: {still_alive(tree)}"
    finally:
        kill_everything(proc, tree)
    assert rc == 128 + signal.SIGTERM, (tmp_path / "stderr.txt").read_text()
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "interrupted"


def test_sigterm_stops_an_infinitrain_subprocess_and_what_it_started(tmp_path, tiny_checkpoint,
                                                                     tiny_shakespeare_train):
    build = stand_in_build(tmp_path / "build")
    sigterm_stops_everything(tmp_path, ["--cases", "gpt2_1", "--frameworks", "infinitrain", "--infinitrain-build",
                                        str(build), "--llmc", str(tiny_checkpoint), "--data",
                                        str(tiny_shakespeare_train)],
                             [tmp_path / "out" / "infinitrain" / "gpt2_1.log.partial"], processes=3)  # shell, 2 sleeps


def test_second_run_into_the_same_out_is_refused_and_sighup_stops_the_first(tmp_path, tiny_checkpoint,
                                                                             tiny_shakespeare_train, capsys):
    out = tmp_path / "out"
    first = start_run(tmp_path, tiny_checkpoint, tiny_shakespeare_train, dp=1, out=out)
    try:
        wait_for_first_step(first, out / "pytorch" / "long_dp1.log.partial")
        first.send_signal(signal.SIGSTOP)  # frozen, so that any change below is the second run's
        before = sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in out.rglob("*"))
        rc = main(["run", "--cases", "gpt2_1", "--frameworks", "pytorch", "--llmc", str(tiny_checkpoint),
                   "--data", str(tiny_shakespeare_train), "--device", "cpu", "--out", str(out)])
        err = capsys.readouterr().err
        assert rc == 1
        assert f"{out}: another lockstep run is writing to this directory (pid {first.pid}, started " in err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in out.rglob("*")) == before
        first.send_signal(signal.SIGCONT)
        first.send_signal(signal.SIGHUP)
        rc_first = first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert rc_first == 128 + signal.SIGHUP
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    assert not (out / "pytorch" / "long_dp1.jsonl").exists()


def test_ctrl_c_leaves_no_partial_log_under_its_final_name_and_report_marks_the_case_interrupted(
        tmp_path, tiny_checkpoint, tiny_shakespeare_train, capsys):
    # issue 36, item 9: after Ctrl-C, `pytorch/gpt2_2.log` held only its header line and
    # `lockstep report` of the directory exited 1 ("report is incomplete").
    matrix = tmp_path / "m.toml"
    matrix.write_text("".join(
        f'[[case]]\nname = "{name}"\nmodel = "gpt2"\ndtype = "float32"\nmicro_batch = 2\nseq_len = 32\n'
        f'total_batch = 64\nsteps = {steps}\nlr = 1e-4\n' for name, steps in (("short", 2), ("long", 400))))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "lockstep", "run", "--matrix", str(matrix), "--frameworks", "pytorch", "--llmc",
           str(tiny_checkpoint), "--data", str(tiny_shakespeare_train), "--device", "cpu", "--out", str(out),
           "--no-report", "--no-persistent-workers"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "stderr.txt", "w"),
                            env={**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        wait_for_first_step(proc, out / "pytorch" / "long.log.partial")
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        rc = proc.wait(timeout=60)
    finally:
        kill_everything(proc, {})
    assert rc == 130, (tmp_path / "stderr.txt").read_text()
    names = sorted(p.name for p in (out / "pytorch").iterdir())
    assert names == ["long.log.partial", "short.jsonl", "short.log"]  # no long.log, no long.jsonl
    assert STEP_LINE.search((out / "pytorch" / "short.log").read_text())  # the finished case's log, renamed
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"

    assert main(["report", str(out), "--no-history"]) == 0
    said = capsys.readouterr()
    line = ("INTERRUPTED: the run was stopped before it ended; this report covers the cases that finished, "
            "1 (case, framework) pair(s) did not: pytorch/long.")
    assert line in said.out and "incomplete" not in said.err
    md = (out / "report.md").read_text()
    assert f"**{line}**" in md and "### short" in md and "not run: pytorch interrupted before it finished" in md
    # A later run into the directory clears the stopped case's partial log with the rest of its outputs.
    from lockstep.outdir import open_run_dir

    with open_run_dir(out, ["pytorch"], {"cases": []}) as rd:
        assert rd.moved_aside == [] and not (out / "pytorch").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_stop_signals_interrupt_once_like_ctrl_c_and_the_handlers_come_back(sig):
    before = signal.getsignal(sig)
    with pytest.raises(Interrupted) as e:
        with stop_on_signals():
            try:
                os.kill(os.getpid(), sig)
                time.sleep(5)  # interrupted at once
            except Interrupted:
                os.kill(os.getpid(), sig)  # a second signal during the cleanup is ignored
                time.sleep(0.1)
                raise
    assert isinstance(e.value, KeyboardInterrupt) and e.value.signum == sig
    assert signal.getsignal(sig) is before


def test_sigterm_with_jobs_stops_the_builds_running_beside_each_other(tmp_path, tiny_checkpoint,
                                                                      tiny_shakespeare_train):
    """--jobs 2: two stand-in builds run at once, each supervised by a thread of lockstep; the signal
    reaches the main thread only, and both builds' processes (and their children) must still end."""
    builds = [a for name in ("a", "b") for a in ("--infinitrain-build", f"{name}={stand_in_build(tmp_path / name)}")]
    # both at once: the second started without waiting for the first; two shells and their four sleeps
    sigterm_stops_everything(tmp_path, ["--cases", "gpt2_1", "--frameworks", "infinitrain@a,infinitrain@b", *builds,
                                        "--jobs", "2", "--llmc", str(tiny_checkpoint), "--data",
                                        str(tiny_shakespeare_train)],
                             [tmp_path / "out" / f"infinitrain@{n}" / "gpt2_1.log.partial" for n in ("a", "b")],
                             processes=6)
