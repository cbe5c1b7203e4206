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
from lockstep.errors import LockstepError
from lockstep.fsutil import atomic_write
from lockstep.history import HISTORY_ENV, HistoryStore, diff_runs, trend_png
from lockstep.history.trend import once_per_record, point_of, same_inputs


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("history", help="list, trend and diff the runs in the history database",
                              description="The history database that every `lockstep run` and `lockstep compare` "
                                          "appends to. Without a subcommand: list the runs.")
    p.add_argument("--history", type=Path, default=None, metavar="FILE",
                   help=f"history database (default: ${HISTORY_ENV}, else the user's data dir)")
    p.add_argument("--limit", type=int, default=20, metavar="N", help="list the last N runs (default 20; 0: all)")
    sub = p.add_subparsers(dest="history_command", metavar="SUBCOMMAND")
    t = sub.add_parser("trend", help="max |Δloss| and tok/s of one case and framework across commits (table + PNG)")
    t.add_argument("--case", required=True, help="the case's name, as in the run's records (e.g. gpt2_1)")
    t.add_argument("--framework", required=True, help="the framework's name in the history (e.g. infinitrain)")
    t.add_argument("--inputs", default=None, metavar="DIGEST",
                   help="the case's inputs digest (or a prefix) to trend; default: the latest run's (runs of other "
                        "steps, weights or tokens under the same case name are another trend)")
    t.add_argument("--png", type=Path, default=None, metavar="FILE",
                   help="where to write the plot (default: trend_<case>_<framework>.png)")
    d = sub.add_parser("diff", help="what changed between two runs: loss deltas, verdicts, tok/s ratio")
    d.add_argument("run_a", metavar="RUN_A", help="run id (or a unique prefix)")
    d.add_argument("run_b", metavar="RUN_B", help="the run to compare with RUN_A (id or a unique prefix)")
    st = sub.add_parser("site", help="write the history as a static site: overview, trends, runs, diffs",
                        description="A static, self-contained site (no server, no network: it opens from the file "
                                    "system) of the history: the overview matrix, a trend per case, framework and "
                                    "inputs, a page per run, diffs. Rebuilding into the same OUT_DIR writes only "
                                    "the pages that changed.")
    st.add_argument("out_dir", metavar="OUT_DIR", type=Path, help="directory to write the site into")
    st.add_argument("--since", default=None, metavar="DATE",
                    help="only runs recorded at or after DATE (ISO 8601, UTC: 2026-12-01 or 2026-12-01T06:00)")
    st.add_argument("--diff", nargs=2, action="append", default=[], metavar=("RUN_A", "RUN_B"),
                    help="also write the diff of these two runs (repeatable); each run's page already holds its "
                         "diff against the previous run of its pairs")
    st.add_argument("--force", action="store_true",
                    help="OUT_DIR is not empty and was not written by history site: move what has one of the "
                         "site's names aside (<name>.moved-by-lockstep-<UTC time>) instead of refusing; nothing is "
                         "deleted")
    for sp in (t, d, st):  # also after the subcommand; SUPPRESS keeps the parent's value when absent here
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
    if args.history_command == "site":
        return run_site(store, args, console)
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
    points, left_out = same_inputs([point_of(run, r) for run, r in once_per_record(
        store.results_for(args.case, args.framework))],
                                   args.inputs)
    if not points:
        console.print(f"no history for case {escape(args.case)} on {escape(args.framework)} in {store.path}")
        return 1
    t = Table(title=escape(f"{args.case} on {args.framework}: {len(points)} runs"), title_justify="left")
    for col in ("run id", "commit", "version", "max |Δloss|", "threshold", "verdict", "tok/s median", "min", "max",
                "CV %"):
        t.add_column(col, justify="right" if col not in ("run id", "commit", "version", "verdict") else "left")
    for p in points:
        t.add_row(p.run_id, escape(p.commit), escape(p.identity), _num(p.max_abs_diff, ".3e"), _num(p.threshold, ".0e"),
                  p.verdict or "-", _num(p.tps_median, ",.0f"), _num(p.tps_min, ",.0f"), _num(p.tps_max, ",.0f"),
                  _num(p.tps_cv, ".1%") + (" NOISY" if p.noisy else ""))
    console.print(t)
    digest = next((p.inputs_sha256 for p in reversed(points) if p.inputs_sha256), None)
    if digest:
        console.print(f"inputs {digest[:12]}" + (f"; {left_out} run(s) of other inputs (steps, weights, tokens or "
                                                  "hyper-parameters) not shown: --inputs DIGEST picks them"
                                                  if left_out else ""))
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


def run_site(store: HistoryStore, args: argparse.Namespace, console: Console) -> int:
    from lockstep.history.site import build_site

    since = _since(args.since)
    built = build_site(store, args.out_dir, since, [tuple(d) for d in args.diff], force=args.force)
    for name, moved_to in built.moved_aside:
        console.print(f"moved aside {escape(str(built.out_dir / name))} (not written by history site, --force) -> "
                      f"{escape(moved_to)}")
    console.print(f"history site: {built.out_dir / 'index.html'} ({built.runs} runs, {built.pages} pages, "
                  f"{built.written} written, {built.removed} removed, {built.seconds:.2f} s)")
    return 0


def _since(text: str | None) -> str | None:
    """An ISO date or time, as the history's UTC timestamps compare with it."""
    if text is None:
        return None
    import datetime as _dt

    try:
        when = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise LockstepError(f"--since {text!r}: not an ISO 8601 date or time (2026-12-01, 2026-12-01T06:00)") from None
    if when.tzinfo is not None:
        when = when.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return when.isoformat()
