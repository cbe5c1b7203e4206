"""`history trend` and `history diff`: what the history says about one (case, framework) across
commits, and what changed between two runs."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

from lockstep.compare.throughput import is_noisy
from lockstep.history.store import HistoryStore, ResultRow, RunRow


@dataclass
class TrendPoint:
    run_id: str
    recorded_at: str
    commit: str  # the framework's own commit (InfiniTrain build), else lockstep's
    identity: str  # version / build, for the table
    verdict: str | None
    max_abs_diff: float | None
    threshold: float | None
    tps_median: float | None
    tps_min: float | None
    tps_max: float | None
    tps_cv: float | None
    inputs_sha256: str | None = None
    steps: int = 0
    peak_mem_mb: float | None = None
    mfu: float | None = None
    roofline_fraction: float | None = None
    machine: str | None = None
    device_name: str | None = None
    torch_version: str | None = None
    megatron_core_version: str | None = None

    @property
    def noisy(self) -> bool:
        return is_noisy(self.tps_cv)


def short_commit(commit: str | None) -> str:
    if not commit:
        return "?"
    head, _, rest = commit.partition("-")
    return head[:8] + (f"-{rest}" if rest else "")


def point_of(run: RunRow, r: ResultRow) -> TrendPoint:
    return TrendPoint(
        run_id=run.run_id, recorded_at=run.recorded_at, commit=short_commit(r.framework_commit or run.lockstep_commit),
        identity=r.framework_version or "-", verdict=r.verdict, max_abs_diff=r.max_abs_diff, threshold=r.threshold,
        tps_median=r.tps_median, tps_min=r.tps_min, tps_max=r.tps_max, tps_cv=r.tps_cv, inputs_sha256=r.inputs_sha256,
        steps=len(r.losses), peak_mem_mb=r.peak_mem_mb, mfu=r.mfu, machine=r.machine or run.host,
        roofline_fraction=r.roofline_fraction,
        device_name=r.device_name, torch_version=r.torch_version, megatron_core_version=r.megatron_core_version)


def same_inputs(points: list[TrendPoint], inputs: str | None = None) -> tuple[list[TrendPoint], int]:
    """The points of one set of inputs (the latest run's unless `inputs`, a digest or its
    prefix, is given), and how many points of other inputs were left out. A point that states
    no inputs and holds no losses (a skipped or failed pair) belongs to every series."""
    stated = [p.inputs_sha256 for p in points if p.inputs_sha256]
    if inputs:
        chosen = next((d for d in reversed(stated) if d.startswith(inputs)), inputs)
    else:
        chosen = stated[-1] if stated else None
    if chosen is None:
        return points, 0
    kept = [p for p in points if p.inputs_sha256 == chosen or (p.inputs_sha256 is None and not p.steps)]
    return kept, len(points) - len(kept)


def once_per_record(results: list[tuple[RunRow, ResultRow]]) -> list[tuple[RunRow, ResultRow]]:
    """The first of the entries that hold the same record judged the same way: a `lockstep run`
    and a later `lockstep compare` of its dirs are two entries, but one point of a trend."""
    seen, out = set(), []
    for run, r in results:
        key = (r.record_sha256, r.verdict, r.max_abs_diff) if r.record_sha256 else None
        if key is not None and key in seen:
            continue
        seen.add(key)
        out.append((run, r))
    return out


def trend(store: HistoryStore, case: str, framework: str, inputs: str | None = None) -> list[TrendPoint]:
    """One (case, framework) across the history, of one set of inputs (see same_inputs): runs
    of other steps, weights or tokens under the same case name are another trend."""
    return same_inputs([point_of(run, r) for run, r in once_per_record(store.results_for(case, framework))],
                       inputs)[0]


def trend_png(points: list[TrendPoint], title: str) -> bytes:
    """max |Δloss| (log axis, with the threshold) and median tok/s (bars from min to max), one
    x position per run in history order, labelled with the commit."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6.0, 0.9 * len(points) + 3), 6.5), dpi=100)
    FigureCanvasAgg(fig)
    ax_diff, ax_tps = fig.subplots(2, 1, sharex=True)
    fig.suptitle(title)
    xs = list(range(len(points)))
    diff = [(x, p) for x, p in zip(xs, points) if p.max_abs_diff is not None and math.isfinite(p.max_abs_diff)]
    if diff:
        # A log axis cannot show 0 (bitwise agreement): drawn at 1e-12 and said so in the title.
        ys = [max(p.max_abs_diff, 1e-12) for _, p in diff]
        colors = ["C3" if (p.verdict or "").startswith("FAIL") else "C0" for _, p in diff]
        ax_diff.plot([x for x, _ in diff], ys, color="C0", linewidth=1)
        ax_diff.scatter([x for x, _ in diff], ys, c=colors, zorder=3)
        for th in sorted({p.threshold for _, p in diff if p.threshold}):
            ax_diff.axhline(th, color="red", linestyle="--", linewidth=1, label=f"threshold {th:.0e}")
        ax_diff.set_yscale("log")
        if ax_diff.get_legend_handles_labels()[0]:
            ax_diff.legend(fontsize="small")
        ax_diff.set_ylabel("max |Δloss|")
    else:
        # No empty 0-1 axes: say why there is nothing to draw.
        ax_diff.set_axis_off()
        ax_diff.text(0.5, 0.5, "no |Δloss|: the baseline, or never compared with it", ha="center", va="center",
                     transform=ax_diff.transAxes, color="0.35")
    ax_diff.set_title("max |Δloss| vs baseline" + (" (0 drawn at 1e-12)" if diff else ""), fontsize="medium")
    tps = [(x, p) for x, p in zip(xs, points) if p.tps_median is not None]
    if tps:
        med = [p.tps_median for _, p in tps]
        lo = [p.tps_median - (p.tps_min if p.tps_min is not None else p.tps_median) for _, p in tps]
        hi = [(p.tps_max if p.tps_max is not None else p.tps_median) - p.tps_median for _, p in tps]
        ax_tps.errorbar([x for x, _ in tps], med, yerr=[lo, hi], marker="o", capsize=3)
        ax_tps.set_ylabel("tokens/s")
    else:
        ax_tps.text(0.5, 0.5, "no tok/s recorded", ha="center", va="center", transform=ax_tps.transAxes,
                    color="0.35")
        ax_tps.set_yticks([])
    ax_tps.set_title("tok/s per run: median after warm-up, bar from min to max", fontsize="medium")
    ax_tps.set_xticks(xs)
    ax_tps.set_xticklabels([p.commit for p in points], rotation=30, ha="right", fontsize="small")
    ax_tps.set_xlabel("commit (history order)")
    ax_tps.set_xlim(-0.5, len(points) - 0.5)
    fig.subplots_adjust(left=0.12, right=0.98, top=0.9, bottom=0.16, hspace=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


@dataclass
class DiffRow:
    case: str
    framework: str
    verdict_a: str | None
    verdict_b: str | None
    max_abs_diff_a: float | None
    max_abs_diff_b: float | None
    loss_delta: float | None  # max over steps of |loss_B - loss_A|
    loss_delta_step: int | None
    tps_ratio: float | None  # median tok/s B / A
    note: str = ""

    @property
    def verdict_changed(self) -> bool:
        """Only for pairs in both runs: a pair in one run only is said in `note`."""
        return not self.note.startswith("only in") and self.verdict_a != self.verdict_b


def diff_runs(a: RunRow, b: RunRow) -> list[DiffRow]:
    """Per (case, framework) of either run: how the losses, the verdict and tok/s moved from A to B."""
    ra = {(r.case, r.framework): r for r in a.results}
    rb = {(r.case, r.framework): r for r in b.results}
    rows = []
    for key in sorted(set(ra) | set(rb)):
        x, y = ra.get(key), rb.get(key)
        row = DiffRow(key[0], key[1], x and x.verdict, y and y.verdict, x and x.max_abs_diff, y and y.max_abs_diff,
                      None, None, None)
        if x is None or y is None:
            row.note = f"only in run {'B' if x is None else 'A'}"
        else:
            _loss_delta(row, x, y)
            if x.tps_median and y.tps_median:
                row.tps_ratio = y.tps_median / x.tps_median
        rows.append(row)
    return rows


def _loss_delta(row: DiffRow, x: ResultRow, y: ResultRow) -> None:
    n = min(len(x.losses), len(y.losses))
    if len(x.losses) != len(y.losses):
        row.note = f"steps {len(x.losses)} -> {len(y.losses)}"
    if n:
        deltas = [abs(y.losses[i] - x.losses[i]) for i in range(n)]
        i = max(range(n), key=lambda j: deltas[j])
        row.loss_delta = deltas[i]
        row.loss_delta_step = i + 1 if deltas[i] > 0 else None  # identical losses have no step of the max
