"""The options `run`, `compare` and `golden check` share for CI: --junit, --history, --no-history."""

from __future__ import annotations

import argparse
from pathlib import Path

from lockstep.history import HISTORY_ENV, HistoryStore, RunRow, default_history_path


def add_junit_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--junit", type=Path, default=None, metavar="FILE",
                   help="also write JUnit XML (one testcase per case and framework) for CI")


def add_history_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--history", type=Path, default=None, metavar="FILE",
                   help=f"history database to append to (default: ${HISTORY_ENV}, else "
                        "$XDG_DATA_HOME/lockstep/history.sqlite or ~/.local/share/lockstep/history.sqlite)")
    p.add_argument("--no-history", action="store_true", help="do not append this run to the history")


def history_path(args: argparse.Namespace) -> Path | None:
    """The database this command appends to, or None with --no-history."""
    if getattr(args, "no_history", False):
        return None
    return args.history if getattr(args, "history", None) is not None else default_history_path()


def append_history(args: argparse.Namespace, run: RunRow) -> Path | None:
    path = history_path(args)
    if path is None:
        return None
    HistoryStore(path).append(run)
    return path
