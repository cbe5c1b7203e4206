"""`compare_run_dir`: the verdicts at the end of `lockstep run`, written to `<run_dir>/summary.json`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.compare.comparison import ComparisonReport, compare_paths
from lockstep.compare.metadata import collect_run_metadata, framework_dirs
from lockstep.compare.options import CompareOptions
from lockstep.errors import FormatError
from lockstep.fsutil import atomic_write

SUMMARY_NAME = "summary.json"


@dataclass
class RunComparison:
    """A run directory compared: the summary (as summary.json holds it) and each test framework's
    ComparisonReport (what the report renders), made by one pass over the records."""

    summary: dict
    reports: dict[str, ComparisonReport] = field(default_factory=dict)


def compare_run_dir(run_dir: str | os.PathLike, baseline_framework: str = "pytorch",
                    options: CompareOptions | None = None) -> dict:
    """Compare every framework dir of `run_dir` with `<run_dir>/<baseline_framework>`; write and
    return the summary. `passed` is None when there was nothing to compare (one framework)."""
    return compare_run(run_dir, baseline_framework, options).summary


def compare_run(run_dir: str | os.PathLike, baseline_framework: str = "pytorch",
                options: CompareOptions | None = None, write: bool = True, files=None) -> RunComparison:
    """`compare_run_dir`, keeping each framework's ComparisonReport beside the summary. `write`
    False leaves summary.json to the caller (`lockstep run` writes it once, with every section);
    `files` (formats.logs.ParsedRuns) parses each record once across the run's stages."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FormatError(run_dir, "is not a run directory")
    options = options or CompareOptions()
    present = [d.name for d in framework_dirs(run_dir)]
    summary: dict = {"run_dir": str(run_dir), "baseline": baseline_framework, "frameworks": present,
                     "passed": None, "comparisons": [], "errors": [],
                     "metadata": collect_run_metadata(run_dir, files)}
    reports: dict[str, ComparisonReport] = {}
    baseline_dir = run_dir / baseline_framework
    others = [name for name in present if name != baseline_framework]
    if baseline_framework not in present:
        if others:
            summary["errors"].append(f"{baseline_dir}: the baseline framework {baseline_framework} has no case files")
            summary["passed"] = False
    else:
        for name in others:
            report = reports[name] = compare_frameworks_in_run(run_dir, baseline_framework, name, options, files)
            entry = {"baseline_framework": baseline_framework, "test_framework": name, **report.to_json()}
            if not report.judged:
                entry["passed"] = None  # nothing ran on both sides: no verdict either way
            summary["comparisons"].append(entry)
        verdicts = [c["passed"] for c in summary["comparisons"] if c["passed"] is not None]
        if verdicts:
            summary["passed"] = all(verdicts)
    if write:
        write_summary(run_dir, summary)
    return RunComparison(summary, reports)


def write_summary(run_dir: str | os.PathLike, summary: dict) -> Path:
    path = Path(run_dir) / SUMMARY_NAME
    with atomic_write(path, "w", what="run summary") as f:
        json.dump(summary, f, indent=2, allow_nan=True)
        f.write("\n")
    return path


def compare_frameworks_in_run(run_dir: str | os.PathLike, baseline_framework: str, test_framework: str,
                              options: CompareOptions, files=None) -> ComparisonReport:
    """One framework of a run against the baseline. A case that `lockstep run` skipped on either
    side (listed with its reason in run.json) is reported as skipped, not missing: the run said
    so before it started (compare_paths reads run.json beside framework directories)."""
    run_dir = Path(run_dir)
    return compare_paths(run_dir / baseline_framework, run_dir / test_framework, options, files)
