"""`lockstep golden record RUN_DIR... --out golden.json` and `lockstep golden check RUN_DIR
--golden golden.json`: reference losses with a tolerance from repeated runs, and a run judged
against them without re-running the references."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lockstep.commands.ci_options import add_junit_argument
from lockstep.errors import LockstepError
from lockstep.golden import (GOLDEN_K, NOT_JUDGED, check_run_dir, golden_diff, read_golden, record_golden,
                             write_golden)
from lockstep.report.junit import JUnitCase, write_junit


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("golden", help="record golden losses from reference runs, check a run against them",
                              description="Golden values: per case and step the mean loss of the reference runs and "
                                          f"a tolerance max(dtype threshold, {GOLDEN_K:g} x spread of the repeats).")
    sub = p.add_subparsers(dest="golden_command", metavar="SUBCOMMAND", required=True)
    r = sub.add_parser("record", help="record golden values from one or more run dirs (repeats included)")
    r.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", type=Path, help="run directories of the reference")
    r.add_argument("--out", type=Path, required=True, metavar="FILE", help="golden file to write (JSON)")
    r.add_argument("--framework", default=None,
                   help="the reference framework (default: each run's baseline from run.json, else pytorch)")
    r.add_argument("--k", type=_positive_finite, default=GOLDEN_K,
                   help=f"tolerance = max(threshold, k x spread) (default {GOLDEN_K:g})")
    r.add_argument("--update", action="store_true",
                   help="replace an existing golden file: prints old -> new per case (environment, every step whose "
                        "mean or tolerance moved) before writing, for review in the log and in version control")
    c = sub.add_parser("check", help="judge every record of a run dir against golden values")
    c.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run directory to judge")
    c.add_argument("--golden", type=Path, required=True, metavar="FILE",
                   help="the golden file golden record wrote (validated before any record is judged)")
    add_junit_argument(c)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    console = Console(width=None if sys.stdout.isatty() else 160, highlight=False)
    if args.golden_command == "record":
        golden = record_golden(args.run_dirs, args.framework, args.k)
        if args.out.exists() and not args.update:
            raise LockstepError(f"{args.out}: a golden file is already there; golden record --update replaces it "
                                "and shows what changes")
        if args.update and args.out.exists():
            console.print(f"changes to {escape(str(args.out))}:")
            for line in golden_diff(_old_golden(args.out), golden):
                console.print(escape(line), highlight=False)
        write_golden(args.out, golden)
        for case, g in golden["cases"].items():
            widest = max(g["steps"], key=lambda s: s["spread"])
            console.print(f"{escape(case)}: {len(g['steps'])} steps from {g['repeats']} runs of {golden['framework']}, "
                          f"largest spread {widest['spread']:.3e} (step {widest['step']}), tolerance "
                          f"{min(s['tolerance'] for s in g['steps']):.1e}..{max(s['tolerance'] for s in g['steps']):.1e}")
        console.print(f"wrote {args.out}")
        return 0
    golden = read_golden(args.golden)
    verdicts = check_run_dir(golden, args.run_dir)
    t = Table(title=escape(f"{args.run_dir} against {args.golden} ({golden['framework']} golden values)"),
              title_justify="left")
    for col in ("framework", "case", "verdict", "detail"):
        t.add_column(col)
    label = {"passed": "[green]PASS[/]", "failure": "[red]FAIL[/]", "error": "[yellow]ERROR[/]",
             "skipped": "[dim]skipped[/]"}
    for v in verdicts:
        t.add_row(escape(v.framework), escape(v.case), label[v.outcome], escape(v.message))
    console.print(t)
    if args.junit is not None:
        write_junit(args.junit, [JUnitCase("golden", f"lockstep.{v.framework}", v.case, v.outcome, v.message,
                                           properties={"max_dev": "-" if v.max_dev is None else f"{v.max_dev:.3e}",
                                                       "first_bad_step": str(v.first_bad_step)})
                                 for v in verdicts], name="lockstep golden")
        console.print(f"junit: {args.junit}")
    not_judged = [v for v in verdicts if v.outcome == "error" and v.message.startswith(NOT_JUDGED)]
    if not_judged:
        console.print(f"[yellow]{len(not_judged)} record(s) not judged[/] (no golden values for them): "
                      + escape(", ".join(f"{v.framework}/{v.case}" for v in not_judged)), highlight=False)
    judged = [v for v in verdicts if v.outcome != "skipped"]
    return 0 if judged and all(v.outcome == "passed" for v in judged) else 1


def _positive_finite(text: str) -> float:
    try:
        k = float(text)
    except ValueError:
        k = math.nan
    if not math.isfinite(k) or k <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite positive number, not {text!r}")
    return k


def _old_golden(path: Path) -> dict:
    """The file being replaced, as JSON, valid or not: --update is also how a bad one is replaced."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return old if isinstance(old, dict) else {}
