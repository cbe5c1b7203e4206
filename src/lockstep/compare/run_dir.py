"""`compare_run_dir`: the verdicts at the end of `lockstep run`, written to `<run_dir>/summary.json`."""

from __future__ import annotations

import json
import os
from pathlib import Path

from lockstep.compare.comparison import compare_paths
from lockstep.compare.metadata import collect_run_metadata, framework_dirs
from lockstep.compare.options import CompareOptions
from lockstep.errors import FormatError
from lockstep.fsutil import atomic_write

SUMMARY_NAME = "summary.json"


def compare_run_dir(run_dir: str | os.PathLike, baseline_framework: str = "pytorch",
                    options: CompareOptions | None = None) -> dict:
    """Compare every framework dir of `run_dir` with `<run_dir>/<baseline_framework>`; write and
    return the summary. `passed` is None when there was nothing to compare (one framework)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FormatError(run_dir, "is not a run directory")
    options = options or CompareOptions()
    present = [d.name for d in framework_dirs(run_dir)]
    summary: dict = {"run_dir": str(run_dir), "baseline": baseline_framework, "frameworks": present,
                     "passed": None, "comparisons": [], "errors": [],
                     "metadata": collect_run_metadata(run_dir)}
    baseline_dir = run_dir / baseline_framework
    others = [name for name in present if name != baseline_framework]
    if baseline_framework not in present:
        if others:
            summary["errors"].append(f"{baseline_dir}: the baseline framework {baseline_framework} has no case files")
            summary["passed"] = False
    else:
        for name in others:
            report = compare_paths(baseline_dir, run_dir / name, options)
            summary["comparisons"].append({"baseline_framework": baseline_framework, "test_framework": name,
                                           **report.to_json()})
        if summary["comparisons"]:
            summary["passed"] = all(c["passed"] for c in summary["comparisons"])
    with atomic_write(run_dir / SUMMARY_NAME, "w") as f:
        json.dump(summary, f, indent=2, allow_nan=True)
        f.write("\n")
    return summary
