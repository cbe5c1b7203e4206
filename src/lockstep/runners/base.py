"""The one interface every framework runner implements, and what they share.

A runner turns (case spec, inputs) into a run record plus the framework's native log:
`<out>/<framework>/<case>.log` and `<out>/<framework>/<case>.jsonl`. Subclasses implement
`execute`; `run` wraps it so that every failure ends as a record marked failed.

A runner that can look inside its framework is also a `StepInspector`: it captures step 1 of a case
(`capture`, and `capture_problem` saying when it cannot): every module output and gradient under canonical
names (capture/, formats/step_capture.py). `lockstep run` asks for it with `RunInputs.capture`
(the certificate of every FP32 pair): a runner records it while it trains where it can, else
`run` captures after the run; `lockstep diagnose` calls `capture` directly.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
import os
import platform
import shlex
import subprocess
import sys
from abc import ABC, abstractmethod
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, ClassVar, Hashable, Sequence

from lockstep import __version__
from lockstep.capture.request import CaptureRequest
from lockstep.cases.spec import NEED_TITLES, CaseSpec
from lockstep.errors import LockstepError, RunError
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record
from lockstep.formats.step_capture import GRAD_EXACT
from lockstep.fsutil import atomic_write, open_for_streaming, os_error_sentence, write_error
from lockstep.models import family as model_family
from lockstep.models.family import ModelFamily
from lockstep.runners.nodes import NodeLayout
from lockstep.step_contract import LOGGED_FP64_MEAN, PHASES

StepCallback = Callable[[StepRecord], None]
StartCallback = Callable[[CaseSpec, str], None]  # (case, framework) before each run
DoneCallback = Callable[[CaseSpec, list[RunRecord]], None]  # a case's records (one per repeat that ran)


@dataclass(frozen=True)
class RunInputs:
    """What every framework gets for a case: the same weights, tokens and device kind."""

    checkpoint: Path  # LLMC checkpoint
    tokens: Path  # llm.c token stream (train split)
    model: Any  # the family's config, from the checkpoint header
    device: str  # "cpu" | "cuda"
    model_name: str = ""  # the registered shape (e.g. gpt2-tiny), or the checkpoint file's name
    checkpoint_sha256: str = ""
    tokens_sha256: str = ""
    corpus: str = ""  # e.g. "tiny_shakespeare", or the offline corpus's name
    timeout_s: float | None = None
    extra: dict = field(default_factory=dict)  # runner-specific options (e.g. infinitrain build dir)
    # CPU only, asked for with --oversubscribe: more ranks than cores, one torch thread each.
    oversubscribe: bool = False
    nodes: NodeLayout = field(default_factory=NodeLayout)  # this node's place among the run's nodes
    # Write every parameter after the last step under its canonical LLMC name to
    # `<out>/<framework>/<case>.final.npz` (runners that can read their weights back: pytorch,
    # megatron). Off by default: tests compare whole models with it, `lockstep run` does not.
    save_final_params: bool = False
    # Record step 1 from inside as this asks (`lockstep run`'s certificate): the capture's path
    # lands in the record's meta as `step1_capture` (or `step1_capture_error` saying why not).
    capture: CaptureRequest | None = None
    # The seed of a LoRA case's one adapter init (models/lora.py `lora_init_tensors`): the run's
    # seed (--seed), the same for every framework.
    lora_seed: int = 42
    # How many runs may run at once (--jobs): above 1, this run's tok/s may be measured beside another's.
    jobs: int = 1

    @property
    def family(self) -> ModelFamily:
        return model_family(self.model.family)


@dataclass(frozen=True)
class HardCoded:
    """Case fields a framework's build fixes whatever the case asks (e.g. a Qwen3 build's
    Adam beta2 0.95), and why; the plan makes them the case's, for every framework."""

    fields: dict
    why: str


@dataclass
class ExecuteResult:
    steps: list[StepRecord]
    meta: dict = field(default_factory=dict)  # framework version, device name, command, ...


class FrameworkRunner(ABC):
    name: ClassVar[str]
    # How the framework's logged loss is made (step_contract): what its last digits mean.
    logged_loss: ClassVar[str] = LOGGED_FP64_MEAN
    # What the runner implements of a case's `needs` (cases.spec NEEDS_*): a case needing more is
    # skipped by `case_skip_reason` before the runner's own reasons are asked.
    supports: ClassVar[frozenset[str]] = frozenset()
    # Each run is a process of its own sharing nothing with lockstep's or another run's (an
    # external build): `--jobs` may run it beside others.
    runs_apart: ClassVar[bool] = False

    @abstractmethod
    def version(self) -> str:
        """The framework's version string for the record."""

    def preflight(self, inputs: RunInputs) -> None:
        """Raise LockstepError when the framework cannot run at all (checked before any case)."""

    def skip_reason(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        """Why this machine cannot run the case (e.g. too few devices), or None."""
        return self.unsupported_family(inputs) or device_shortage(case, inputs.device, inputs.oversubscribe,
                                                                  inputs.nodes)

    def hard_coded(self, case: CaseSpec, inputs: RunInputs) -> HardCoded | None:
        """What this framework's build trains the case with whatever the case says, where the
        references can train with it too (the plan adopts it), or None."""
        return None

    def unsupported_family(self, inputs: RunInputs) -> str | None:
        """Why this runner cannot train the inputs' family, where the runner or the family says so."""
        from lockstep.runners.registry import unsupported_reason

        reason = unsupported_reason(self.name, inputs.model.family)
        return f"{self.name} cannot train {inputs.family.title} models: {reason}" if reason else None

    @abstractmethod
    def execute(self, case: CaseSpec, inputs: RunInputs, log_path: Path, on_step: StepCallback | None) -> ExecuteResult:
        """Train the case, writing the native log to `log_path`. Raise RunError on failure.

        Runners with persistent workers also take `workers=`: the group (from `open_workers`)
        to run the case in, or None for a process of its own."""

    def worker_group_key(self, case: CaseSpec, inputs: RunInputs) -> Hashable | None:
        """Cases with equal keys can share one persistent worker group (start once, run many);
        None (the default): the case runs on its own (in-process, or a process per case)."""
        return None

    def open_workers(self, case: CaseSpec, inputs: RunInputs):
        """A persistent worker group (runners/workers.WorkerGroup, started on its first case) for
        the cases of `case`'s key; called only when the key is not None."""
        raise NotImplementedError(f"{self.name} has no persistent workers")

    def run_many(self, pairs: Sequence[tuple[CaseSpec, RunInputs]], out_dirs: Sequence[Path],
                 on_start: StartCallback | None = None, on_step: StepCallback | None = None,
                 on_done: DoneCallback | None = None, persistent: bool = False, group=None,
                 before_capture: Callable[[CaseSpec], None] | None = None) -> list[list[RunRecord]]:
        """Run every (case, inputs) in order, once per directory of `out_dirs` (the repeats; the
        repeats after a failed one are not run: it has no losses to repeat). `before_capture(case)`
        is called before a step-1 capture taken after the run (`run`).

        With `persistent` (the pairs share one `worker_group_key`), every run goes to one worker
        group, started once -- `group` when the caller holds one open (and closes it), else one of
        its own; otherwise each run is `run` on its own, as one case always was."""
        results: list[list[RunRecord]] = []
        own = group is None and persistent and bool(pairs)
        if own:
            group = self.open_workers(*pairs[0])
        with group if own else nullcontext():
            for case, inputs in pairs:
                records: list[RunRecord] = []
                for out_dir in out_dirs:
                    if on_start:
                        on_start(case, self.name)
                    records.append(self.run(case, inputs, out_dir, on_step, workers=group,
                                            before_capture=partial(before_capture, case) if before_capture else None))
                    if not records[-1].ok:
                        break
                if on_done:
                    on_done(case, records)
                results.append(records)
        return results

    def run(self, case: CaseSpec, inputs: RunInputs, out_dir: Path, on_step: StepCallback | None = None,
            workers=None, before_capture: Callable[[], None] | None = None) -> RunRecord:
        out_dir = Path(out_dir)
        if not inputs.nodes.writes_records:
            # Another node's logs, kept apart from node 0's records (the out dir may be shared).
            out_dir = out_dir / f"node{inputs.nodes.node_rank}"
        out_dir = out_dir / self.name
        out_dir.mkdir(parents=True, exist_ok=True)
        final_log, record_path = out_dir / f"{case.name}.log", out_dir / f"{case.name}.jsonl"
        # The log is written under a partial name and renamed once the case has ended (finished or
        # failed): a case stopped by a signal (or a kill) leaves `<case>.log.partial`, never a
        # `<case>.log` that compare and report would read as the case's log.
        log_path = out_dir / f"{case.name}{PARTIAL_LOG_SUFFIX}"
        meta = base_meta(self, case, inputs)
        record = RunRecord(framework=self.name, case=case.name, meta=meta, source=str(record_path))
        began = time.time()
        try:
            result = (self.execute(case, inputs, log_path, on_step) if workers is None
                      else self.execute(case, inputs, log_path, on_step, workers=workers))
            record.meta.update(result.meta)
            record.meta.update(whole_run_phases(result.meta, began, time.time()))
            record.steps = result.steps
            if inputs.nodes.writes_records:  # other nodes train their ranks; node 0 gets the steps
                check_complete(case, result.steps, log_path, first=first_step(case))
                if inputs.capture is not None and not (record.meta.get("step1_capture")
                                                       or record.meta.get("step1_capture_error")):
                    if before_capture is not None:
                        before_capture()  # --jobs: the baseline's capture it reads is written by then
                    record.meta.update(self.capture_after_run(case, inputs, out_dir) if isinstance(self, StepInspector)
                                       else {"step1_capture_error": capture_problem(self, case, inputs)})
        except LockstepError as e:
            record.status, record.error = "failed", str(e)
        except OSError as e:  # an I/O failure nothing above named: its file, if it has one, and the reason
            record.status, record.error = "failed", f"{type(e).__name__}: {os_error_sentence(e)}"
        except Exception as e:  # a bug or framework crash in-process: still a failed record, never a good one
            record.status, record.error = "failed", f"{type(e).__name__}: {e}"
        if os.path.lexists(log_path):
            os.replace(log_path, final_log)
        if record.error:  # the messages name the log by the name it has now
            record.error = record.error.replace(str(log_path), str(final_log))
        record.meta["finished_at"] = now_iso()
        if inputs.nodes.writes_records:
            write_record_or_fail(record_path, record)
        return record


class StepInspector(ABC):
    """What a runner that can show a step from inside implements besides FrameworkRunner (its
    RunnerSpec declares how it records it: Capabilities.step1_capture). lockstep/stepcheck and
    `lockstep diagnose` call these through `capture_problem` / `at_step_problem` below, which answer
    for a runner that cannot look inside at all."""

    def capture_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        """Why this runner cannot capture step 1 of the case (None: it can)."""
        return None

    def at_step_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        """Why this runner cannot capture a later step from the reference's saved state (`lockstep
        diagnose --at-step N`: the pytorch reference's weights and optimizer state after N steps,
        loaded by the framework in its own checkpoint format), or None when it can."""
        return f"{self.name} cannot start a step from a saved training state yet"

    def capture_needs_reference(self, case: CaseSpec, inputs: RunInputs) -> bool:
        """Whether its capture reads the reference's (`request.reference`): then the reference's
        step 1 must be recorded first."""
        return False

    def capture_grad_kind(self, case: CaseSpec, inputs: RunInputs) -> str:
        """What its capture's gradients are (formats.step_capture's GRAD_*): read from the framework
        (the default), or recovered from its saved weights."""
        return GRAD_EXACT

    @abstractmethod
    def capture(self, case: CaseSpec, inputs: RunInputs, work_dir: Path, request: CaptureRequest):
        """Step 1 of the case seen from inside, written to `request.path` and returned (a
        formats.step_capture.StepCapture); `work_dir` takes whatever the framework writes on the way."""

    def start_capture(self, case: CaseSpec, inputs: RunInputs, work_dir: Path, request: CaptureRequest) -> "Background":
        """`capture`, returned as soon as the framework has nothing more to run for it: a runner whose
        capture ends in lockstep reading what the framework wrote (InfiniTrain's saved weights)
        reads them in the background, so that its next runs can start meanwhile. Its `result()` is
        the capture."""
        return Background.done(self.capture(case, inputs, work_dir, request))

    def capture_after_run(self, case: CaseSpec, inputs: RunInputs, out_dir: Path) -> dict:
        """Step 1 captured on its own after a run that could not record it while training (several
        processes, InfiniTrain): a capture that fails costs the certificate, never the run."""
        import time

        start = time.perf_counter()
        problem = self.capture_problem(case, inputs)
        if problem:
            return {"step1_capture_error": problem}
        try:
            # Whatever the framework writes on the way goes beside the capture, never among the records.
            self.capture(case, inputs, Path(inputs.capture.path).parent / "work", inputs.capture)
        except LockstepError as e:
            return {"step1_capture_error": str(e)}
        return {"step1_capture": inputs.capture.path, "step1_capture_seconds": round(time.perf_counter() - start, 2)}


def capture_problem(runner: FrameworkRunner, case: CaseSpec, inputs: RunInputs) -> str | None:
    """Why `runner` cannot capture step 1 of the case (None: it can)."""
    if not isinstance(runner, StepInspector):
        return f"{runner.name} cannot show its step 1 from inside"
    return runner.capture_problem(case, inputs)


def at_step_problem(runner: FrameworkRunner, case: CaseSpec, inputs: RunInputs) -> str | None:
    """Why `runner` cannot capture a later step from the reference's saved state (None: it can)."""
    if not isinstance(runner, StepInspector):
        return f"{runner.name} cannot show a step from inside"
    return runner.at_step_problem(case, inputs)


class Background:
    """`fn(*args)` in a daemon thread of this process (one that starts no process of its own: an
    interrupted lockstep neither waits for it nor leaves anything behind); `result()` waits for it
    and returns what it returned, or raises what it raised."""

    def __init__(self, fn: Callable[..., Any] | None = None, *args, name: str = "lockstep-background"):
        import threading

        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = None
        if fn is None:
            return

        def run() -> None:
            try:
                self._value = fn(*args)
            except BaseException as e:  # re-raised in the caller's thread by result()
                self._error = e

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    @classmethod
    def done(cls, value: Any) -> "Background":
        """What is already at hand, as a Background."""
        b = cls()
        b._value = value
        return b

    @property
    def in_background(self) -> bool:
        """Whether it ran in a thread of its own (not `done` at hand)."""
        return self._thread is not None

    def result(self) -> Any:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._value


def whole_run_phases(meta: dict, began: float, ended: float) -> dict:
    """The case's phases as its runner measured them, with the time before the framework began the
    case (process start, imports, a worker group picking the case up) as start-up, and after it
    ended (process exit, the group's hand-back) as teardown; `wall_s` the whole run."""
    phases = dict(meta.get("phases") or {})
    started, finished = meta.pop("case_started_wall", None), meta.pop("case_finished_wall", None)
    if isinstance(started, (int, float)):
        phases["start-up"] = round(phases.get("start-up", 0.0) + max(started - began, 0.0), 3)
    if isinstance(finished, (int, float)):
        phases["teardown"] = round(phases.get("teardown", 0.0) + max(ended - finished, 0.0), 3)
    return {"phases": {p: phases[p] for p in PHASES if p in phases}, "wall_s": round(ended - began, 3)}


def run_in_process(log_path: Path, on_step: StepCallback | None, train: Callable[[StepCallback, Any], dict]) -> ExecuteResult:
    """Train in this process: `train(emit, log)` gets a step callback and the open native log and
    returns the info for the record; running out of device memory is a failed run, said so."""
    import torch

    steps: list[StepRecord] = []

    def emit(rec: StepRecord) -> None:
        steps.append(rec)
        if on_step:
            on_step(rec)

    # The log is streamed while training (never written aside); a failed write names it.
    with open_for_streaming(log_path, "native log") as log:
        try:
            info = train(emit, log)
        except torch.cuda.OutOfMemoryError as e:
            raise RunError(f"{log_path}: out of device memory at step {len(steps) + 1} ({e})") from None
    return ExecuteResult(steps=steps, meta={**info, "launcher": "in-process"})


def write_record_or_fail(record_path: Path, record: RunRecord) -> None:
    """Write the record; when that fails (disk full, file-size limit), leave a small record
    marked failed that says why, or, if even that cannot be written, stop with one sentence
    naming the case: a run must never end with no record and no word. Either way no partial
    record is left under its name (the write is atomic)."""
    try:
        write_run_record(record_path, record)
        return
    except OSError as e:
        failure = str(write_error(record_path, e, "run record"))
    except LockstepError as e:  # a failed write, already one sentence naming the file and the reason
        failure = str(e)
    record.status, record.error = "failed", failure + (
        f" after the run had failed: {record.error}" if record.error else f"; {len(record.steps)} step(s) were lost")
    record.steps = []
    try:
        write_run_record(record_path, record)
    except (OSError, LockstepError):
        raise RunError(f"{record.error}; {record.framework}/{record.case} has no record") from None


def final_params_path(log_path: Path) -> Path:
    """Where a run's final canonical parameters go: next to its log, `<case>.final.npz` (also for
    the log's partial name while the case runs, `<case>.log.partial`)."""
    name = Path(log_path).name
    case = name[:-len(PARTIAL_LOG_SUFFIX)] if name.endswith(PARTIAL_LOG_SUFFIX) else Path(log_path).stem
    return Path(log_path).with_name(case + ".final.npz")


def write_final_params(path: str | os.PathLike, tensors: dict) -> None:
    """Canonical name -> FP32 array, as one .npz, written aside and renamed into place (after
    checking there is room for it)."""
    import numpy as np

    arrays = {name: np.asarray(t, dtype=np.float32) for name, t in tensors.items()}
    with atomic_write(path, "wb", what="final parameters", size=sum(a.nbytes for a in arrays.values())) as f:
        np.savez(f, **arrays)


# What a case's log is called while the case runs (renamed to `<case>.log` when it ends).
PARTIAL_LOG_SUFFIX = ".log.partial"


def first_step(case: CaseSpec) -> int:
    """The first step a case trains: 1, or the one after its resume point."""
    resume = case.checkpoint.resume_from if case.checkpoint is not None else None
    return 1 if resume is None else resume + 1


def check_complete(case: CaseSpec, steps: list[StepRecord], log_path: Path, first: int = 1) -> None:
    got = [s.step for s in steps]
    if got != list(range(first, case.steps + 1)):
        raise RunError(f"{log_path}: expected steps {first}..{case.steps}, got {len(got)} step(s)"
                       + (f" ({got[0]}..{got[-1]})" if got else ""))
    for s in steps:
        if not math.isfinite(s.loss):
            raise RunError(f"{log_path}: step {s.step} loss is {s.loss} (non-finite)")


def base_meta(runner: FrameworkRunner, case: CaseSpec, inputs: RunInputs) -> dict:
    return {
        "framework_version": _safe(runner.version),
        "case_spec": case.to_dict(),
        "model": {"name": inputs.model_name, **inputs.model.to_dict()},
        "optimizer": {**case.optimizer_of(inputs.family.optimizer).to_dict(), "lr": case.lr},
        "checkpoint": str(inputs.checkpoint),
        "checkpoint_sha256": inputs.checkpoint_sha256,
        "data": str(inputs.tokens),
        "data_sha256": inputs.tokens_sha256,
        "corpus": inputs.corpus,
        "device": inputs.device,
        "device_name": device_name(inputs.device),
        "torch_version": torch_version(),
        **software_environment(),
        "python_version": platform.python_version(),
        "host": platform.node(),
        "lockstep_version": __version__,
        "lockstep_commit": git_commit(),
        "logged_loss": runner.logged_loss,
        "started_at": now_iso(),
        "command": shlex.join(sys.argv),
        # the seed of the case's one LoRA init (diagnose makes the same adapters again from it)
        **({"lora_seed": inputs.lora_seed} if case.lora is not None else {}),
        **({"jobs": inputs.jobs} if inputs.jobs > 1 else {}),
    }


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def software_environment() -> dict:
    """CUDA, the NVIDIA driver and megatron-core as this machine has them: what golden values
    say changed when a check fails (docs/reference/golden.md). None where there is none."""
    import importlib.metadata

    import torch

    driver = None
    try:  # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  ..."
        words = Path("/proc/driver/nvidia/version").read_text().split()
        driver = next((w for w in words if w[:1].isdigit() and "." in w), None)
    except OSError:
        pass
    try:
        megatron = importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        megatron = None
    return {"cuda_version": torch.version.cuda, "driver_version": driver, "megatron_core_version": megatron}


def torch_version() -> str:
    import torch

    return torch.__version__


def unsupported_needs(case: CaseSpec, runner: FrameworkRunner) -> str | None:
    """The one place a case's needs (LoRA, save/resume) meet what a runner implements: the skip
    reason when it lacks one, whatever else the runner would say of the case."""
    missing = [need for need in NEED_TITLES if need in case.needs - runner.supports]
    if not missing:
        return None
    return f"{' and '.join(NEED_TITLES[m] for m in missing)} cases are not supported by {runner.name} yet"


def case_skip_reason(runner: FrameworkRunner, case: CaseSpec, inputs: RunInputs) -> str | None:
    """Why `runner` cannot run `case` here: what the case needs that the runner lacks first, then
    the runner's own reasons (devices, dtypes, layouts)."""
    return unsupported_needs(case, runner) or runner.skip_reason(case, inputs)


def device_shortage(case: CaseSpec, device: str, oversubscribe: bool = False,
                    nodes: NodeLayout | None = None) -> str | None:
    """Why this node cannot hold its share of the case's ranks, or None.

    On the CPU, `oversubscribe` lets more ranks than cores share the cores (gloo, one torch
    thread per rank): slow, but the same arithmetic as one core per rank."""
    nodes = nodes or NodeLayout()
    problem = nodes.split_problem(case.world_size)
    if problem:
        return problem
    need = nodes.procs_per_node(case.world_size)
    have = available_devices(device)
    if need > have and not (oversubscribe and device == "cpu"):
        what = "GPUs" if device == "cuda" else "CPU cores"
        where = "this machine" if not nodes.multi_node else "each node"
        hint = " (--oversubscribe runs them anyway)" if device == "cpu" else ""
        return f"needs {need} devices, {where} has {have} {what}{hint}"
    return None


def oversubscribed_env(case: CaseSpec, inputs: RunInputs) -> dict:
    """Environment for the ranks: one torch thread each when they outnumber this node's cores."""
    ranks_here = inputs.nodes.procs_per_node(case.world_size)
    if inputs.device == "cpu" and ranks_here > available_devices("cpu"):
        return {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return {}


def launch_meta(case: CaseSpec, inputs: RunInputs, env: dict) -> dict:
    """How a torchrun run was placed, for the record."""
    meta = {"launcher": f"torchrun --nproc_per_node={inputs.nodes.procs_per_node(case.world_size)}"
                        + (f" on {inputs.nodes.label}" if inputs.nodes.multi_node else "")}
    if env.get("OMP_NUM_THREADS") == "1" and inputs.device == "cpu":
        meta["oversubscribed"] = (f"{inputs.nodes.procs_per_node(case.world_size)} ranks on "
                                  f"{available_devices('cpu')} CPU cores, 1 torch thread each")
    return meta


def available_devices(device: str) -> int:
    if device == "cuda":
        import torch

        return torch.cuda.device_count()
    return os.cpu_count() or 1


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
        return "cuda (unavailable)"
    return platform.processor() or platform.machine() or "cpu"


def git_commit() -> str:
    """The lockstep checkout's commit, or "unknown" for an installed copy outside git.

    `LOCKSTEP_COMMIT` overrides it for copies of a checkout without `.git` (e.g. a tree synced
    to a GPU machine)."""
    if os.environ.get("LOCKSTEP_COMMIT"):
        return os.environ["LOCKSTEP_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if out.returncode != 0:
        return "unknown"
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _safe(fn) -> str:
    try:
        return fn()
    except Exception as e:  # version probing must never stop a run
        return f"unknown ({e})"
