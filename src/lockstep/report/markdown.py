"""report.md: the same content as report.html, with the plots as PNG files beside it."""

from __future__ import annotations

from lockstep.outdir import REPORT_MARK
from lockstep.report import tables
from lockstep.report.data import ReportData


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def render_markdown(data: ReportData, image_paths: dict[str, str]) -> str:
    """`image_paths`: case -> path of its PNG relative to the report."""
    incomplete = tables.incomplete_line(data)
    interrupted = tables.interrupted_line(data)
    parts = [f"# lockstep report: {data.run_dir.name}", "", *([f"**{incomplete}**", ""] if incomplete else []),
             *([f"**{interrupted}**", ""] if interrupted else []),
             f"**{tables.overall_line(data)}**", ""]
    # A heading only above a table with rows: an empty one would say something was compared.
    verdicts, resumes, throughput = tables.verdict_rows(data), tables.resume_rows(data), tables.throughput_rows(data)
    if verdicts:
        parts += ["## Verdicts", "", _table(tables.VERDICT_HEADER, verdicts), ""]
    if resumes:
        parts += ["## Resumes", "", tables.RESUME_NOTE, "", _table(tables.RESUME_HEADER, resumes), ""]
    if twins := tables.twin_rows(data):
        parts += ["## Recompute twins", "", tables.TWIN_NOTE, "", _table(tables.TWIN_HEADER, twins), ""]
    if throughput:
        parts += ["## Throughput", "", tables.THROUGHPUT_NOTE, "", _table(tables.THROUGHPUT_HEADER, throughput), ""]
    certificates = tables.certificate_rows(data)
    if certificates:
        parts += ["## Step-1 certificates", "", tables.CERTIFICATE_NOTE, "",
                  _table(tables.CERTIFICATE_HEADER, certificates), ""]
    if data.timing:
        parts += ["## Where the time went", "", tables.timing_note(data), "",
                  _table(tables.TIMING_HEADER, tables.timing_rows(data)), ""]
    problems = tables.problem_lines(data)
    if problems:
        parts += ["## Problems", ""] + [f"- {p}" for p in problems] + [""]
    skipped = tables.skipped_lines(data)
    if skipped:
        parts += ["## Skipped (expected, with the reason)", ""] + [f"- {line}" for line in skipped] + [""]
    parts += ["## Cases", ""]
    for case in data.cases:
        parts += [f"### {case}", ""]
        if case in image_paths:
            parts += [f"![{case}: loss, |Δloss| and tok/s]({image_paths[case]})", ""]
        else:
            parts += [f"not run: {data.not_compared_reason(case)}", ""]
    parts += ["## Run metadata", "", _table(tables.METADATA_HEADER, tables.metadata_rows(data)), "",
              _table(tables.FRAMEWORK_HEADER, tables.framework_rows(data)), "",
              # Invisible when rendered; how a later run into this directory knows the file for lockstep's.
              f"<!-- written by lockstep ({REPORT_MARK}) -->", ""]
    return "\n".join(parts)
