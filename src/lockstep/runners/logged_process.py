"""A framework run as one subprocess whose console output is its native log (InfiniTrain's
executables, the `command` runner's trainers).

The process runs in a session of its own, so that a timeout, Ctrl-C or SIGTERM stops its whole
tree (launch.supervise kills the group); its stdout and stderr go verbatim into `<case>.log`
under a `[COMMAND] ...` line, and the step lines in that log, read as they appear, are the run's
results.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lockstep.errors import FormatError, RunError
from lockstep.formats.run_record import StepRecord
from lockstep.fsutil import open_for_streaming
from lockstep.runners.launch import spawn_group, supervise

POLL_INTERVAL_S = 0.5
TAIL_LINES = 15

# (the log's text, its path for messages) -> its step records; raises FormatError when it holds none.
StepParser = Callable[[str, str], list[StepRecord]]


@dataclass(frozen=True)
class LoggedRun:
    text: str  # the whole log
    steps: list[StepRecord]
    returncode: int
    timed_out: bool


def run_logged(cmd: list[str], log_path: Path, parse: StepParser, *, env: dict, cwd: Path | None = None,
               timeout_s: float | None = None, on_step: Callable[[StepRecord], None] | None = None,
               what: str = "the framework") -> LoggedRun:
    """Run `cmd` with its output into `log_path`, reporting each new step line to `on_step` while it
    runs; past `timeout_s` (or on an interrupt) its process group is killed."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    streamer = StepStreamer(str(log_path), on_step, parse)
    with open_for_streaming(log_path, "native log") as log:
        log.write(f"[COMMAND] {shlex.join(cmd)}\n")
        log.flush()
        try:
            proc = spawn_group(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        except OSError as e:
            raise RunError(f"{cmd[0]}: could not start {what} ({e.strerror or e})") from None
        rc, timed_out = supervise(proc, streamer.poll, timeout_s, POLL_INTERVAL_S)
    text = log_path.read_text(errors="replace")
    streamer.poll(final=True)
    return LoggedRun(text=text, steps=parse_or_none(parse, text, str(log_path)), returncode=rc, timed_out=timed_out)


def parse_or_none(parse: StepParser, text: str, source: str) -> list[StepRecord]:
    try:
        return parse(text, source)
    except FormatError:
        return []  # no step line (yet): the caller reports the run's failure with the log's tail


class StepStreamer:
    """Reads the growing log while the process runs and reports each new step line once."""

    def __init__(self, source: str, on_step: Callable[[StepRecord], None] | None, parse: StepParser):
        self.source = source
        self.on_step = on_step
        self.parse = parse
        self.reported = 0

    def poll(self, final: bool = False) -> None:
        if self.on_step is None:
            return
        try:
            text = Path(self.source).read_text(errors="replace")
        except OSError:
            return
        if not final:
            text = text[: text.rfind("\n") + 1]  # only whole lines; the last one may still be written
        steps = parse_or_none(self.parse, text, self.source)
        for rec in steps[self.reported:]:
            self.on_step(rec)
        self.reported = max(self.reported, len(steps))


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"was killed by {name}"
    if rc > 128:
        try:
            return f"exited with status {rc} ({signal.Signals(rc - 128).name})"
        except ValueError:
            pass
    return f"exited with status {rc}"


def log_tail(text: str, n: int = TAIL_LINES) -> str:
    keep = [ln for ln in text.splitlines() if ln.strip()][-n:]
    return "; last lines of the log:\n    " + "\n    ".join(keep) if keep else ""


def check_finished(run: LoggedRun, log_path: Path, steps_planned: int, what: str, timeout_s: float | None = None,
                   writes_records: bool = True, first: int = 1) -> None:
    """A run that timed out, exited non-zero, or exited normally short of its steps `first`..
    `steps_planned` (first > 1: a resumed run), as a RunError naming the log, with the log's last lines."""
    if run.timed_out:
        raise RunError(f"{log_path}: {what} timed out after {timeout_s or 0:.0f} s at step {len(run.steps)} of "
                       f"{steps_planned}" + log_tail(run.text))
    if run.returncode != 0:
        raise RunError(f"{log_path}: {what} {describe_exit(run.returncode)} after {len(run.steps)} of {steps_planned} "
                       "step(s)" + log_tail(run.text))
    if writes_records and [s.step for s in run.steps] != list(range(first, steps_planned + 1)):
        raise RunError(f"{log_path}: {what} exited normally but logged {len(run.steps)} of "
                       f"{steps_planned - first + 1} step(s)" + log_tail(run.text))
