"""One PNG per case: loss curves of every framework, |Δloss| against the baseline on a log axis
with the threshold, and median tok/s bars (min-max whiskers). Drawn with matplotlib's Agg canvas (no display, no
pyplot global state)."""

from __future__ import annotations

import io
import math
import textwrap

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lockstep.compare.throughput import throughput_of
from lockstep.outdir import REPORT_MARK
from lockstep.report.data import ReportData

# A log axis cannot show an exact match (|Δloss| = 0); such steps are drawn at this floor and said so.
ZERO_FLOOR = 1e-12
# Beyond this many steps markers would only blur the line (and slow the drawing).
MAX_MARKED_STEPS = 200


def framework_color(data: ReportData, framework: str) -> str:
    """One colour per framework in every panel, so a line and its bar are read as the same run."""
    return f"C{data.frameworks.index(framework)}"


def _not_shown(ax, message: str) -> None:
    ax.set_axis_off()
    ax.text(0.5, 0.5, textwrap.fill(message, 45), ha="center", va="center", transform=ax.transAxes,
            fontsize="medium", color="0.35")


def case_figure_png(data: ReportData, case: str) -> bytes:
    # Fixed margins rather than constrained layout: the layout solver cost more than the drawing.
    fig = Figure(figsize=(15, 4.2), dpi=100)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.12, top=0.85, wspace=0.22)
    FigureCanvasAgg(fig)
    ax_loss, ax_diff, ax_tps = fig.subplots(1, 3)
    fig.suptitle(case)
    records = data.records.get(case, {})
    _draw_losses(ax_loss, data, case, records)
    _draw_loss_diffs(ax_diff, data, case)
    _draw_throughput(ax_tps, data, records)
    buf = io.BytesIO()
    # The mark tells a later run into this directory that report_files/<case>.png is lockstep's.
    fig.savefig(buf, format="png", metadata={"Software": f"matplotlib, {REPORT_MARK}"})
    return buf.getvalue()


def _loss_line_style(data: ReportData, framework: str, steps: int) -> dict:
    if framework == data.baseline:
        # Wide and pale underneath: when a test run matches it exactly, it still shows around the test line.
        return {"linewidth": 5, "alpha": 0.45, "zorder": 1, "solid_capstyle": "round"}
    marker = {"marker": "o", "markersize": 3} if steps <= MAX_MARKED_STEPS else {}
    return {"linewidth": 1.5, "linestyle": "--", "zorder": 2 + data.frameworks.index(framework), **marker}


def _draw_losses(ax, data: ReportData, case: str, records: dict) -> None:
    """Left panel: every framework's loss curve, the baseline underneath."""
    for fw in data.frameworks:
        rec = records.get(fw)
        if rec is None:
            continue
        steps = sorted(rec.steps, key=lambda s: s.step)
        ax.plot([s.step for s in steps], [s.loss for s in steps], color=framework_color(data, fw),
                label=fw + (" (baseline)" if fw == data.baseline else ""), **_loss_line_style(data, fw, len(steps)))
    ax.set_title("loss")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (mean cross-entropy)")
    if records:
        ax.legend(fontsize="small")
    else:
        _not_shown(ax, f"not run: {data.not_compared_reason(case)}")


def _draw_loss_diffs(ax, data: ReportData, case: str) -> None:
    """Middle panel: |Δloss| against the baseline on a log axis, with each threshold in force."""
    thresholds = set()
    floored = False
    for fw, verdict in data.verdicts(case).items():
        if verdict.error is not None or not verdict.diffs:
            continue
        ys = [d.abs_diff if d.abs_diff > 0 else ZERO_FLOOR for d in verdict.diffs]
        floored |= any(d.abs_diff == 0 for d in verdict.diffs)
        marker = {"marker": "o", "markersize": 3} if len(ys) <= MAX_MARKED_STEPS else {}
        ax.plot([d.step for d in verdict.diffs], ys, color=framework_color(data, fw),
                label=f"{fw} vs {data.baseline}", **marker)
        if verdict.threshold is not None:
            thresholds.add(verdict.threshold)
    ax.set_title("|Δloss| vs baseline" + (f" (0 drawn at {ZERO_FLOOR:.0e})" if floored else ""))
    if ax.lines:
        for th in sorted(thresholds):
            ax.axhline(th, color="red", linestyle="--", linewidth=1, label=f"threshold {th:.0e}")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("|Δloss|")
        ax.legend(fontsize="small")
    else:
        # No empty 0-1 axes pretending to be a plot: say why there is nothing to draw.
        _not_shown(ax, f"not compared: {data.not_compared_reason(case)}")


def _draw_throughput(ax, data: ReportData, records: dict) -> None:
    """Right panel: median tok/s bars of the frameworks that recorded a finite one."""
    names, spreads = [], []
    for fw in data.frameworks:
        rec = records.get(fw)
        spread = throughput_of(rec, data.options.warmup_steps).tokens_per_s if rec is not None else None
        if spread is not None and math.isfinite(spread.median):
            names.append(fw)
            spreads.append(spread)
    if spreads:
        # Median with a min-max whisker (compare/throughput.py: the numbers every table shows).
        values = [s.median for s in spreads]
        whiskers = [[s.median - s.min for s in spreads], [s.max - s.median for s in spreads]]
        bars = ax.bar(names, values, yerr=whiskers, capsize=3, color=[framework_color(data, n) for n in names])
        ax.bar_label(bars, labels=[f"{s.median:,.0f}" + (" NOISY" if s.noisy else "") for s in spreads],
                     fontsize="small")
        ax.set_ylabel("tokens/s")
    else:
        _not_shown(ax, "no tok/s recorded")
    ax.set_title(f"tok/s (median, min-max, after step {data.options.warmup_steps})")
