"""`lockstep report RUN_DIR`: write RUN_DIR/report.html (self-contained) and RUN_DIR/report.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lockstep.compare import CompareOptions
from lockstep.report import gather, write_report


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="write report.html and report.md for a run directory",
        description="Write RUN_DIR/report.html (self-contained, plots embedded) and RUN_DIR/report.md "
                    "(plots in RUN_DIR/report_files/): loss curves, |Δloss| against the threshold, tok/s, "
                    "the verdict table and the run's metadata. Exits 1 when a file of the run cannot be read or "
                    "is not a lockstep record (each named; the report of the rest is still written).")
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="output directory of `lockstep run`")
    p.add_argument("--baseline", default="pytorch", metavar="FRAMEWORK",
                   help="framework the others are compared with (default pytorch)")
    p.add_argument("--history", type=Path, default=None, metavar="FILE",
                   help="history database whose trends of the run's cases report.html shows (default: "
                        "$LOCKSTEP_HISTORY, else the user's data dir); --no-history leaves them out")
    p.add_argument("--no-history", action="store_true", help="no history section")
    p.add_argument("--peak-tflops", type=float, default=None, metavar="X",
                   help="per-device peak TFLOP/s for MFU (default: the known-device table; none on CPU)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not args.run_dir.is_dir():
        print(f"lockstep report: error: RUN_DIR {args.run_dir} is not a directory", file=sys.stderr)
        return 2
    from lockstep.commands.ci_options import history_path

    options = CompareOptions(peak_tflops=args.peak_tflops)
    data = gather(args.run_dir, args.baseline, options)
    html_path, md_path = write_report(args.run_dir, args.baseline, options, history_path=history_path(args), data=data)
    print(f"wrote {html_path}")
    print(f"wrote {md_path}")
    from lockstep.report.tables import interrupted_line

    line = interrupted_line(data)
    if line:  # what finished is reported whole; the rest is marked, not an unreadable file
        print(line)
    unreadable = data.unreadable_files()
    if unreadable:
        # The report of the rest is still worth having; the exit status must not call it whole.
        for line in unreadable:
            print(f"lockstep report: error: {line}", file=sys.stderr)
        print(f"lockstep report: the report is incomplete: {len(unreadable)} file(s) of {args.run_dir} could not be "
              "read or are not lockstep records (listed above and under Problems in the report)", file=sys.stderr)
        return 1
    return 0
