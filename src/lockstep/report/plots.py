"""One PNG per case: loss curves of every framework, |Δloss| against the baseline on a log axis
with the threshold, and mean tok/s bars. Drawn with matplotlib's Agg canvas (no display, no
pyplot global state)."""

from __future__ import annotations

import io
import math

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lockstep.report.data import ReportData

# A log axis cannot show an exact match (|Δloss| = 0); such steps are drawn at this floor and said so.
ZERO_FLOOR = 1e-12


def framework_color(data: ReportData, framework: str) -> str:
    """One colour per framework in every panel, so a line and its bar are read as the same run."""
    return f"C{data.frameworks.index(framework)}"


def case_figure_png(data: ReportData, case: str) -> bytes:
    # Fixed margins rather than constrained layout: the layout solver cost more than the drawing.
    fig = Figure(figsize=(15, 4.2), dpi=100)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.12, top=0.85, wspace=0.22)
    FigureCanvasAgg(fig)
    ax_loss, ax_diff, ax_tps = fig.subplots(1, 3)
    fig.suptitle(case)
    records = data.records.get(case, {})

    for fw in data.frameworks:
        rec = records.get(fw)
        if rec is None:
            continue
        steps = sorted(rec.steps, key=lambda s: s.step)
        ax_loss.plot([s.step for s in steps], [s.loss for s in steps], marker="o", markersize=3,
                     color=framework_color(data, fw), label=fw + (" (baseline)" if fw == data.baseline else ""))
    ax_loss.set_title("loss")
    ax_loss.set_xlabel("step")
    if records:
        ax_loss.legend(fontsize="small")

    thresholds = set()
    floored = False
    for fw, verdict in data.verdicts(case).items():
        if verdict.error is not None or not verdict.diffs:
            continue
        ys = [d.abs_diff if d.abs_diff > 0 else ZERO_FLOOR for d in verdict.diffs]
        floored |= any(d.abs_diff == 0 for d in verdict.diffs)
        ax_diff.plot([d.step for d in verdict.diffs], ys, marker="o", markersize=3, color=framework_color(data, fw),
                     label=f"{fw} vs {data.baseline}")
        if verdict.threshold is not None:
            thresholds.add(verdict.threshold)
    for th in sorted(thresholds):
        ax_diff.axhline(th, color="red", linestyle="--", linewidth=1, label=f"threshold {th:.0e}")
    ax_diff.set_yscale("log")
    ax_diff.set_title("|Δloss| vs baseline" + (f" (0 drawn at {ZERO_FLOOR:.0e})" if floored else ""))
    ax_diff.set_xlabel("step")
    if ax_diff.lines:
        ax_diff.legend(fontsize="small")
    else:
        ax_diff.text(0.5, 0.5, "no comparison", ha="center", va="center", transform=ax_diff.transAxes)

    names, values = [], []
    for fw in data.frameworks:
        rec = records.get(fw)
        tps = rec.mean_tokens_per_s(data.options.warmup_steps) if rec is not None else None
        if tps is not None and math.isfinite(tps):
            names.append(fw)
            values.append(tps)
    if values:
        bars = ax_tps.bar(names, values, color=[framework_color(data, n) for n in names])
        ax_tps.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize="small")
    else:
        ax_tps.text(0.5, 0.5, "no tok/s", ha="center", va="center", transform=ax_tps.transAxes)
    ax_tps.set_title(f"tok/s (mean after step {data.options.warmup_steps})")

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
