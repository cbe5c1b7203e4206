"""Persistent workers: start a framework's ranks once, run many cases in them, one after another.

Starting torchrun, importing a framework and building its process group costs seconds per case
(megatron-core: ~20 s on a GPU machine) and tearing it down again ~10 s; a matrix of short cases
spends most of its time there. A `WorkerGroup` starts the ranks once (torchrun, or for a single
rank on one machine a plain process with torchrun's environment) and hands them jobs through a
queue directory:

    parent                                  every rank (`serve_jobs`)
    writes <queue>/job-<n>.json    ----->   waits for it; redirects fd 1 and 2 to the job's log;
                                            runs the job (rank 0 streams steps to results-<n>.jsonl);
    reads results-<n>.jsonl        <-----   all ranks agree (TCP store) that the job ended, local
                                            rank 0 writes {"type": "done", "ok": ..., "error": ...};
                                            the framework frees the case's state; next n
    writes {"stop": true}          ----->   ranks leave the loop and exit

A job that fails on every rank (an exception in the training code, a bad case) fails that case
only; the ranks stay and take the next job. A rank that fails while others still train (they sit
in a collective that never completes), a crash, a rank exiting or a timeout ends the group: the
running case fails with the log's tail and the next job starts a fresh group. Each case's log
(`<case>.log`) holds exactly what the ranks printed while running it, plus torchrun's own lines
of that time.
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

from lockstep.errors import LockstepError, RunError
from lockstep.formats.run_record import StepRecord
from lockstep.fsutil import open_for_streaming
from lockstep.runners.host_memory import release_freed_memory
from lockstep.runners.launch import (ResultsWriter, _drain, _tail, kill_process_group, one_rank_env, spawn_group,
                                     rendezvous_id, torchrun_command, worker_env)
from lockstep.runners.nodes import NODE_RANK_ENV, NodeLayout, reports_results

SERVE_FLAG = "--serve"
PARENT_PID_ENV = "LOCKSTEP_WORKERS_PARENT_PID"
DEVICE_ENV = "LOCKSTEP_WORKERS_DEVICE"  # "cpu" | "cuda": the ranks start their process group before any job
# Set under srun: one lockstep, one queue on a shared filesystem, so one rank (local rank 0 of
# node 0) says a job is over; otherwise every node's lockstep reads its own node's local rank 0.
SHARED_QUEUE_ENV = "LOCKSTEP_WORKERS_SHARED_QUEUE"
SPAWNED_AT_ENV = "LOCKSTEP_WORKERS_SPAWNED_AT"  # wall clock of the parent's spawn, for the start-up timeline
STARTUP_FILE = "startup.json"  # local rank 0's start-up timeline, in the queue directory
POLL_S = 0.05  # how often the parent reads results and the ranks look for their next job
# A rank still without a job this long after the last one looks less often: a group left idle (a test
# session keeps several open after their test files, `lockstep run` one per layout) then costs a third
# of the CPU (one idle rank: 0.57% -> 0.17% of a core; two under torchrun: 1.33% -> 0.57%, on the
# 2-core CI machine), for at most IDLE_POLL_S more wait on a case handed to it later. Cases handed
# over one after another (a matrix, a test file's tests) find the rank still looking often.
BUSY_WAIT_S = 10.0
IDLE_POLL_S = 0.2
# How long a rank that finished a job waits for the others to finish it too. Healthy ranks end a
# job within a moment of each other (the last step ends with all-reduces); a rank still missing
# after this is stuck in a collective that a failed rank left, and only a fresh group recovers.
AGREE_TIMEOUT_S = 60.0
# Ranks with no job for this long end (their lockstep is gone without stopping them).
IDLE_TIMEOUT_S = 900.0
STOP_GRACE_S = 60.0  # after "stop", how long the ranks get to exit before they are killed


class WorkerGroupDied(RunError):
    """The whole group ended (crash, a rank exiting, timeout) while it ran a case. `what` says
    how, `tail` is the case log's last lines (both are in the message too)."""

    def __init__(self, log_path: Path, what: str, tail: str):
        super().__init__(f"{log_path}: {what}{tail}")
        self.what, self.tail = what, tail


class WorkerGroup:
    """One persistent group of ranks for `module` (`python -m module --serve QUEUE_DIR`).

    `run_job` starts the group when none is running (the first job, or the first after the group
    died) and returns the job's (steps, info) like `launch.run_workers`, raising RunError when
    the case failed. `close` stops the ranks. Use as a context manager.
    """

    def __init__(self, module: str, nproc: int, device: str, env: dict | None = None, nodes: NodeLayout | None = None,
                 use_torchrun: bool = True, label: str = ""):
        self.module, self.nproc, self.env = module, nproc, {**(env or {}), DEVICE_ENV: device}
        self.nodes = nodes or NodeLayout()
        self.use_torchrun = use_torchrun
        self.label = label or module.split(".")[-2]
        self.proc: subprocess.Popen | None = None
        self.queue_dir: Path | None = None
        self.command: list[str] = []
        self.next_job = 0  # job file number in the current queue directory
        self.position = 0  # jobs handed to the current group (1-based once one ran)
        self.starts = 0  # groups started so far (a group that died is replaced by a fresh one)
        self.started_at = ""
        self.startup_read = False  # the current group's start-up timeline went into a case's info

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # interrupted (a signal) or failing: the ranks must not outlive lockstep
            self._discard()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _start(self, first_job: dict, log_dir: Path) -> None:
        # Under srun the ranks of other nodes read the queue: it lives next to the logs (shared).
        shared = log_dir if self.nodes.launcher == "slurm" else None
        self.queue_dir = Path(tempfile.mkdtemp(prefix="lockstep-workers-", dir=shared))
        args = [SERVE_FLAG, str(self.queue_dir)]
        env = dict(self.env)
        if self.nodes.launcher != "slurm":
            env[PARENT_PID_ENV] = str(os.getpid())  # ranks on this host end when lockstep is gone
        else:
            env[SHARED_QUEUE_ENV] = "1"
        if self.use_torchrun:
            # The same id on every node for the same group start; a new id for a fresh group.
            run_id = rendezvous_id(self.module, first_job) + f"-g{self.starts}"
            self.command = torchrun_command(self.module, self.nproc, args, self.nodes, run_id)
            env[NODE_RANK_ENV] = str(self.nodes.node_rank)
        else:
            if self.nproc != 1 or self.nodes.multi_node:
                raise ValueError("a worker group without torchrun has one rank on one node")
            self.command = [sys.executable, "-m", self.module, *args]
            env.update(one_rank_env())
        env[SPAWNED_AT_ENV] = repr(time.time())
        self._group_log = open(self.queue_dir / "group.log", "w")
        self.proc = spawn_group(self.command, stdout=self._group_log, stderr=subprocess.STDOUT, env=worker_env(env))
        self.next_job, self.position = 0, 0
        self.startup_read = False
        self.starts += 1
        self.started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

    def prestart(self, case: dict, log_dir: Path) -> None:
        """Start the ranks now, before their first case is handed over: their start-up (torchrun,
        imports, the process group) then overlaps whatever runs in the meantime."""
        if not self.running:
            self._discard()
            self._start({"case": case}, Path(log_dir))

    def run_job(self, job: dict, log_path: Path, timeout_s: float | None = None,
                on_step: Callable[[StepRecord], None] | None = None) -> tuple[list[StepRecord], dict]:
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if not self.running:
            self._discard()
            self._start(job, log_path.parent)
        n = self.next_job
        self.next_job += 1
        self.position += 1
        results_path = self.queue_dir / f"results-{n}.jsonl"
        job = {**job, "results_path": str(results_path), "log_path": str(log_path)}
        group_log = self.queue_dir / "group.log"
        group_log_offset = group_log.stat().st_size
        with open_for_streaming(log_path, "native log") as log:
            log.write(f"[COMMAND] {shlex.join(self.command)}\n"
                      f"[WORKER] persistent worker group {self.starts} ({self.label}, started {self.started_at}), "
                      f"case {self.position} in this group\n")
        _write_atomically(self.queue_dir / f"job-{n}.json", json.dumps(job))
        handed_wall = time.time()
        steps: list[StepRecord] = []
        info: dict = {"worker_command": shlex.join(self.command),
                      "persistent_worker": {"group": self.starts, "position": self.position,
                                            "group_started_at": self.started_at}}
        done: dict = {}
        seen = 0
        start = time.monotonic()
        timed_out = False
        try:
            while True:
                seen = _drain(results_path, seen, steps, done, on_step)
                if "ok" in done:
                    break
                if self.proc.poll() is not None:
                    seen = _drain(results_path, seen, steps, done, on_step)
                    break
                if timeout_s is not None and time.monotonic() - start > timeout_s:
                    timed_out = True
                    kill_process_group(self.proc)
                    break
                time.sleep(POLL_S)
        except BaseException:
            # A signal (KeyboardInterrupt) or a failing progress callback: the ranks run in their
            # own session and would train on (holding devices) after lockstep is gone.
            self._discard()
            raise
        finally:
            _copy_new_bytes(group_log, group_log_offset, log_path)
        info.update({k: v for k, v in done.items() if k not in ("ok", "error", "group_ends")})
        if not self.startup_read:
            # The first case a group ran carries where the group's start-up went (it waited for it).
            startup = _read_json(self.queue_dir / STARTUP_FILE) if self.queue_dir else None
            if startup:
                ready = startup.pop("ready_wall", handed_wall)
                # On the critical path only when the case had to wait for the group to be ready.
                startup["case_waited_s"] = round(max(ready - handed_wall, 0.0), 3)
                info["worker_startup"] = startup
                self.startup_read = True
        if done.get("group_ends"):
            self._discard()  # its ranks are ending; the next job must not be handed to them
        if "ok" in done:
            if done["ok"]:
                return steps, info
            raise RunError(f"{log_path}: {done.get('error') or 'the case failed in the worker'}")
        rc = self.proc.wait()
        self._discard()
        if timed_out:
            raise WorkerGroupDied(log_path, f"timed out after {timeout_s:.0f} s at step {len(steps)} (the worker "
                                  "group was stopped; the next case starts a fresh one)", _tail(log_path))
        raise WorkerGroupDied(log_path, f"the worker group exited with status {rc} during this case, after "
                              f"{len(steps)} step(s)", _tail(log_path))

    def close(self) -> None:
        """Ask the ranks to stop and wait for them (killed after STOP_GRACE_S)."""
        if self.running:
            _write_atomically(self.queue_dir / f"job-{self.next_job}.json", json.dumps({"stop": True}))
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            except BaseException:
                self._discard()
                raise
        self._discard()

    def discard(self) -> None:
        """Kill the ranks at once: for a group that ran no case (nothing of theirs to wait for)."""
        self._discard()

    def _discard(self) -> None:
        """Kill whatever of the group is left and remove its queue directory."""
        if self.proc is not None:
            kill_process_group(self.proc, grace_s=2.0)
            self.proc = None
        if getattr(self, "_group_log", None) is not None:
            self._group_log.close()
            self._group_log = None
        if self.queue_dir is not None:
            shutil.rmtree(self.queue_dir, ignore_errors=True)
            self.queue_dir = None


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)


def _copy_new_bytes(source: Path, offset: int, dest: Path) -> None:
    """What torchrun (and the ranks between jobs) wrote to the group's log while a case ran."""
    try:
        with open(source, "rb") as f:
            f.seek(offset)
            extra = f.read()
    except OSError:
        return
    if extra.strip():
        with open(dest, "ab") as out:
            out.write(b"[WORKER GROUP OUTPUT]\n" + extra)


# ---- the rank side ---------------------------------------------------------------------------

class StartupTimeline:
    """When a rank reached each stage of its start-up, as seconds after the parent spawned the group:
    `mark("process group")` after each stage; `serve_jobs` adds "ready" and local rank 0 writes it
    to the queue directory, where the parent reads it into the first case's record ("worker_startup":
    torchrun and the interpreter, imports, the process group, the framework's imports, then waiting
    for the first case). A group started early (prestart) shows its wait there too."""

    def __init__(self):
        self.spawned = float(os.environ.get(SPAWNED_AT_ENV) or time.time())
        self.last = self.spawned
        self.stages: dict[str, float] = {}
        began = _process_start_wall()
        if began is not None and began > self.spawned - 0.1:  # clock-tick granularity
            self._add("launcher and interpreter", began)
        self.mark("imports")  # lockstep's modules and torch, imported before the worker's main ran

    def _add(self, stage: str, at: float) -> None:
        self.stages[stage] = round(max(at - self.last, 0.0), 3)
        self.last = at

    def mark(self, stage: str) -> None:
        self._add(stage, time.time())

    def write(self, queue_dir: Path) -> None:
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:
            self.mark("ready")
            _write_atomically(queue_dir / STARTUP_FILE, json.dumps(
                {"stages": self.stages, "ready_after_s": round(self.last - self.spawned, 3), "ready_wall": self.last}))


def _process_start_wall() -> float | None:
    """This process's start time (wall clock), from its age on Linux (/proc's start time in clock
    ticks since boot against the boot clock now); None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class JobHandler:
    """What a framework's worker module plugs into `serve_jobs`."""

    def run(self, job: dict, writer: ResultsWriter) -> dict:
        """Train the job's case; return the info for the record. Raise on failure."""
        raise NotImplementedError

    def release(self, all_ranks_ok: bool) -> None:
        """Free what the case held (model, optimizer, the framework's per-case global state);
        `all_ranks_ok`: the case ended well on every rank (state shared by the ranks, such as
        process groups, may then be kept for the next case: every rank decides alike)."""


def serve_arguments(argv: list[str]) -> tuple[Path, str] | None:
    """(queue directory, device kind) when a worker module was started as a persistent worker."""
    if len(argv) == 2 and argv[0] == SERVE_FLAG:
        return Path(argv[1]), os.environ.get(DEVICE_ENV, "cpu")
    return None


def serve_jobs(queue_dir: Path, handler: JobHandler, startup: StartupTimeline | None = None) -> int:
    """Every rank's loop: run each job written to `queue_dir`, in order, until "stop"."""
    import torch

    fresh = _FreshState.capture(torch)
    if startup is not None:
        startup.write(queue_dir)
    for n in range(10**9):
        job = _wait_for_job(queue_dir / f"job-{n}.json")
        if job is None:  # lockstep is gone without stopping the group
            end_multiprocessing_children()
            os._exit(1)
        if job.get("stop"):
            break
        fresh.restore(torch)
        writer = ResultsWriter(job["results_path"] if reports_results() else None)
        ok, error = True, ""
        with _output_to(job["log_path"]):
            try:
                info = handler.run(job, writer)
                writer.info(**info)
            except Exception as e:
                ok = False
                error = str(e) if isinstance(e, LockstepError) else f"rank {_rank()}: {type(e).__name__}: {e}"
                if not isinstance(e, LockstepError):
                    traceback.print_exc()
            releasing = time.perf_counter()
            agreed = _agree(n, ok)
            try:
                handler.release(all_ranks_ok=bool(agreed) and ok)
            except Exception as e:  # the next case cannot trust this group any more
                traceback.print_exc()
                ok, error = False, error or f"rank {_rank()}: releasing the case failed: {type(e).__name__}: {e}"
                _finish(job, n, False, error, group_ends=True)
                return 1
            gc.collect()
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
            release_freed_memory()  # an idle rank holds no more than it needs to wait (host_memory.py)
            released_s = round(time.perf_counter() - releasing, 3)
        if agreed is None:
            # Another rank never finished this job: it is stuck in a collective this rank's failure
            # left open. Only ending the group frees it; the parent starts a fresh one.
            _finish(job, n, False, error or "a rank did not finish the case", group_ends=True)
            return 1
        _finish(job, n, agreed and ok, error if not ok else ("" if agreed else "the case failed on another rank"),
                release_s=released_s)
    return _leave()


class _FreshState:
    """The random generators as a fresh process has them, restored before every job, so that
    case k of a group starts from the state case 1 (or a one-case process) starts from."""

    def __init__(self, torch_seed, py_state, np_state):
        self.torch_seed, self.py_state, self.np_state = torch_seed, py_state, np_state

    @classmethod
    def capture(cls, torch) -> "_FreshState":
        try:
            import numpy as np

            np_state = np.random.get_state()
        except ImportError:
            np_state = None
        return cls(torch.initial_seed(), random.getstate(), np_state)

    def restore(self, torch) -> None:
        torch.manual_seed(self.torch_seed)  # CPU and every CUDA device, as at process start
        random.setstate(self.py_state)
        if self.np_state is not None:
            import numpy as np

            np.random.set_state(self.np_state)


def _rank() -> int:
    return int(os.environ.get("RANK", 0))


def _parent_gone() -> bool:
    pid = os.environ.get(PARENT_PID_ENV)
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False


def _wait_for_job(path: Path) -> dict | None:
    started = time.monotonic()
    while not path.exists():
        waited = time.monotonic() - started
        if waited > IDLE_TIMEOUT_S or _parent_gone():
            return None
        time.sleep(POLL_S / 2 if waited < BUSY_WAIT_S else IDLE_POLL_S)
    return json.loads(path.read_text())


class _output_to:
    """Point this process's fd 1 and 2 (Python's prints, C++ and NCCL output alike) at a case's
    log for the duration of the job, appending as the other ranks do."""

    def __init__(self, log_path: str):
        self.log_path = log_path

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        return self

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        os.close(self.saved[0])
        os.close(self.saved[1])
        return False


def _agree(n: int, ok: bool) -> bool | None:
    """True when every rank finished job `n` without error, False when all finished but some
    failed, None when some rank did not finish within AGREE_TIMEOUT_S. Uses the process group's
    TCP store, not a collective: a rank stuck in a collective must not be needed to decide."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return ok
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # no store to agree through: a failure anywhere must end the group
        return ok if ok else None
    world, rank = dist.get_world_size(), dist.get_rank()
    keys = [f"lockstep-job{n}-rank{r}" for r in range(world)]
    store.set(keys[rank], b"1" if ok else b"0")
    try:
        store.wait(keys, _dt.timedelta(seconds=AGREE_TIMEOUT_S))
        return all(store.get(k) == b"1" for k in keys)
    except Exception:
        return None


def _finish(job: dict, n: int, ok: bool, error: str, group_ends: bool = False, release_s: float | None = None) -> None:
    """Local rank 0 of every node says the job is over (the parent on each node waits for it),
    and whether the group ends with it (then the parent starts a fresh one for the next job);
    `release_s`: how long freeing the case took (part of its teardown)."""
    says = reports_results() if os.environ.get(SHARED_QUEUE_ENV) else int(os.environ.get("LOCAL_RANK", 0)) == 0
    if says:
        row = {"type": "info", "ok": ok, "error": error, "group_ends": group_ends}
        if release_s is not None:
            row["worker_release_s"] = release_s
        ResultsWriter(job["results_path"])._write(row)


def _leave() -> int:
    """After "stop": end without tearing the process group down collective by collective (seconds
    per group on NCCL); the group's processes all end here together."""
    import torch.distributed as dist

    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        try:
            dist.barrier()
        except Exception:
            pass
    end_multiprocessing_children()
    os._exit(0)


def end_multiprocessing_children(timeout_s: float = 5.0) -> list[int]:
    """Stop the multiprocessing children this rank started (their pids), before an `os._exit` that
    skips multiprocessing's own exit handlers. megatron-core's checkpoint saves start one: a spawned
    Manager process serving the write-results queue (dist_checkpointing/strategies/filesystem_async.py),
    kept for the life of the process and otherwise left running, orphaned, once the rank is gone."""
    import multiprocessing

    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout_s)
        if child.is_alive():
            child.kill()
            child.join(timeout_s)
    return [c.pid for c in children]
