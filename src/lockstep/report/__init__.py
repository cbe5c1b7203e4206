"""`lockstep report`: report.html (self-contained) and report.md (+ report_files/*.png) for a run dir.

data: gather records, verdicts and metadata · plots: one PNG per case · tables: shared rows ·
html / markdown: the two writers.
"""

from __future__ import annotations

import os
from pathlib import Path

from lockstep.compare import CompareOptions
from lockstep.fsutil import atomic_write
from lockstep.outdir import RUN_OUTPUT_DIRS, report_image_name
from lockstep.report.data import ReportData, gather
from lockstep.report.html import render_html
from lockstep.report.markdown import render_markdown
from lockstep.report.history import history_trends
from lockstep.report.plots import case_figure_png

HTML_NAME = "report.html"
MARKDOWN_NAME = "report.md"
IMAGES_DIR = RUN_OUTPUT_DIRS[0]  # report_files/, which a later run clears of the plots it knows


def write_report(run_dir: str | os.PathLike, baseline_framework: str = "pytorch",
                 options: CompareOptions | None = None,
                 history_path: str | os.PathLike | None = None, data: ReportData | None = None) -> tuple[Path, Path]:
    """Write `<run_dir>/report.html` and `<run_dir>/report.md`; return their paths. With a history
    database that holds earlier runs of the run's cases, report.html also shows their trend.
    `data`: what `gather` found, when the caller needs it too (e.g. to say what was unreadable)."""
    if data is None:
        data = gather(run_dir, baseline_framework, options)
    run_dir = Path(run_dir)
    images = {case: case_figure_png(data, case) for case in data.cases if data.records.get(case)}
    image_paths = {}
    for case, png in images.items():
        rel = f"{IMAGES_DIR}/{report_image_name(case)}"
        with atomic_write(run_dir / rel, "wb", what="report plot") as f:
            f.write(png)
        image_paths[case] = rel
    html_path, md_path = run_dir / HTML_NAME, run_dir / MARKDOWN_NAME
    with atomic_write(html_path, "w", what="HTML report") as f:
        f.write(render_html(data, images, history_trends(data, history_path)))
    with atomic_write(md_path, "w", what="Markdown report") as f:
        f.write(render_markdown(data, image_paths))
    return html_path, md_path


__all__ = ["HTML_NAME", "IMAGES_DIR", "MARKDOWN_NAME", "ReportData", "gather", "write_report"]
