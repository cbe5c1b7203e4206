"""One pipeline from case to verdict: plan -> runs -> step-1 certificates -> ONE comparison ->
evidence -> verdict, and the run's outputs (summary.json, JUnit, report, history).

`run_pipeline(request)` is what `lockstep run` does, and what `lockstep bisect` does for each
commit: both get the same RunResult (records, certificates, the comparison, the verdict, where
the time went), so a commit is judged exactly as `lockstep run` would judge it, certificate
included. The caller sees the run as it goes through a RunObserver (the terminal's progress and
tables); nothing here prints.

Every output path (the JUnit file, the history database) is checked before the first case
trains; the history gains the run only after run.json says it finished.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.cases.spec import CaseSpec
from lockstep.compare.options import CompareOptions
from lockstep.compare.pairing import EVIDENCE_DIR, STEP1_DIR
from lockstep.compare.run_dir import RunComparison, compare_run, write_summary
from lockstep.determinism import REPEATS_DIR
from lockstep.errors import LockstepError, WriteError
from lockstep.execute import CaseOutcome, execute_plan
from lockstep.formats import run_manifest
from lockstep.formats.logs import ParsedRuns
from lockstep.formats.run_record import StepRecord
from lockstep.fsutil import check_writable_target, os_problem
from lockstep.outdir import CASE_OUTPUT_SUFFIXES, STATUS_FINISHED, RunDir, check_out_dir, open_run_dir
from lockstep.plan import RunPlan, RunRequest, plan_run
from lockstep.run_verdict import RunVerdict, run_verdict
from lockstep.runners import framework_names, reference_framework
from lockstep.runners.reference import reference_services
from lockstep.step_contract import Stopwatch
from lockstep.stepcheck.certificates import certify_outcomes, certify_unexplained


@dataclass
class RunOutputs:
    """What a run writes besides its run directory's records and summary.json."""

    report: bool = True  # report.html / report.md
    junit: Path | None = None
    history: Path | None = None  # the history database to append the run to (None: not appended)


class RunObserver:
    """What the pipeline tells its caller as the run goes; every method does nothing here."""

    def say(self, text: str) -> None:
        """A note on the way (a certificate made, evidence gathered)."""

    def opened(self, plan: RunPlan, run_dir: RunDir) -> None:
        """The run directory is ready; no case has started."""

    def running(self) -> contextlib.AbstractContextManager:
        """Entered while the pairs run (e.g. a live progress display)."""
        return contextlib.nullcontext()

    def started(self, case: CaseSpec, framework: str) -> None:
        pass

    def step(self, record: StepRecord) -> None:
        pass

    def ended(self, outcome: CaseOutcome) -> None:
        pass

    def waiting_on_groups(self) -> None:
        """This process only waits on worker groups from here on."""

    def ran(self, outcomes: list[CaseOutcome]) -> None:
        """Every pair ran (or was skipped); nothing is compared yet."""

    def compared(self, result: "RunResult") -> None:
        """The comparison (and the determinism over repeats) is made; nothing else is written yet."""


@dataclass
class RunResult:
    """Everything one run found, in memory: what `lockstep run` prints and `lockstep bisect` judges."""

    plan: RunPlan
    outcomes: list[CaseOutcome]
    certificates: list = field(default_factory=list)
    comparison: RunComparison | None = None  # None on a node that does not write the records
    verdict: RunVerdict | None = None
    timing: dict = field(default_factory=dict)  # run.json's "timing", the same numbers the report shows
    determinism: object | None = None  # DeterminismReport with --repeat N > 1
    report_paths: list[Path] = field(default_factory=list)
    junit_path: Path | None = None
    history_path: Path | None = None  # where the run was appended
    history_error: str | None = None  # why it could not be (the run's outputs stand)

    @property
    def summary(self) -> dict | None:
        return self.comparison.summary if self.comparison is not None else None

    @property
    def skipped(self) -> list[CaseOutcome]:
        return [o for o in self.outcomes if o.skipped]

    @property
    def exit_code(self) -> int:
        if self.verdict is None:
            return 1
        return 1 if self.history_error else self.verdict.exit_code


def check_output_file(path: Path, what: str) -> None:
    """Refuse, before anything trains and creating nothing, an output file that cannot be written:
    a directory, a parent that is a file, a read-only file or directory."""
    path = check_writable_target(path, what)
    if path.exists():
        if not os.access(path, os.W_OK):
            raise WriteError(path, f"cannot write the {what}: permission denied (the file is not writable)")
        return
    parent = path.parent.absolute()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise WriteError(path, f"cannot write the {what}: permission denied ({parent} is not writable)")


def check_outputs(outputs: RunOutputs) -> None:
    if outputs.junit is not None:
        check_output_file(Path(outputs.junit), "JUnit XML")
    if outputs.history is not None:
        check_output_file(Path(outputs.history), "history database")
        if Path(outputs.history).exists():
            from lockstep.history import HistoryStore

            HistoryStore(outputs.history).runs(limit=0)  # another schema, or not a database: said now


def check_before_run(request: RunRequest, outputs: RunOutputs, force: bool = False) -> None:
    """Every output the run will write, checked before anything is planned or trained."""
    check_out_dir(Path(request.out or "lockstep-out"), force=force)
    check_outputs(outputs)


def run_pipeline(request: RunRequest, *, options: CompareOptions | None = None, repeat: int = 1,
                 force: bool = False, outputs: RunOutputs | None = None, observer: RunObserver | None = None,
                 early_groups: dict | None = None, timing: "RunTiming | None" = None) -> RunResult:
    """Plan, run, certify, compare (once), gather evidence, judge, and write the run's outputs.
    Raises LockstepError before any case trains when something asked for cannot be done."""
    observer = observer or RunObserver()
    outputs = outputs or RunOutputs(report=False)
    options = options or CompareOptions()
    timing = timing or RunTiming()
    if repeat < 1:
        raise LockstepError(f"--repeat must be at least 1, not {repeat}")
    check_before_run(request, outputs, force)  # a bad --out, --junit or history: refused before any work
    with timing.stage("plan"):
        plan = plan_run(request, repeat=repeat)
    try:
        return _run_planned(plan, options, repeat, force, outputs, observer, early_groups, timing)
    finally:
        if plan.cuda_start is not None:
            plan.cuda_start.join()  # long done by now; a thread alive at shutdown would be fatal


def _run_planned(plan: RunPlan, options: CompareOptions, repeat: int, force: bool, outputs: RunOutputs,
                 observer: RunObserver, early_groups: dict | None, timing: "RunTiming") -> RunResult:
    plan.early_groups = dict(early_groups or {})
    if early_groups:
        early_groups.clear()  # the plan's now: execute_plan takes or stops them
    if not plan.nodes.writes_records:
        return follow_plan(plan, observer, repeat, timing)
    stages = RunStages(plan, options, outputs, observer, timing, RunResult(plan=plan, outcomes=[]))
    names = [*dict.fromkeys([*framework_names(), *(r.name for r in plan.runners)])]
    with open_run_dir(plan.out_dir, [*names, REPEATS_DIR, STEP1_DIR, EVIDENCE_DIR], run_manifest.manifest_of(plan),
                      force=force) as run_dir:
        observer.opened(plan, run_dir)
        stages.run_pairs(run_dir, repeat)
        stages.judge(repeat)
        history_run = stages.write_outputs(run_dir)
    result = stages.result
    if history_run is not None:
        # Only now: a run that run.json does not call finished is never in the history.
        result.history_error = append_to_history(result, history_run, Path(outputs.history))
    return result


@dataclass
class RunStages:
    """One run's stages after its plan, in order: run the pairs, judge them (certificates, the one
    comparison, evidence, resumes, summary.json once), write the verdict's outputs."""

    plan: RunPlan
    options: CompareOptions
    outputs: RunOutputs
    observer: RunObserver
    timing: "RunTiming"
    result: RunResult
    files: ParsedRuns = field(default_factory=ParsedRuns)  # every record parsed once, whichever stage reads it first

    @property
    def baseline(self) -> str:
        return self.plan.runners[0].name

    def run_pairs(self, run_dir: RunDir, repeat: int) -> None:
        skipped: list[dict] = []

        def ended(outcome: CaseOutcome) -> None:
            if outcome.skipped:
                # In run.json at once, so that even an interrupted run's manifest lists its skips.
                skipped.append(run_manifest.skip_entry(outcome.case.name, outcome.framework, outcome.skipped))
                run_dir.update_manifest(skipped=skipped)
            self.observer.ended(outcome)

        with self.timing.stage("runs"), self.observer.running():
            self.result.outcomes = execute_plan(self.plan, on_start=self.observer.started, on_step=self.observer.step,
                                                on_end=ended, repeat=repeat, on_groups=self.observer.waiting_on_groups)
        self.measure_rooflines(run_dir)
        self.observer.ran(self.result.outcomes)

    def measure_rooflines(self, run_dir: RunDir) -> None:
        """Each trained case's shape roofline into run.json, after every run (the device is then
        free for the probe alone) and before any table shows tok/s."""
        plan = self.plan
        trained = {o.case.name: o.case for o in self.result.outcomes if o.record is not None and o.record.ok}
        if not plan.roofline or not trained:
            return
        from lockstep.data.corpus import default_cache_dir
        from lockstep.roofline import RUN_JSON_KEY, measure_run

        with self.timing.stage("roofline"):
            rooflines = measure_run(list(trained.values()), {n: plan.inputs[n].model for n in trained}, plan.device,
                                    plan.cache_dir or default_cache_dir(), say=self.observer.say)
        run_dir.update_manifest(**{RUN_JSON_KEY: rooflines})

    def compare(self) -> None:
        with self.timing.stage("comparison"):
            self.result.comparison = compare_run(self.plan.out_dir, baseline_framework=self.baseline,
                                                 options=self.options, write=False, files=self.files)

    def judge(self, repeat: int) -> None:
        plan, result, say = self.plan, self.result, self.observer.say
        with self.timing.stage("certificates"):
            result.certificates = certify_outcomes(plan, result.outcomes, say=say)
        self.compare()
        with self.timing.stage("evidence"):
            more = gather_evidence(plan, result.comparison.summary, say=say)
        with self.timing.stage("certificates"):
            late = certify_unexplained(plan, result.outcomes, result.comparison.summary, say=say)
            result.certificates += late
        if more or late:  # the policy asked for evidence or a certificate it did not have: judged again, with it
            self.compare()
        if repeat > 1:
            result.determinism = add_determinism(plan, result, repeat)
        with self.timing.stage("comparison"):
            add_resume_verdicts(plan, result, say=say)
            add_twin_verdicts(plan, result, say=say)
            write_summary(plan.out_dir, result.summary)  # once, every section in it
        self.observer.compared(result)

    def write_outputs(self, run_dir: RunDir):
        """The verdict, JUnit, timing, report and run.json's finish; returns the history row to append."""
        plan, result, outputs = self.plan, self.result, self.outputs
        report_paths = report_paths_of(plan) if outputs.report and any(o.record is not None for o in result.outcomes) else []
        result.verdict = run_verdict(result.outcomes, result.summary, [r.name for r in plan.runners], plan.out_dir,
                                     report_paths)
        if outputs.junit is not None:
            self.write_junit()
        # One account of the run's time, frozen here: run.json, the report and the terminal show it.
        result.timing = self.timing.to_json(result.outcomes)
        run_dir.update_manifest(timing=result.timing)
        # The history row is made now (the report's trends show it) and appended once the run finished.
        history_run = None
        if outputs.history is not None:
            try:
                history_run = history_run_of(result, self.files)
            except LockstepError as e:
                result.history_error = str(e)  # said at the end; the run's own outputs stand
        if report_paths:
            self.write_report(history_run)
        run_dir.mark(STATUS_FINISHED, verdict=result.verdict.word, verdict_lines=result.verdict.lines,
                     timing=result.timing)
        return history_run

    def write_junit(self) -> None:
        from lockstep.report.junit import cases_from_comparisons, write_junit

        summary = self.result.summary
        write_junit(self.outputs.junit, cases_from_comparisons(summary.get("comparisons", []),
                                                               nothing_compared_is_error=not (summary.get("determinism")
                                                                                             or summary.get("resumes"))))
        self.result.junit_path = Path(self.outputs.junit)

    def write_report(self, history_run) -> None:
        from lockstep.report import write_report
        from lockstep.report.data import gather

        result = self.result
        data = gather(self.plan.out_dir, baseline_framework=self.baseline, options=self.options,
                      comparisons=result.comparison.reports, files=self.files)
        data.run_lines = list(result.verdict.lines)
        data.timing = result.timing
        result.report_paths = list(write_report(self.plan.out_dir, baseline_framework=self.baseline,
                                                options=self.options, history_path=self.outputs.history, data=data,
                                                pending_history=history_run))


def report_paths_of(plan: RunPlan) -> list[Path]:
    from lockstep.report import HTML_NAME, MARKDOWN_NAME

    return [plan.out_dir / HTML_NAME, plan.out_dir / MARKDOWN_NAME]


def history_run_of(result: RunResult, files: ParsedRuns | None = None):
    """The history's row of this run (a RunRow)."""
    from lockstep.history import run_from_summary

    return run_from_summary(result.summary, result.plan.out_dir, files)


def append_to_history(result: RunResult, run, path: Path) -> str | None:
    """Append the run; a history that cannot be written is said (and fails the exit code) but
    never loses the run's own outputs."""
    from lockstep.history import HistoryStore

    try:
        HistoryStore(path).append(run)
    except LockstepError as e:
        return str(e)
    result.history_path = path
    return None


def add_determinism(plan: RunPlan, result: RunResult, repeat: int):
    """Bitwise identical repeats per framework and case, into summary.json and the result's summary."""
    from lockstep.determinism import analyse_repeats

    report = analyse_repeats(plan.out_dir, [(o.framework, o.case.name) for o in result.outcomes if not o.skipped],
                             repeat, baseline=plan.runners[0].name)
    result.comparison.summary["determinism"] = report.to_json()
    return report


def add_resume_verdicts(plan: RunPlan, result: RunResult, say=lambda text: None) -> list[dict]:
    """Every resumed case judged against the run of the case that saved it, per framework
    (compare/resume.py), into summary.json's "resumes"; a resume that is not exact is judged
    again with the reference's alternatives (trained then, under evidence/resume/) to tell its cause."""
    from lockstep.compare.resume import ResumeVerdictClass, judge_resume, resume_entry

    records = {(o.framework, o.case.name): o.record for o in result.outcomes if o.record is not None}
    reference = reference_services() if reference_framework() in (r.name for r in plan.runners) else None
    alternatives: dict[str, list] = {}
    entries = []
    for o in result.outcomes:
        spec = o.case.checkpoint
        if o.record is None or spec is None or spec.resume_from is None or spec.resume_case is None:
            continue
        source = records.get((o.framework, spec.resume_case))
        if source is None:
            continue
        try:
            verdict = judge_resume(source, o.record)
            if verdict.verdict is not ResumeVerdictClass.EXACT and reference is not None \
                    and records.get((reference.name, spec.resume_case)) is not None:
                if o.case.name not in alternatives:
                    say(f"resume of {o.framework}/{o.case.name} is not exact: training the reference's alternatives")
                    alternatives[o.case.name] = reference.train_resume_alternatives(
                        o.case, plan.inputs[o.case.name],
                        plan.out_dir / reference.name / f"{o.case.name}.log", plan.out_dir / EVIDENCE_DIR / "resume")
                verdict = judge_resume(source, o.record, alternatives[o.case.name])
            entries.append(resume_entry(o.framework, o.case.name, spec.resume_case, verdict))
        except LockstepError as e:
            entries.append(resume_entry(o.framework, o.case.name, spec.resume_case, error=str(e)))
        # A resume that passes is said here (it is what a checkpoint case is run for); one that does
        # not is said once, in the run's verdict (run_verdict.py).
        if entries[-1]["passed"]:
            say(f"resume {o.framework}/{o.case.name} (from {spec.resume_case}): {entries[-1]['sentence']}")
    if entries and result.comparison is not None:
        result.comparison.summary["resumes"] = entries
    return entries


def add_twin_verdicts(plan: RunPlan, result: RunResult, say=lambda text: None) -> list[dict]:
    """Every recompute case against its twin on the same framework, bit for bit (compare/twins.py),
    into summary.json's "twins"; an identical one is said here, one that is not in the run's verdict."""
    from lockstep.compare.twins import judge_twins, twin_line

    if not plan.twins or result.comparison is None:
        return []
    entries = judge_twins({(o.framework, o.case.name): o.record for o in result.outcomes if o.record is not None},
                          plan.twins)
    for entry in entries:
        if entry["passed"]:
            say(twin_line(entry))
    result.comparison.summary["twins"] = entries
    return entries


def follow_plan(plan: RunPlan, observer: RunObserver, repeat: int, timing: "RunTiming") -> RunResult:
    """A node other than 0: start this node's ranks of every case in the plan's order; node 0
    writes the records, compares and reports. Its logs go to `<out>/node<R>/`."""
    clear_node_logs(plan.out_dir / f"node{plan.nodes.node_rank}", plan)
    with timing.stage("runs"):
        outcomes = execute_plan(plan, repeat=repeat)  # the same runs, in the same order, as node 0
    failed = [o for o in outcomes if o.record is not None and not o.record.ok]
    word = "FAIL" if failed else "OK"
    return RunResult(plan=plan, outcomes=outcomes, verdict=RunVerdict(word, 1 if failed else 0),
                     timing=timing.to_json(outcomes))


def clear_node_logs(node_dir: Path, plan: RunPlan) -> None:
    """Remove this node's logs of the cases it is about to run (an earlier run's, which a crash
    before the new log would leave looking current), and nothing else: the directory may be on a
    shared filesystem, and a file lockstep did not write there is not its to delete."""
    for runner in plan.runners:
        for case in plan.cases:
            for suffix in CASE_OUTPUT_SUFFIXES:
                path = node_dir / runner.name / f"{case.name}{suffix}"
                try:
                    if path.is_file():
                        path.unlink()
                except OSError as e:
                    raise LockstepError(f"{path}: cannot remove the earlier run's log ({os_problem(e)})") from None


def gather_evidence(plan: RunPlan, summary: dict, say=lambda text: None) -> bool:
    """Run what the policy asked for in `summary` (an FP64 reference run per case whose clean step 1
    may be Adam amplifying rounding); True when something new was written (compare again)."""
    reference = reference_services()
    wanted = sorted({c["case"] for comp in summary.get("comparisons", []) for c in comp.get("cases", [])
                     if c.get("evidence_wanted") == "fp64-reference"})
    wrote = False
    for name in wanted:
        case = next((c for c in plan.cases if c.name == name), None)
        path = plan.out_dir / EVIDENCE_DIR / f"{name}.fp64.jsonl"
        if case is None or path.exists():
            continue
        say(f"evidence: {name} in FP64 on the {reference.name} reference (is the FP32 difference Adam amplifying "
            "rounding?)")
        record = reference.train_fp64(case, plan.inputs[name], path)
        if not record.ok:
            say(f"evidence for {name} could not be made: {record.error}")
        wrote = True
    return wrote



class RunTiming:
    """Where `lockstep run`'s wall time goes: its stages (planning, the runs, the certificates, the
    comparison, ...) and, per framework and case, the phases each runner measured (start-up,
    weights, data, training, teardown). Written to run.json's "timing"."""

    def __init__(self):
        self.began = time.perf_counter()
        self.stage = Stopwatch()  # `with timing.stage("plan"): ...`

    @property
    def stages(self) -> dict[str, float]:
        return self.stage.seconds

    def to_json(self, outcomes: list[CaseOutcome]) -> dict:
        pairs = []
        for o in outcomes:
            if o.record is None:
                continue
            meta = o.record.meta
            pair = {"framework": o.framework, "case": o.case.name, "wall_s": meta.get("wall_s"),
                    "phases": meta.get("phases", {}), "step1_capture_s": meta.get("step1_capture_seconds")}
            if meta.get("worker_startup"):  # the first case of a worker group: where the group's start-up went
                pair["worker_startup"] = meta["worker_startup"]
            pairs.append(pair)
        return {"total_s": round(time.perf_counter() - self.began, 3), "stages": self.stages, "pairs": pairs}
