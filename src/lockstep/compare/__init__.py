"""Step-by-step comparison of runs (docs/reference/comparison.md).

pairing: which file is which case · loading: one side into a checked record · verdict: one
case's loss and throughput verdict · comparison: a whole baseline tree against a test tree ·
run_dir: the summary of a `lockstep run` · metadata: versions, device, commit from the records.
"""

from lockstep.compare.comparison import ComparisonError, ComparisonReport, MissingCase, compare_paths
from lockstep.compare.metadata import collect_run_metadata, framework_dirs
from lockstep.compare.options import CompareOptions
from lockstep.compare.run_dir import SUMMARY_NAME, compare_run_dir
from lockstep.compare.verdict import CaseVerdict, StepDiff

__all__ = ["CaseVerdict", "CompareOptions", "ComparisonError", "ComparisonReport", "MissingCase", "StepDiff",
           "SUMMARY_NAME", "collect_run_metadata", "compare_paths", "compare_run_dir", "framework_dirs"]
