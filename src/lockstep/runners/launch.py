"""Start a runner's worker processes (torchrun for several, a plain subprocess for one) and
stream their per-step results back while they train.

Workers write their console output (the framework's native log) to `<case>.log` and one JSON
object per finished step to a results file that the parent polls, so progress shows live and
a crash still leaves the log of everything that happened before it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from lockstep.errors import RunError
from lockstep.formats.run_record import StepRecord
from lockstep.fsutil import open_for_streaming
from lockstep.runners.nodes import NODE_RANK_ENV, NodeLayout, slurm_command, torchrun_args

# NVLink multicast (NVLS) can take a shared host's GPUs out of service; never let NCCL use it.
SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def worker_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(SAFE_NCCL_ENV)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    if extra:
        env.update(extra)
    return env


def shared_cores_env(jobs: int) -> dict:
    """The environment of one of `jobs` processes run at once (--jobs): the machine's cores split
    between their OpenMP thread pools, which otherwise each take every core and fight (two CPU builds of one
    external trainer with the default threads on 2 cores: 22 s each; one thread each: 11 s, as alone). The
    user's own OMP_NUM_THREADS stands."""
    if jobs <= 1 or "OMP_NUM_THREADS" in os.environ:
        return {}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"OMP_NUM_THREADS": str(max(1, cores // jobs))}


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _libc():
    """libc, loaded once before any fork: the pre-exec hook below must not load a library."""
    import ctypes

    global _LIBC
    if _LIBC is None and sys.platform.startswith("linux"):
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


_LIBC = None


def _die_with_parent() -> None:
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def end_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux's PR_SET_PDEATHSIG; a no-op
    elsewhere). A worker calls it first thing: a SIGKILLed lockstep (or torchrun) can run no
    clean-up, and a rank left alone would train on, hold its device and write checkpoint folders
    into --out. A parent gone before the call (the worker is then an orphan of init) ends it now."""
    if _libc() is None:
        return
    _die_with_parent()
    if os.getppid() == 1:
        os._exit(1)


def spawn_group(cmd: list[str], **popen_kwargs) -> subprocess.Popen:
    """`cmd` in a session of its own (so `kill_process_group` stops everything it starts), killed by
    the kernel if lockstep itself is killed (PR_SET_PDEATHSIG, set between fork and exec: it only
    calls the libc loaded here). The kernel sends it when the *thread* that forked the child ends:
    a group that outlives the call must be spawned from a thread that outlives the group."""
    _libc()
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent, **popen_kwargs)


class RunningGroups:
    """The process groups `supervise` watches right now, in any thread. An interrupt reaches only the
    main thread: the pairs other threads supervise (--jobs) are stopped through `stop_all`, and a
    group started while stopping is killed as it starts."""

    def __init__(self):
        self._pids: set[int] = set()
        self._stopping = False
        self._lock = threading.Lock()

    def add(self, pid: int) -> bool:
        """Watch `pid`'s group; False (not added) while stopping."""
        with self._lock:
            if self._stopping:
                return False
            self._pids.add(pid)
            return True

    def discard(self, pid: int) -> None:
        with self._lock:
            self._pids.discard(pid)

    def stop_all(self) -> list[int]:
        """SIGKILL every watched group (its supervising thread then sees it end) and refuse new ones
        until `resume`; the groups' ids."""
        with self._lock:
            self._stopping = True
            stopped = sorted(self._pids)
            for pgid in stopped:
                _signal_group(pgid, signal.SIGKILL)
        return stopped

    def resume(self) -> None:
        with self._lock:
            self._stopping = False


# Process-wide on purpose, as the signal that interrupts them is: the child processes of this
# lockstep process, whichever thread and runner started them.
RUNNING_GROUPS = RunningGroups()


def torchrun_command(module: str, nproc: int, args: list[str], nodes: NodeLayout | None = None,
                     run_id: str = "lockstep") -> list[str]:
    """torchrun for `nproc` ranks in all: standalone on one machine, else this node's share of them
    over a c10d rendezvous (or, with the slurm launcher, one torchrun per node under srun)."""
    nodes = nodes or NodeLayout()
    head = [sys.executable, "-m", "torch.distributed.run"]
    tail = ["-m", module, *args]
    if nodes.launcher == "slurm":
        return slurm_command(nodes, head, nproc, run_id, tail)
    return [*head, *torchrun_args(nodes, nproc, run_id), *tail]


def one_rank_env() -> dict:
    """What torchrun would give the only rank of a one-process group on this machine (its process
    group's store on a free local port): a single rank needs no launcher, and torchrun's own start
    (its interpreter, torch, the rendezvous) costs seconds before the rank even begins."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def rendezvous_id(module: str, job: dict) -> str:
    """The same on every node for the same (framework, case), different between consecutive runs."""
    case = job.get("case", {}).get("name", "case") if isinstance(job.get("case"), dict) else "case"
    return re.sub(r"[^A-Za-z0-9_-]", "-", f"lockstep-{module.split('.')[-2]}-{case}")


def run_workers(module: str, job: dict, nproc: int, log_path: Path, timeout_s: float | None = None,
                on_step: Callable[[StepRecord], None] | None = None, env: dict | None = None,
                use_torchrun: bool = True, nodes: NodeLayout | None = None) -> tuple[list[StepRecord], dict]:
    """Run `python -m module JOB.json` under torchrun; return its step records and final info.

    The job dict is written to JOB.json with `results_path` added; the reporting rank (local
    rank 0 of node 0, nodes.reports_results) appends `{"type": "step", ...}` lines and finally
    one `{"type": "info", ...}` line there. With several nodes, this node's ranks are started
    and `nproc` is the world size over all nodes; under srun the job directory is next to the
    log (`log_path`'s directory must then be on a filesystem every node sees).
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    nodes = nodes or NodeLayout()
    shared_dir = log_path.parent if nodes.launcher == "slurm" else None
    with tempfile.TemporaryDirectory(prefix="lockstep-job-", dir=shared_dir) as td:
        job_path, results_path = Path(td) / "job.json", Path(td) / "results.jsonl"
        job = {**job, "results_path": str(results_path)}
        job_path.write_text(json.dumps(job))
        if use_torchrun:
            cmd = torchrun_command(module, nproc, [str(job_path)], nodes, rendezvous_id(module, job))
            # Workers know their node (c10d numbers ranks by address, not by --node-rank).
            env = {**(env or {}), NODE_RANK_ENV: str(nodes.node_rank)}
        else:
            cmd = [sys.executable, "-m", module, str(job_path)]
        steps: list[StepRecord] = []
        info: dict = {"worker_command": shlex.join(cmd)}
        with open_for_streaming(log_path, "native log") as log:
            log.write(f"[COMMAND] {shlex.join(cmd)}\n")
            log.flush()
            proc = spawn_group(cmd, stdout=log, stderr=subprocess.STDOUT, env=worker_env(env))
            seen = [0]  # result lines read so far

            def poll() -> None:
                seen[0] = _drain(results_path, seen[0], steps, info, on_step)

            rc, timed_out = supervise(proc, poll, timeout_s)
        _drain(results_path, seen[0], steps, info, on_step)
        if timed_out:
            raise RunError(f"{log_path}: timed out after {timeout_s:.0f} s at step {len(steps)}"
                           + _tail(log_path))
        if rc != 0:
            raise RunError(f"{log_path}: worker exited with status {rc} after {len(steps)} step(s)" + _tail(log_path))
        return steps, info


def supervise(proc: subprocess.Popen, poll: Callable[[], None], timeout_s: float | None,
              interval_s: float = 0.5) -> tuple[int, bool]:
    """Wait for a child started with start_new_session=True, calling `poll` every `interval_s`;
    past `timeout_s` kill its whole group. Returns (exit status, timed out).

    On any exception -- a signal (SIGINT/SIGTERM/SIGHUP arrive as KeyboardInterrupt) or a failing
    `poll` -- the group is killed before it propagates: the child runs in its own session, so
    nothing else would stop it and it would keep training (and holding devices) after lockstep."""
    start = time.monotonic()
    if not RUNNING_GROUPS.add(proc.pid):
        kill_process_group(proc)
        raise RunError("stopped: lockstep was interrupted as this process started")
    try:
        while True:
            try:
                status = proc.wait(timeout=interval_s)
            except subprocess.TimeoutExpired:
                pass
            else:
                # What it left in its session (a checkpoint writer's spawned helper outliving its rank)
                # would run on with nobody to stop it.
                _signal_group(proc.pid, signal.SIGKILL)
                return status, False
            poll()
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                kill_process_group(proc)
                return proc.wait(), True
    except BaseException:
        kill_process_group(proc)
        raise
    finally:
        RUNNING_GROUPS.discard(proc.pid)


def _drain(results_path: Path, seen: int, steps: list[StepRecord], info: dict, on_step) -> int:
    if not results_path.exists():
        return seen
    lines = results_path.read_text().splitlines()
    for line in lines[seen:]:
        if not line.endswith("}"):
            return seen  # a line still being written; read it next time
        row = json.loads(line)
        kind = row.pop("type", None)
        if kind == "step":
            rec = StepRecord(**row)
            steps.append(rec)
            if on_step:
                on_step(rec)
        elif kind == "info":
            info.update(row)
        seen += 1
    return seen


def kill_process_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Stop a child started with start_new_session=True and everything it started (torchrun's
    ranks, InfiniTrain's threads): SIGTERM to the whole group, then SIGKILL to whatever of the
    group is still there after `grace_s` (torchrun may exit before its workers do)."""
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    while time.monotonic() < deadline and _group_exists(pgid):
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(path: Path, n: int = 12) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    keep = [ln for ln in lines if ln.strip()][-n:]
    return "; last lines of the log:\n    " + "\n    ".join(keep) if keep else ""


class ResultsWriter:
    """Used by a worker (rank 0) to append step results for the parent."""

    def __init__(self, path: str | None):
        self.path = path

    def step(self, rec: StepRecord) -> None:
        self._write({"type": "step", **rec.to_dict()})

    def info(self, **fields) -> None:
        self._write({"type": "info", **fields})

    def _write(self, row: dict) -> None:
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")
