"""The history section of report.html: one trend plot per (case, framework) of the run that the
history database holds at least two runs of."""

from __future__ import annotations

import os
from pathlib import Path

from lockstep.errors import LockstepError
from lockstep.report.data import ReportData

MIN_POINTS = 2  # one run is not a trend


def history_trends(data: ReportData, history_path: str | os.PathLike | None, pending=None) -> dict[str, bytes]:
    """label -> PNG; empty without a history file. A history that cannot be read leaves the report
    as it would be without one (the run itself said so when it tried to append). `pending`: the
    run (a RunRow) that `lockstep run` appends once it has finished, the trend's last point."""
    if history_path is None or not Path(history_path).is_file():
        return {}
    from lockstep.history import HistoryStore, trend, trend_png
    from lockstep.history.trend import point_of

    store = HistoryStore(history_path)
    out = {}
    try:
        for case in data.cases:
            for fw in data.frameworks:
                # A run that skipped the pair measured nothing: no point of the trend (it drew empty axes).
                points = [p for p in trend(store, case, fw) + [point_of(pending, r) for r in
                                                               (pending.results if pending else [])
                                                               if r.case == case and r.framework == fw]
                          if p.verdict != "SKIPPED" and (p.max_abs_diff is not None or p.tps_median is not None)]
                if len(points) >= MIN_POINTS:
                    label = f"{case} on {fw}: {len(points)} runs"
                    out[label] = trend_png(points, label)
    except LockstepError:
        return {}
    return out
