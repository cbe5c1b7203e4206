"""Running a plan: every (case, framework) pair that the plan runs, in worker groups where a
runner has them (started once, running every case that fits), the first group started early
beside the pairs that run on their own; skipped pairs come back as outcomes with their reason."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lockstep.cases.matrix import load_matrix, select_cases
from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.formats.run_record import RunRecord, StepRecord
from lockstep.models import model_shape
from lockstep.plan import RunPlan, RunRequest, default_frameworks
from lockstep.runners import get_runner
from lockstep.runners.base import FrameworkRunner, RunInputs, StepInspector, first_step
from lockstep.stepcheck.request import certificate_request


@dataclass
class CaseOutcome:
    case: CaseSpec
    framework: str
    record: RunRecord | None = None
    skipped: str | None = None  # reason




def execute_plan(plan: RunPlan, on_start: Callable[[CaseSpec, str], None] | None = None,
                 on_step: Callable[[StepRecord], None] | None = None,
                 on_end: Callable[[CaseOutcome], None] | None = None, repeat: int = 1,
                 on_groups: Callable[[], None] | None = None) -> list[CaseOutcome]:
    """Run every pair `repeat` times; repeat 1's record is the outcome's (and where compare reads
    it), repeats 2..N go under `<out>/repeats/<k>/` for the determinism check.

    Pairs that run on their own (in this process or a process each: the one-device pytorch cases,
    InfiniTrain) run first, in plan order (case by case, each framework in turn), while the first
    persistent worker group (`worker_group_key`) starts up beside them; then, for each group in
    plan order, every pair of that runner and key, in one group (start once, run many).
    `plan.persistent_workers` False runs every pair on its own. Outcomes come back in plan order.
    Every node of a multi-node run computes the same order from the same plan. `on_groups` is
    called once, when this process starts to only wait on worker groups (idle until the end), and
    only when some pair runs in one."""
    from lockstep.determinism import repeat_dir

    plan.out_dir.mkdir(parents=True, exist_ok=True)
    run = PlanExecution(plan, [repeat_dir(plan.out_dir, k) for k in range(1, repeat + 1)], on_start, on_step, on_end)
    try:
        run.skip_what_cannot_run()
        # Pairs that run on their own (in this process, or a process each) first, while the first
        # worker group starts beside them; then each group's pairs, a group at a time.
        run.prestart_first_group()
        run.run_pairs(grouped=False)
        if on_groups is not None and run.any_left_in_groups():
            on_groups()  # this process only waits on worker groups from here on
        run.run_pairs(grouped=True)
    except BaseException:
        for g in run.groups.values():
            g.__exit__(*sys.exc_info())  # interrupted or failing: no rank may outlive lockstep
        raise
    for g in run.groups.values():
        g.close()  # prestarted for a pair that did not need it after all
    return [run.outcomes[(case.name, runner.name)] for case, runner in run.pairs]


@dataclass
class PlanExecution:
    """One execute_plan's bookkeeping: the pairs in plan order, their outcomes so far, and the open
    worker groups ((runner, key) -> WorkerGroup)."""

    plan: RunPlan
    out_dirs: list[Path]
    on_start: Callable | None
    on_step: Callable | None
    on_end: Callable | None
    outcomes: dict[tuple[str, str], CaseOutcome] = field(default_factory=dict)
    groups: dict[tuple[str, object], object] = field(default_factory=dict)
    # --jobs: each pair's end (a capture may wait for its baseline's), and an interrupt's
    _ended: dict[tuple[str, str], threading.Event] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def pairs(self) -> list[tuple[CaseSpec, FrameworkRunner]]:
        return [(case, runner) for case in self.plan.cases for runner in self.plan.runners]

    def key_of(self, case: CaseSpec, runner: FrameworkRunner):
        return runner.worker_group_key(case, self.plan.inputs[case.name]) if self.plan.persistent_workers else None

    def done(self, outcome: CaseOutcome) -> None:
        self.outcomes[(outcome.case.name, outcome.framework)] = outcome
        if self.on_end:
            self.on_end(outcome)

    def skip_what_cannot_run(self) -> None:
        for case, runner in self.pairs:
            reason = self.plan.skip_reason(case, runner)
            if reason:
                self.done(CaseOutcome(case, runner.name, skipped=reason))

    def group_of(self, case: CaseSpec, runner: FrameworkRunner, key):
        if (runner.name, key) not in self.groups:
            self.groups[(runner.name, key)] = runner.open_workers(case, self.plan.inputs[case.name])
        return self.groups[(runner.name, key)]

    def prestart_first_group(self) -> None:
        """The first worker group starts up while the pairs that need none run in this process (one
        node only: every node must start its groups in the same order); one started before the
        plan for the same runner and key is that group."""
        early = dict(self.plan.early_groups)
        self.plan.early_groups.clear()
        if not self.plan.nodes.multi_node:
            for c, r in self.pairs:
                key = None if self.plan.skip_reason(c, r) else self.key_of(c, r)
                if key is not None:
                    if (r.name, key) in early:
                        self.groups[(r.name, key)] = early.pop((r.name, key))
                    self.group_of(c, r, key).prestart(c.to_dict(), self.plan.out_dir / r.name)
                    break
        for unneeded in early.values():
            unneeded.discard()  # it ran no case: nothing to wait for

    def any_left_in_groups(self) -> bool:
        return any((c.name, r.name) not in self.outcomes and self.key_of(c, r) is not None for c, r in self.pairs)

    def run_pairs(self, grouped: bool) -> None:
        todo = []
        for case, runner in self.pairs:
            if (case.name, runner.name) in self.outcomes:
                continue  # skipped, or ran earlier in a worker group with an earlier case
            key = self.key_of(case, runner)
            if (key is not None) == grouped:
                todo.append((case, runner, key))
        apart = [p for p in todo if p[1].runs_apart] if self.plan.jobs > 1 and not grouped else []
        if apart:
            self.run_side_by_side([p for p in todo if p not in apart], apart)
            return
        for case, runner, key in todo:
            if (case.name, runner.name) not in self.outcomes:  # else it ran in its group with an earlier case
                self.run_pair(case, runner, key)

    def run_side_by_side(self, here: list, apart: list) -> None:
        """--jobs: the pairs that are processes of their own run up to `jobs` at once, each supervised
        by a thread of this process, while the others run here in turn. A capture that reads the
        baseline's (`capture_needs_reference`) waits for the baseline's pair to end
        (`before_capture`), so that it reads what one after the other would have read."""
        from concurrent.futures import ThreadPoolExecutor

        from lockstep.runners.launch import RUNNING_GROUPS

        pool = ThreadPoolExecutor(max_workers=self.plan.jobs, thread_name_prefix="lockstep-pair")
        try:
            running = [pool.submit(self.run_pair, case, runner, key) for case, runner, key in apart]
            for case, runner, key in here:
                self.run_pair(case, runner, key)
            for future in running:
                future.result()
        except BaseException:
            # An interrupt reaches this thread only: the queued pairs never start, the running ones'
            # processes are killed and a capture waiting for its baseline stops waiting (their threads
            # then end), before it propagates.
            self.stopping.set()
            pool.shutdown(wait=False, cancel_futures=True)
            RUNNING_GROUPS.stop_all()
            pool.shutdown(wait=True)
            RUNNING_GROUPS.resume()
            raise
        pool.shutdown()

    def run_pair(self, case: CaseSpec, runner: FrameworkRunner, key) -> None:
        plan = self.plan
        batch = [case] if key is None else [
            c for c, r in self.pairs if r is runner and (c.name, r.name) not in self.outcomes
            and not plan.skip_reason(c, r) and self.key_of(c, r) == key]

        def on_done(c: CaseSpec, records: list[RunRecord]) -> None:
            self.done(CaseOutcome(c, runner.name, record=records[0]))

        try:
            runner.run_many([(c, inputs_for(plan, c, runner)) for c in batch], self.out_dirs, on_start=self.on_start,
                            on_step=self.on_step, on_done=on_done, persistent=key is not None,
                            group=self.group_of(case, runner, key) if key is not None else None,
                            before_capture=lambda c: self.wait_for_baseline(c, runner))
        finally:
            for c in batch:
                self.ended(c.name, runner.name).set()  # a capture waiting on this pair reads what it left
        if key is not None:
            self.groups.pop((runner.name, key)).close()  # every case of its key ran: free its devices

    def ended(self, case: str, framework: str) -> threading.Event:
        with self._lock:
            return self._ended.setdefault((case, framework), threading.Event())

    def wait_for_baseline(self, case: CaseSpec, runner: FrameworkRunner) -> None:
        """Before `runner`'s capture of `case`: where it reads the baseline's capture, the baseline's
        pair must have ended (run and capture), as it has when pairs run one after the other."""
        baseline = self.plan.runners[0]
        if (runner is baseline or self.plan.jobs <= 1 or not isinstance(runner, StepInspector)
                or not runner.capture_needs_reference(case, self.plan.inputs[case.name])):
            return
        if (case.name, baseline.name) in self.outcomes:
            return  # skipped, or ran (its outcome comes once its capture is written)
        ended = self.ended(case.name, baseline.name)
        while not ended.wait(0.2):
            if self.stopping.is_set():
                raise LockstepError(f"{runner.name}'s step-1 capture of {case.name} stopped: lockstep was "
                                    "interrupted while it waited for the baseline's")


def start_first_group_early(req: RunRequest) -> dict:
    """Start the worker group the run will most likely need first, before the plan is made: a
    group's start-up (megatron-core: interpreter, torch, CUDA, NCCL, its imports; ~12 s on an
    H200) then overlaps the plan (importing torch, CUDA's start, hashing the weights) as well as
    the pairs that run on their own. Only the common case is guessed, from what is cheap to know
    without torch: one node, the first (case, runner) pair in plan order whose runner has worker
    groups, when that case needs one device. The device is `--device`, else CUDA when an NVIDIA
    driver is present. `execute_plan` uses the group when the plan agrees (same runner and key)
    and stops it otherwise. Returns {(runner name, key): group}; {} when nothing is guessed."""
    if not req.persistent_workers or req.nodes.multi_node or req.nodes.launcher == "slurm" or req.llmc:
        return {}
    device = req.device or ("cuda" if _nvidia_driver_present() else "cpu")
    try:
        cases = select_cases(load_matrix(req.matrix, model=req.model, groups=req.groups), req.cases,
                             source=f"matrix {req.matrix}")
        frameworks = req.frameworks or default_frameworks([], req.framework_options)
        runners = [get_runner(name, req.framework_options) for name in frameworks]
    except LockstepError:
        return {}  # the plan says what is wrong
    for case in cases:
        if case.world_size != 1 or (req.model is None and device == "cpu"):
            continue  # several devices: how many there are needs torch; CPU shapes are swapped in by the plan
        shape = model_shape(req.model or case.model)
        inputs = RunInputs(checkpoint=Path("-"), tokens=Path("-"), model=shape.config, device=device,
                           oversubscribe=req.oversubscribe, nodes=req.nodes)
        for runner in runners:
            # No skip_reason here: it may import torch (counting devices), seconds before the spawn.
            # A group the plan does not want is stopped by execute_plan.
            key = runner.worker_group_key(case, inputs)
            if key is not None:
                group = runner.open_workers(case, inputs)
                group.prestart(case.to_dict(), Path(req.out or "lockstep-out") / runner.name)
                return {(runner.name, key): group}
    return {}


def close_early_groups(groups: dict) -> None:
    """Stop groups started early that no run took: they ran no case, so they are killed at once."""
    for group in groups.values():
        group.discard()
    groups.clear()


def _nvidia_driver_present() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


def inputs_for(plan: RunPlan, case: CaseSpec, runner: FrameworkRunner) -> RunInputs:
    """The case's inputs, asking the runner to record step 1 where the case is certified (or the
    run asks every framework for it: plan.records_step1).

    A resumed case records nothing while it trains: its certified step is the first one after the
    resume point, captured by every framework after all runs from the reference's saved state
    (stepcheck/certificates.py), never its step 1 from the initial weights, which it does not train."""
    inputs = plan.inputs[case.name]
    if plan.jobs > 1 and runner.runs_apart:
        inputs = dataclasses.replace(inputs, jobs=plan.jobs)
    if not plan.records_step1(case) or first_step(case) > 1:
        return inputs
    return dataclasses.replace(inputs, capture=certificate_request(plan, case, runner.name))
