"""`lockstep report`: report.html (self-contained) and report.md (+ report_files/*.png) for a run dir.

data: gather records, verdicts and metadata · plots: one PNG per case · tables: shared rows ·
html / markdown: the two writers.
"""

from __future__ import annotations

import os
from pathlib import Path

from lockstep.compare import CompareOptions
from lockstep.errors import FormatError
from lockstep.fsutil import atomic_write, read_head
from lockstep.outdir import RUN_OUTPUT_DIRS, is_lockstep_output, report_image_name
from lockstep.report.data import ReportData, gather
from lockstep.report.html import render_html
from lockstep.report.markdown import render_markdown
from lockstep.report.history import history_trends

HTML_NAME = "report.html"
MARKDOWN_NAME = "report.md"
IMAGES_DIR = RUN_OUTPUT_DIRS[0]  # report_files/, which a later run clears of the plots it knows


def refuse_to_overwrite_foreign(path: Path) -> None:
    """`lockstep report DIR` may be pointed at any directory: a report.html there that lockstep did
    not write (it lacks outdir.REPORT_MARK) is refused (before anything is written), never overwritten."""
    if not os.path.lexists(path):
        return
    read_head(path, 1, "report")  # an unreadable file is said as such
    if not is_lockstep_output(path):
        raise FormatError(path, "exists and was not written by lockstep; lockstep does not overwrite it: move it "
                                "away, or report into a directory of lockstep's")


def write_report(run_dir: str | os.PathLike, baseline_framework: str = "pytorch",
                 options: CompareOptions | None = None,
                 history_path: str | os.PathLike | None = None, data: ReportData | None = None,
                 pending_history=None) -> tuple[Path, Path]:
    """Write `<run_dir>/report.html` and `<run_dir>/report.md`; return their paths. With a history
    database that holds earlier runs of the run's cases, report.html also shows their trend.
    `data`: what `gather` found, when the caller needs it too (e.g. to say what was unreadable).
    `pending_history`: the run (a history RunRow) about to be appended, shown in the trends."""
    if data is None:
        data = gather(run_dir, baseline_framework, options)
    run_dir = Path(run_dir)
    html_path, md_path = run_dir / HTML_NAME, run_dir / MARKDOWN_NAME
    for path in (html_path, md_path):
        refuse_to_overwrite_foreign(path)
    from lockstep.report.plots import case_figure_png  # matplotlib: imported when a report is drawn

    images = {case: case_figure_png(data, case) for case in data.cases if data.records.get(case)}
    image_paths = {}
    for case, png in images.items():
        rel = f"{IMAGES_DIR}/{report_image_name(case)}"
        with atomic_write(run_dir / rel, "wb", what="report plot") as f:
            f.write(png)
        image_paths[case] = rel
    with atomic_write(html_path, "w", what="HTML report") as f:
        f.write(render_html(data, images, history_trends(data, history_path, pending_history)))
    with atomic_write(md_path, "w", what="Markdown report") as f:
        f.write(render_markdown(data, image_paths))
    return html_path, md_path


__all__ = ["HTML_NAME", "IMAGES_DIR", "MARKDOWN_NAME", "ReportData", "gather", "write_report"]
