"""report.html: one self-contained file (inline CSS, plots as base64 PNG data URIs, no external
references), so it can be mailed or attached to a CI run as is."""

from __future__ import annotations

import base64
import html

from lockstep.outdir import REPORT_MARK
from lockstep.report import tables
from lockstep.report.data import ReportData

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f2f2f2; }
td.PASS { color: #107010; font-weight: bold; }
td.FAIL, td.ERROR { color: #b00000; font-weight: bold; }
td.SKIPPED { color: #777; }
td.not { color: #a06000; font-weight: bold; }
img { max-width: 100%; }
.overall-pass { color: #107010; } .overall-fail { color: #b00000; }
"""


HISTORY_NOTE = ("Earlier runs of this run's cases from the history database, one point per run in the order "
                "they were recorded, labelled with the commit. Top: the largest |Δloss| of the run against the "
                "baseline (log axis; red dashes: the threshold; a red point: a FAIL). Bottom: that run's tok/s, "
                "the median over the steps after warm-up with a bar from the slowest to the fastest step. Pairs "
                "a run skipped are left out.")


def _table(header: list[str], rows: list[list[str]], verdict_col: int | None = None) -> str:
    out = ["<table>", "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            # The class is the verdict's first word (PASS, FAIL, ERROR, SKIPPED); the cell says it whole.
            cls = f' class="{html.escape(cell.split()[0])}"' if i == verdict_col and cell else ""
            cells.append(f"<td{cls}>{html.escape(cell)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def render_html(data: ReportData, images: dict[str, bytes], trends: dict[str, bytes] | None = None) -> str:
    title = f"lockstep report: {data.run_dir.name}"
    overall_cls = "overall-pass" if data.passed else "overall-fail"
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
        f'<meta name="generator" content="{REPORT_MARK}">',  # how a later run knows the file for lockstep's
        f"<style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        *([f'<p class="overall-fail"><strong>{html.escape(line)}</strong></p>']
          if (line := tables.incomplete_line(data)) else []),
        *([f'<p class="overall-fail"><strong>{html.escape(line)}</strong></p>']
          if (line := tables.interrupted_line(data)) else []),
        f'<p class="{overall_cls}"><strong>{html.escape(tables.overall_line(data))}</strong></p>',
    ]
    # A heading only above a table with rows: an empty one would say something was compared.
    verdicts, resumes, throughput = tables.verdict_rows(data), tables.resume_rows(data), tables.throughput_rows(data)
    if verdicts:
        parts += ["<h2>Verdicts</h2>",
                  _table(tables.VERDICT_HEADER, verdicts, verdict_col=tables.VERDICT_HEADER.index("verdict"))]
    if resumes:
        parts += ["<h2>Resumes</h2>", f"<p>{html.escape(tables.RESUME_NOTE)}</p>",
                  _table(tables.RESUME_HEADER, resumes, verdict_col=tables.RESUME_HEADER.index("verdict"))]
    if twins := tables.twin_rows(data):
        parts += ["<h2>Recompute twins</h2>", f"<p>{html.escape(tables.TWIN_NOTE)}</p>", _table(tables.TWIN_HEADER, twins)]
    if throughput:
        parts += ["<h2>Throughput</h2>", f"<p>{html.escape(tables.THROUGHPUT_NOTE)}</p>",
                  _table(tables.THROUGHPUT_HEADER, throughput)]
    certificates = tables.certificate_rows(data)
    if certificates:
        parts += ["<h2>Step-1 certificates</h2>", f"<p>{html.escape(tables.CERTIFICATE_NOTE)}</p>",
                  _table(tables.CERTIFICATE_HEADER, certificates)]
    if data.timing:
        parts += ["<h2>Where the time went</h2>", f"<p>{html.escape(tables.timing_note(data))}</p>",
                  _table(tables.TIMING_HEADER, tables.timing_rows(data))]
    problems = tables.problem_lines(data)
    if problems:
        parts += ["<h2>Problems</h2>", "<ul>"] + [f"<li>{html.escape(p)}</li>" for p in problems] + ["</ul>"]
    skipped = tables.skipped_lines(data)
    if skipped:
        parts += ["<h2>Skipped (expected, with the reason)</h2>", "<ul>"]
        parts += [f"<li>{html.escape(line)}</li>" for line in skipped] + ["</ul>"]
    parts.append("<h2>Cases</h2>")
    for case in data.cases:
        parts.append(f"<h3>{html.escape(case)}</h3>")
        png = images.get(case)
        if png is not None:
            b64 = base64.b64encode(png).decode("ascii")
            parts.append(f'<img alt="{html.escape(case)}: loss, |Δloss| and tok/s" src="data:image/png;base64,{b64}">')
        else:
            parts.append(f"<p>not run: {html.escape(data.not_compared_reason(case))}</p>")
    if trends:
        parts += ["<h2>History</h2>", f"<p>{html.escape(HISTORY_NOTE)}</p>"]
        for label, png in trends.items():
            b64 = base64.b64encode(png).decode("ascii")
            # The plot's own title names the case, framework and number of runs: no heading repeats it.
            parts.append(f'<img alt="{html.escape(label)}: max |Δloss| and tok/s across commits" '
                         f'src="data:image/png;base64,{b64}">')
    from lockstep.diagnose.render import html_section, load_verdicts

    diagnosed = html_section(load_verdicts(data.run_dir))  # `lockstep diagnose` verdicts of this run, if any
    if diagnosed:
        parts.append(diagnosed)
    parts += ["<h2>Run metadata</h2>", _table(tables.METADATA_HEADER, tables.metadata_rows(data)),
              _table(tables.FRAMEWORK_HEADER, tables.framework_rows(data)), "</body></html>"]
    return "\n".join(parts) + "\n"
