"""`lockstep history`: the runs appended by `lockstep run` / `compare`; `history trend` (one case
and framework across commits, table + PNG); `history diff RUN_A RUN_B` (what changed)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lockstep.commands.ci_options import history_path
from lockstep.fsutil import atomic_write
from lockstep.history import HISTORY_ENV, HistoryStore, diff_runs, trend, trend_png


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("history", help="list, trend and diff the runs in the history database",
                              description="The history database that every `lockstep run` and `lockstep compare` "
                                          "appends to. Without a subcommand: list the runs.")
    p.add_argument("--history", type=Path, default=None, metavar="FILE",
                   help=f"history database (default: ${HISTORY_ENV}, else the user's data dir)")
    p.add_argument("--limit", type=int, default=20, metavar="N", help="list the last N runs (default 20; 0: all)")
    sub = p.add_subparsers(dest="history_command", metavar="SUBCOMMAND")
    t = sub.add_parser("trend", help="max |Δloss| and tok/s of one case and framework across commits (table + PNG)")
    t.add_argument("--case", required=True)
    t.add_argument("--framework", required=True)
    t.add_argument("--png", type=Path, default=None, metavar="FILE",
                   help="where to write the plot (default: trend_<case>_<framework>.png)")
    d = sub.add_parser("diff", help="what changed between two runs: loss deltas, verdicts, tok/s ratio")
    d.add_argument("run_a", metavar="RUN_A", help="run id (or a unique prefix)")
    d.add_argument("run_b", metavar="RUN_B")
    for sp in (t, d):  # also after the subcommand; SUPPRESS keeps the parent's value when absent here
        sp.add_argument("--history", type=Path, default=argparse.SUPPRESS, metavar="FILE", help="history database")
    p.set_defaults(handler=run)


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def run(args: argparse.Namespace) -> int:
    store = HistoryStore(history_path(args))
    console = _console()
    if args.history_command == "trend":
        return run_trend(store, args, console)
    if args.history_command == "diff":
        return run_diff(store, args, console)
    runs = store.runs(limit=args.limit or None)
    t = Table(title=escape(f"runs in {store.path}"), title_justify="left")
    for col in ("run id", "recorded (UTC)", "kind", "lockstep commit", "baseline", "cases", "frameworks", "verdict",
                "source"):
        t.add_column(col)
    for r in runs:
        verdict = "-" if r.passed is None else "[green]PASS[/]" if r.passed else "[red]FAIL[/]"
        t.add_row(r.run_id, r.recorded_at[:19].replace("T", " "), r.kind, (r.lockstep_commit or "?")[:12],
                  r.baseline_framework or "-", str(len({x.case for x in r.results})),
                  escape(",".join(sorted({x.framework for x in r.results}))), verdict, escape(r.source))
    console.print(t)
    return 0


def run_trend(store: HistoryStore, args: argparse.Namespace, console: Console) -> int:
    points = trend(store, args.case, args.framework)
    if not points:
        console.print(f"no history for case {escape(args.case)} on {escape(args.framework)} in {store.path}")
        return 1
    t = Table(title=escape(f"{args.case} on {args.framework}: {len(points)} runs"), title_justify="left")
    for col in ("run id", "commit", "version", "max |Δloss|", "threshold", "verdict", "tok/s median", "min", "max",
                "CV"):
        t.add_column(col, justify="right" if col not in ("run id", "commit", "version", "verdict") else "left")
    for p in points:
        t.add_row(p.run_id, escape(p.commit), escape(p.identity), _num(p.max_abs_diff, ".3e"), _num(p.threshold, ".0e"),
                  p.verdict or "-", _num(p.tps_median, ",.0f"), _num(p.tps_min, ",.0f"), _num(p.tps_max, ",.0f"),
                  _num(p.tps_cv, ".3f") + (" NOISY" if p.noisy else ""))
    console.print(t)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{args.case}_{args.framework}")
    png_path = args.png or Path(f"trend_{safe}.png")
    with atomic_write(png_path, "wb", what="trend plot") as f:
        f.write(trend_png(points, f"{args.case} on {args.framework}"))
    console.print(f"plot: {png_path}")
    return 0


def run_diff(store: HistoryStore, args: argparse.Namespace, console: Console) -> int:
    a, b = store.run(args.run_a), store.run(args.run_b)
    rows = diff_runs(a, b)
    t = Table(title=escape(f"A {a.run_id} ({(a.lockstep_commit or '?')[:12]}) -> B {b.run_id} "
                           f"({(b.lockstep_commit or '?')[:12]})"), title_justify="left")
    for col in ("case", "framework", "verdict A -> B", "max |Δloss| vs baseline A -> B", "max |loss B - loss A|",
                "at step", "tok/s B/A", "note"):
        t.add_column(col)
    changed = 0
    for r in rows:
        verdict = f"{r.verdict_a or '-'} -> {r.verdict_b or '-'}"
        if r.verdict_changed:
            changed += 1
            verdict = f"[bold yellow]{verdict}[/]"
        t.add_row(escape(r.case), escape(r.framework), verdict,
                  f"{_num(r.max_abs_diff_a, '.3e')} -> {_num(r.max_abs_diff_b, '.3e')}", _num(r.loss_delta, ".3e"),
                  _num(r.loss_delta_step, "d"), _num(r.tps_ratio, ".3f"), escape(r.note))
    console.print(t)
    moved = sum(1 for r in rows if r.loss_delta)
    console.print(f"{len(rows)} (case, framework) pairs: {changed} verdict change(s), {moved} with different losses")
    return 0
