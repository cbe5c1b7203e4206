"""`lockstep compare BASELINE TEST`: loss PASS/FAIL per case and tok/s side by side.

Exit 0 only when every compared case passes and nothing is missing or unreadable, 1 otherwise,
2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lockstep.compare.policy import VerdictClass
from lockstep.compare import CompareOptions, ComparisonReport, compare_paths
from lockstep.compare.options import EXPECT_WITHIN_THRESHOLD, EXPECTATIONS, STEP2_MODES
from lockstep.commands.ci_options import add_history_arguments, add_junit_argument, append_history
from lockstep.compare.throughput import (NOISY_CV, format_memory, format_mfu, format_roofline_pair,
                                         format_tokens_per_s)
from lockstep.compare.verdict import CaseVerdict
from lockstep.fsutil import atomic_write, prepare_output_file
from lockstep.step_contract import WARMUP_STEPS


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be positive")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} must not be negative")
    return value


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} must be at least {minimum}")
        return value
    return parse


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="compare two runs (records or native logs) step by step",
        description="Compare the loss of every case of BASELINE with TEST step by step (PASS/FAIL against the "
                    "dtype threshold) and show tok/s side by side. BASELINE and TEST are run records "
                    "(<case>.jsonl), native logs (<case>.log: InfiniTrain, llm.c, Megatron-LM) or directories "
                    "of them.")
    p.add_argument("baseline", metavar="BASELINE", type=Path, help="file or directory of the reference run")
    p.add_argument("test", metavar="TEST", type=Path, help="file or directory of the run under test")
    p.add_argument("--include-prefix", type=_names, default=(), metavar="P[,P...]",
                   help="compare only cases whose name starts with one of these prefixes")
    p.add_argument("--include-cases", type=_names, default=(), metavar="A,B",
                   help="compare only these cases (with --include-prefix: either filter admits a case)")
    p.add_argument("--threshold-fp32", type=_positive_float, default=None, metavar="X",
                   help="max |Δloss| for FP32 cases (default 1e-5; 2e-3 against a Megatron-LM GPT-2 log)")
    p.add_argument("--threshold-bf16", type=_positive_float, default=None, metavar="X",
                   help="max |Δloss| for BF16 cases (default 1e-2)")
    p.add_argument("--rtol", type=_non_negative_float, default=0.0, metavar="X",
                   help="also allow rtol x |baseline loss| per step (default 0)")
    p.add_argument("--megatron-step2-correction", choices=STEP2_MODES, default="auto",
                   help="undo upstream Megatron-LM's running mean at iteration 2 (loss2 = 2*logged2 - loss1); "
                        "auto: for Megatron-LM logs only; never for lockstep's own records or logs")
    p.add_argument("--warmup-steps", type=_int_at_least(0), default=WARMUP_STEPS, metavar="N",
                   help=f"steps left out of the tok/s means (default {WARMUP_STEPS}, the training contract's)")
    p.add_argument("--min-tps-ratio", type=_positive_float, default=None, metavar="X",
                   help="fail a case whose test/baseline tok/s ratio is below X (default: no throughput verdict)")
    p.add_argument("--seq-length", type=_int_at_least(1), default=None, metavar="N",
                   help="sequence length for Megatron-LM logs that state none (for tok/s)")
    p.add_argument("--peak-tflops", type=_positive_float, default=None, metavar="X",
                   help="per-device peak TFLOP/s for MFU (default: the known-device table; none on CPU)")
    p.add_argument("--expect", choices=EXPECTATIONS, default=EXPECT_WITHIN_THRESHOLD,
                   help="what the test must be to pass: its loss within the dtype's threshold (default), or identical "
                        "to the baseline bit for bit (every step's loss and the step-1 captures' tensors: two builds "
                        "of one framework, a refactor, recompute); NOT IDENTICAL names the first step and tensor")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the report as JSON")
    add_junit_argument(p)
    add_history_arguments(p)
    p.set_defaults(handler=run)


def options_from_args(args: argparse.Namespace) -> CompareOptions:
    return CompareOptions(threshold_fp32=args.threshold_fp32, threshold_bf16=args.threshold_bf16, rtol=args.rtol,
                          warmup_steps=args.warmup_steps, min_tps_ratio=args.min_tps_ratio,
                          include_prefixes=args.include_prefix, include_cases=args.include_cases,
                          megatron_step2_correction=args.megatron_step2_correction, seq_length=args.seq_length,
                          peak_tflops=args.peak_tflops, expect=args.expect)


def run(args: argparse.Namespace) -> int:
    for what, path in (("BASELINE", args.baseline), ("TEST", args.test)):
        if not path.exists():
            print(f"lockstep compare: error: {what} {path} does not exist", file=sys.stderr)
            return 2
    if args.json is not None:
        prepare_output_file(args.json, "JSON report")  # before the work, not after it
    report = compare_paths(args.baseline, args.test, options_from_args(args))
    console = Console(width=None if sys.stdout.isatty() else 220, highlight=False)
    print_report(console, report)
    # Errors go to stderr once, each one sentence; the summary line on stdout counts them.
    for err in report.errors:
        print(f"lockstep: error: {err.message}", file=sys.stderr)
    if args.json is not None:
        with atomic_write(args.json, "w", what="JSON report") as f:
            json.dump(report.to_json(), f, indent=2, allow_nan=True)
            f.write("\n")
    report_json = report.to_json()
    base_fw, test_fw = framework_names(report)
    if args.junit is not None:
        from lockstep.report.junit import cases_from_comparisons, write_junit

        write_junit(args.junit, cases_from_comparisons(
            [{"baseline_framework": base_fw, "test_framework": test_fw, **report_json}]))
    if nothing_in_common(report):
        # Not a comparison of anything: as a history row it would only be ERROR cells of cases
        # that never met.
        console.print(f"nothing in common: {escape(str(args.baseline))} and {escape(str(args.test))} share no case; "
                      "not added to the history")
        return 1
    from lockstep.history import run_from_comparison

    append_history(args, run_from_comparison(report_json, base_fw, test_fw))
    return 0 if report.passed else 1


def nothing_in_common(report: ComparisonReport) -> bool:
    """Every case is on one side only: two directories of unrelated runs."""
    return not report.cases and not report.errors and bool(report.missing)


def framework_names(report: ComparisonReport) -> tuple[str, str]:
    """The frameworks as the records or logs name them, else the paths' names."""
    def name(side: str) -> str:
        found = {getattr(c, side).framework for c in report.cases if getattr(c, side).framework}
        return found.pop() if len(found) == 1 else Path(getattr(report, side)).stem or side
    base, test = name("baseline"), name("test")
    if base == test:  # e.g. pytorch DP=1 against pytorch DP=2: keep them apart in the history
        test = f"{test}@{Path(report.test).name}"
    return base, test


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------

def _fmt_diff(x: float | None) -> str:
    return "-" if x is None else f"{x:.3e}"


def _fmt_tps(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _steps_label(steps: list[int]) -> str:
    if not steps:
        return "-"
    return f"{steps[0]}-{steps[-1]}" if steps == list(range(steps[0], steps[-1] + 1)) else ",".join(map(str, steps))


def _verdict_label(c: CaseVerdict) -> str:
    verdict = c.verdict
    if verdict is VerdictClass.ERROR:
        return "[bold yellow]ERROR[/]"
    if verdict is VerdictClass.NOT_COMPARABLE:
        return "[bold yellow]not comparable[/]"
    if not verdict.judged:
        return f"[bold cyan]{verdict.value}[/]"
    if c.throughput_passed is False and c.loss_passed:
        return "[bold red]FAIL (tok/s)[/]"
    return f"[bold {'green' if verdict.passes else 'red'}]{verdict.value}[/]"


def loss_table(report: ComparisonReport) -> Table:
    t = Table(title=escape(f"Loss: {report.test} vs baseline {report.baseline}"), title_justify="left")
    for col, kw in (("case", {}), ("dtype", {}), ("steps", {"justify": "right"}), ("max |Δloss|", {"justify": "right"}),
                    ("step of max", {"justify": "right"}), ("threshold", {"justify": "right"}), ("verdict", {})):
        t.add_column(col, **kw)
    for c in report.cases:
        threshold = "-" if c.threshold is None else f"{c.threshold:.0e}" + (f" + {c.rtol:g}·|loss|" if c.rtol else "")
        t.add_row(escape(c.case), c.dtype or "-", str(len(c.diffs)) if c.diffs else "-", _fmt_diff(c.max_abs_diff),
                  "-" if c.max_diff_step is None else str(c.max_diff_step), threshold, _verdict_label(c))
    return t


# Above this many steps the terminal gets a summary of a failing case, not every step (the JSON
# and the report keep the full series).
MAX_TABLE_STEPS = 50


def step_series_table(c: CaseVerdict) -> Table:
    """Every step of a short run; for a long one, the first failing and the worst steps only."""
    failing = c.failing_steps
    if len(c.diffs) <= MAX_TABLE_STEPS:
        rows, title = c.diffs, f"{c.case}: per-step loss ({_first_failing_words(c)})"
    else:
        first, worst = c.first_failing_step, c.max_diff_step
        rows = [d for d in c.diffs if d.step in (first, worst)]
        title = (f"{c.case}: {failing:,} of {len(c.diffs):,} steps fail; first failing step {first}, "
                 f"worst step {worst} (every step: --json)")
    t = Table(title=escape(title), title_justify="left")
    for col in ("step", "baseline", "test", "|Δloss|", "allowed", ""):
        t.add_column(col, justify="right")
    for d in rows:
        mark = "" if d.within else "[red]✗[/]"
        style = None if d.within else "red"
        t.add_row(str(d.step), f"{d.baseline:.6f}", f"{d.test:.6f}", _fmt_diff(d.abs_diff), f"{d.allowed:.1e}", mark,
                  style=style)
    return t


def _first_failing_words(c: CaseVerdict) -> str:
    first = c.first_failing_step
    return "no step fails" if first is None else f"first failing step {first}"


def throughput_table(report: ComparisonReport) -> Table:
    t = Table(title=f"Throughput after warm-up: median tok/s ±CV (NOISY above {NOISY_CV:.0%}); test ÷ baseline "
                    "of tokens ÷ time, and of the per-step means as the seed scripts; MFU; % of the case's shape "
                    "roofline tok/s; peak memory allocated / reserved", title_justify="left")
    for col, kw in (("case", {}), ("config", {}), ("baseline tok/s", {"justify": "right"}),
                    ("test tok/s", {"justify": "right"}), ("test/baseline", {"justify": "right"}),
                    ("mean of steps 2..N (seed scripts)", {"justify": "right"}),
                    ("steps used (b / t)", {"justify": "right"}), ("MFU (b / t)", {"justify": "right"}),
                    ("% of roofline (b / t)", {"justify": "right"}),
                    ("peak mem baseline", {"justify": "right"}), ("peak mem test", {"justify": "right"})):
        t.add_column(col, **kw)
    if report.options.min_tps_ratio is not None:
        t.add_column(f"≥ {report.options.min_tps_ratio:g}")
    for c in report.cases:
        if c.error is not None:
            continue
        ratio = "-" if c.throughput_ratio is None else f"{c.throughput_ratio:.3f}"
        mean_ratio = "-" if c.throughput_ratio_mean_of_steps is None else f"{c.throughput_ratio_mean_of_steps:.3f}"
        b, s = c.baseline.throughput, c.test.throughput
        row = [escape(c.case), escape(c.config or "-"), format_tokens_per_s(b), format_tokens_per_s(s),
               ratio, mean_ratio, f"{_steps_label(c.baseline.throughput_steps)} / {_steps_label(c.test.throughput_steps)}",
               f"{format_mfu(b)} / {format_mfu(s)}", format_roofline_pair(b, s), format_memory(b), format_memory(s)]
        if report.options.min_tps_ratio is not None:
            row.append("[green]ok[/]" if c.throughput_passed else "[red]too slow[/]")
        t.add_row(*row)
    return t


def print_report(console: Console, report: ComparisonReport) -> None:
    if report.cases:
        console.print(loss_table(report))
        for c in report.cases:
            if c.error is None and c.not_comparable is None and not c.loss_passed:
                console.print(step_series_table(c))
        for c in report.cases:
            if c.error is None and c.cause:
                console.print(f"{escape(c.case)}: {c.verdict.value}: {escape(c.cause)}", highlight=False)
            for note in c.notes:
                console.print(f"[dim]{escape(c.case)}: {escape(note)}[/]")
        if any(c.error is None for c in report.cases):
            console.print(throughput_table(report))
    for m in report.missing:
        console.print(f"[yellow]missing:[/] {escape(m.message)}")
    for case, reason in sorted(report.skipped.items()):
        console.print(f"[dim]skipped: {escape(case)} ({escape(reason)})[/]")
    for c in report.cases:
        if c.verdict in (VerdictClass.FAIL, VerdictClass.FAIL_UNEXPLAINED):
            console.print(f"where they part on {escape(c.case)}: {escape(diagnose_suggestion(c))}")
    style = "bold green" if report.passed else "bold red"
    console.print(f"[{style}]{escape(report.summary_line())}[/]")


def diagnose_suggestion(c: CaseVerdict) -> str:
    """How to find where the two sides of a failing case part: a `lockstep diagnose` command that
    can run (two different frameworks of lockstep's, the bare case name), else what to look at."""
    from lockstep.compare.pairing import bare_case_name
    from lockstep.diagnose import hint
    from lockstep.runners import RUNNERS

    base, test, case = c.baseline.framework, c.test.framework, bare_case_name(c.case)
    if base in RUNNERS and test in RUNNERS and base != test:
        return f"{hint(case, base, test)} (with --model/--llmc/--data of the run, or its RUN_DIR)"
    if base and base == test:
        return (f"both sides are {base}, and diagnose compares two frameworks: compare the two runs' run.json and "
                f"the records' meta (versions, device, command) to see what changed between them")
    return (f"diagnose runs lockstep's own frameworks ({', '.join(RUNNERS)}), and this pair is "
            f"{base or 'unknown'} vs {test or 'unknown'}: rerun the case with `lockstep run` to diagnose it")
