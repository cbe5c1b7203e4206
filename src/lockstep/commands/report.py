"""`lockstep report RUN_DIR`: write RUN_DIR/report.html (self-contained) and RUN_DIR/report.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lockstep.report import write_report


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="write report.html and report.md for a run directory",
        description="Write RUN_DIR/report.html (self-contained, plots embedded) and RUN_DIR/report.md "
                    "(plots in RUN_DIR/report_files/): loss curves, |Δloss| against the threshold, tok/s, "
                    "the verdict table and the run's metadata.")
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="output directory of `lockstep run`")
    p.add_argument("--baseline", default="pytorch", metavar="FRAMEWORK",
                   help="framework the others are compared with (default pytorch)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not args.run_dir.is_dir():
        print(f"lockstep report: error: RUN_DIR {args.run_dir} is not a directory", file=sys.stderr)
        return 2
    html_path, md_path = write_report(args.run_dir, args.baseline)
    print(f"wrote {html_path}")
    print(f"wrote {md_path}")
    return 0
