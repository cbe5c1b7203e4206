"""The run history (SQLite): every `lockstep run` and `lockstep compare` appends one run.

store: the database (schema, WAL, one transaction per run) · entries: a run's rows from the
comparison's output and the records · trend: one (case, framework) across commits, and the
difference between two runs.
"""

from lockstep.history.entries import run_from_comparison, run_from_summary, tokens_per_s_stats
from lockstep.history.store import HISTORY_ENV, HistoryStore, ResultRow, RunRow, default_history_path
from lockstep.history.trend import DiffRow, TrendPoint, diff_runs, trend, trend_png

__all__ = ["DiffRow", "HISTORY_ENV", "HistoryStore", "ResultRow", "RunRow", "TrendPoint", "default_history_path",
           "diff_runs", "run_from_comparison", "run_from_summary", "tokens_per_s_stats", "trend", "trend_png"]
