"""`lockstep bisect`: the first commit of the framework under test whose verdict is bad."""

from __future__ import annotations

import argparse
import math

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lockstep.compare.options import EXPECT_WITHIN_THRESHOLD, EXPECTATIONS
from lockstep.bisect.build import DEFAULT_BUILD_TIMEOUT_S
from lockstep.commands.arguments import seed_argument, split_list, timeout_argument
from lockstep.runners import add_runner_arguments, framework_options_from


def build_timeout(text: str) -> float | None:
    """--build-timeout: seconds, > 0; 0 means none (None)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds >= 0 (0: no limit)")
    return value or None


def add_parser(sub) -> None:
    p = sub.add_parser("bisect", help="find the commit of the framework under test that moved the loss",
                       description="Drive git's bisection over the framework's repository (in a worktree under "
                                   "--out, never your checkout): build each commit with --build into its own build "
                                   "directory, `lockstep run` it against the baseline, and tell git good (every "
                                   "compared pair passes), bad, or skip (the build failed). Ends with the first bad "
                                   "commit, its diagnose and a table of every tested commit. Re-running the same "
                                   "command with the same --out resumes, reusing every build and verdict.")
    p.add_argument("--repo", required=True, help="the framework's git repository (left untouched)")
    p.add_argument("--good", required=True, help="a commit that passes (an ancestor of --bad)")
    p.add_argument("--bad", required=True, help="a commit that fails")
    p.add_argument("--build", help="shell command that builds the checked-out commit into $LOCKSTEP_BISECT_BUILD; "
                                   "it runs in the worktree ($LOCKSTEP_BISECT_SRC), $LOCKSTEP_BISECT_COMMIT is the sha")
    p.add_argument("--build-timeout", type=build_timeout, default=DEFAULT_BUILD_TIMEOUT_S, metavar="SECONDS",
                   help="seconds a build may run before it is stopped (with every process it started) and counts "
                        f"as failed (default {DEFAULT_BUILD_TIMEOUT_S:g}; 0: no limit)")
    p.add_argument("--frameworks", help="baseline first, the framework under test last (default pytorch,infinitrain)")
    p.add_argument("--matrix", default="gpt2", help="built-in matrix name or a TOML file (as for run)")
    p.add_argument("--cases", help="comma-separated case names (as for run; default every case of the matrix)")
    p.add_argument("--model", help="a registered model of the cases' family (as for run)")
    p.add_argument("--llmc", help="LLMC checkpoint to start from (as for run)")
    p.add_argument("--data", help="llm.c token file (as for run)")
    p.add_argument("--text", help="text file to tokenize as the corpus (as for run)")
    p.add_argument("--steps", type=int, help="override every case's step count")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    p.add_argument("--seed", type=seed_argument, default=42, help="seed of the llm.c init when no --llmc is given")
    p.add_argument("--timeout", type=timeout_argument, default=None,
                   help="seconds per case and framework before it fails")
    p.add_argument("--out", default="lockstep-bisect", help="where the builds, runs and result go "
                                                            "(default: lockstep-bisect)")
    p.add_argument("--expect", choices=EXPECTATIONS, default=EXPECT_WITHIN_THRESHOLD,
                   help="identical: the first commit whose build is no longer bit for bit the good commit's (only the "
                        "framework under test runs); default: the first whose loss leaves the threshold")
    p.add_argument("--no-diagnose", action="store_true", help="skip `lockstep diagnose` of the first bad commit")
    add_runner_arguments(p)  # each runner's own flags, as for run (--command-runner, ...)
    p.set_defaults(handler=run)


def run(args) -> int:
    from lockstep.bisect.report import JUDGED_AS, RESULT_JSON, RESULT_MD, TABLE_COLUMNS, headline, table_rows
    from lockstep.bisect.run import BisectRequest, plan_bisect, run_bisect
    from lockstep.plan import RunRequest

    console = Console(width=None if Console().is_terminal else 140)
    run_request = RunRequest(matrix=args.matrix, cases=split_list(args.cases), frameworks=split_list(args.frameworks),
                             model=args.model, llmc=args.llmc, data=args.data, text=args.text, steps=args.steps,
                             device=args.device, seed=args.seed, timeout_s=args.timeout,
                             framework_options=framework_options_from(args))
    plan = plan_bisect(BisectRequest(repo=args.repo, good=args.good, bad=args.bad, build=args.build, out=args.out,
                                     run=run_request, build_timeout_s=args.build_timeout,
                                     diagnose=not args.no_diagnose, expect=args.expect))
    console.print(f"bisect {plan.repo}: {plan.good.short} good .. {plan.bad.short} bad ({plan.commits} commits) | "
                  f"{plan.framework.name} vs {', '.join(plan.run.frameworks[:-1]) or 'the good commit, bit for bit'} | "
                  f"out {plan.out_dir}",
                  highlight=False)
    # Commit subjects may hold brackets ("[skip ci]") that rich would read as markup: escaped.
    result = run_bisect(plan, say=lambda text: console.print(f"[dim]{escape(text)}[/dim]", highlight=False))
    table = Table(title="tested commits", caption=JUDGED_AS)
    for col in TABLE_COLUMNS:
        table.add_column(col, justify="right" if col in ("#", "max |Δloss|", "seconds") else "left")
    for row in table_rows(result):
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)
    if result.diagnose:
        d = result.diagnose
        console.print(f"diagnose ({d.get('command', '')}): " + (f"could not run: {d['error']}" if d.get("error")
                      else "; ".join(d.get("findings") or [d.get("verdict", "")])), highlight=False, markup=False)
    console.print(headline(result), style="bold green" if result.found else "bold red", highlight=False,
                  markup=False, soft_wrap=True)
    console.print(f"{result.builds} build(s), {result.seconds:.0f} s | {plan.out_dir / RESULT_MD} | "
                  f"{plan.out_dir / RESULT_JSON}", highlight=False)
    return 0 if result.found else 1
