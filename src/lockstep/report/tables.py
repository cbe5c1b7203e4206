"""The report's tables as plain rows (header + rows of strings), shared by the HTML and Markdown
writers so both show the same numbers."""

from __future__ import annotations

from lockstep.cases.spec import dtype_of_case_name
from lockstep.compare.metadata import model_label
from lockstep.report.data import ReportData


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


VERDICT_HEADER = ["test framework", "case", "dtype", "config", "steps", "max |Δloss|", "step of max", "threshold",
                  "verdict", "baseline tok/s", "test tok/s", "test/baseline", "notes"]


def verdict_rows(data: ReportData) -> list[list[str]]:
    rows = []
    for fw, report in data.comparisons.items():
        for c in report.cases:
            verdict = "ERROR" if c.error else "PASS" if c.passed else "FAIL"
            notes = "; ".join(([c.error] if c.error else []) + c.notes)
            rows.append([fw, c.case, c.dtype or "-", c.config or "-", str(len(c.diffs)) if c.diffs else "-",
                         _num(c.max_abs_diff, ".3e"), _num(c.max_diff_step, "d"), _num(c.threshold, ".0e"), verdict,
                         _num(c.baseline.tokens_per_s_mean, ",.0f"), _num(c.test.tokens_per_s_mean, ",.0f"),
                         _num(c.throughput_ratio, ".3f"), notes])
        for case, reason in sorted(report.skipped.items()):
            rows.append([fw, case, dtype_of_case_name(case), "-", "-", "-", "-", "-", "SKIPPED", "-", "-", "-", reason])
    return rows


def skipped_lines(data: ReportData) -> list[str]:
    """The pairs `lockstep run` skipped on purpose, with the reason: expected, not problems."""
    return [f"{fw} / {case}: skipped ({reason})"
            for fw in data.frameworks + sorted(set(data.skipped) - set(data.frameworks))
            for case, reason in sorted(data.skipped.get(fw, {}).items())]


def problem_lines(data: ReportData) -> list[str]:
    """Missing cases and unreadable files, one sentence each (skipped pairs are not problems)."""
    lines = list(data.problems)
    for fw, report in data.comparisons.items():
        lines += [f"{fw}: {m.message}" for m in report.missing]
        lines += [f"{fw}: {e.message}" for e in report.errors if e.case is None]
    for case, by_fw in sorted(data.unreadable.items()):
        lines += [f"{fw}/{case}: {err}" for fw, err in by_fw.items()]
    return lines


METADATA_HEADER = ["key", "value"]


def metadata_rows(data: ReportData) -> list[list[str]]:
    return [[k, model_label(v) if k == "model" else str(v)] for k, v in data.metadata.items() if k != "frameworks"]


FRAMEWORK_HEADER = ["framework", "version", "device", "torch", "started", "finished"]


def framework_rows(data: ReportData) -> list[list[str]]:
    rows = []
    for fw in data.frameworks:
        m = data.metadata.get("frameworks", {}).get(fw, {})
        rows.append([fw + (" (baseline)" if fw == data.baseline else ""), str(m.get("framework_version", "-")),
                     str(m.get("device_name", "-")), str(m.get("torch_version", "-")),
                     str(m.get("started_at", "-")), str(m.get("finished_at", "-"))])
    return rows


def overall_line(data: ReportData) -> str:
    if data.passed is None:
        return f"Nothing ran on both {data.baseline} and another framework: nothing to compare."
    counts = {"passed": 0, "failed": 0, "missing": 0, "errors": 0, "skipped": 0}
    for report in data.comparisons.values():
        for k, v in report.counts.items():
            counts[k] += v
    word = "PASS" if data.passed else "FAIL"
    skipped = f", {counts['skipped']} skipped" if counts["skipped"] else ""
    return (f"{word}: {counts['passed']} passed, {counts['failed']} failed, {counts['missing']} missing, "
            f"{counts['errors']} errors{skipped} (against baseline {data.baseline})")
