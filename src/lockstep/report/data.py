"""Everything a report shows, gathered once from a run directory: every framework's records per
case, the verdicts of each framework against the baseline, and the run's metadata."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.compare import SUMMARY_NAME, CompareOptions, ComparisonReport, collect_run_metadata, framework_dirs
from lockstep.compare.loading import load_side
from lockstep.compare.pairing import collect_cases
from lockstep.formats.run_manifest import read_manifest, skipped_pairs, timing_of
from lockstep.compare.run_dir import compare_frameworks_in_run
from lockstep.compare.verdict import CaseVerdict
from lockstep.errors import FormatError, LockstepError
from lockstep.formats.run_record import RunRecord
from lockstep.fsutil import read_text


@dataclass
class ReportData:
    run_dir: Path
    baseline: str
    frameworks: list[str]  # baseline first
    records: dict[str, dict[str, RunRecord]] = field(default_factory=dict)  # case -> framework -> record
    unreadable: dict[str, dict[str, str]] = field(default_factory=dict)  # case -> framework -> error
    comparisons: dict[str, ComparisonReport] = field(default_factory=dict)  # test framework -> report
    metadata: dict = field(default_factory=dict)
    options: CompareOptions = field(default_factory=CompareOptions)
    skipped: dict[str, dict[str, str]] = field(default_factory=dict)  # framework -> case -> reason (run.json)
    problems: list[str] = field(default_factory=list)  # run-level problems (e.g. an unreadable run.json)
    timing: dict | None = None  # run.json's "timing": where the run's wall time went
    # The run's own verdict lines (lockstep run's last lines; run.json's "verdict_lines"): the
    # report's overall line is their first, so the report and the terminal count alike.
    run_lines: list[str] | None = None
    resumes: list[dict] = field(default_factory=list)  # summary.json's "resumes" (compare/resume.py)
    twins: list[dict] = field(default_factory=list)  # summary.json's "twins" (compare/twins.py)

    @functools.cached_property
    def unfinished(self) -> str | None:
        """How a run that did not end well stands, by run.json: "interrupted" (stopped by a signal it
        caught), "running" (its process is alive), "killed" (run.json still says running, but its
        process is gone: SIGKILL, out of memory, a lost machine); None for a run that ended."""
        return unfinished_state(read_manifest(self.run_dir))

    @functools.cached_property
    def interrupted(self) -> dict[str, list[str]]:
        """framework -> the cases of a run stopped by a signal that have no record: they never finished."""
        return interrupted_pairs(self.run_dir, self)

    @property
    def cases(self) -> list[str]:
        skipped = {c for by_case in self.skipped.values() for c in by_case}
        stopped = {c for cases in self.interrupted.values() for c in cases}
        return sorted(set(self.records) | set(self.unreadable) | skipped | stopped)

    def skip_reasons(self, case: str) -> dict[str, str]:
        """framework -> why `lockstep run` skipped this case on it."""
        order = self.frameworks + sorted(set(self.skipped) - set(self.frameworks))
        return {fw: self.skipped[fw][case] for fw in order if case in self.skipped.get(fw, {})}

    def not_compared_reason(self, case: str) -> str:
        """Why no framework was compared with the baseline on this case, in a few words."""
        reasons = [f"{fw} skipped ({why})" for fw, why in self.skip_reasons(case).items()]
        reasons += [f"{fw} unreadable" for fw in self.unreadable.get(case, {})]
        how = {"running": "has not finished it yet", "killed": "did not finish"}.get(self.unfinished or "",
                                                                                   "interrupted before it finished")
        reasons += [f"{fw} {how}" for fw, cases in self.interrupted.items() if case in cases]
        if not reasons:
            ran = sorted(self.records.get(case, {}))
            reasons = [f"only {', '.join(ran)} ran it" if ran else "no framework ran it"]
        return "; ".join(reasons)

    def verdicts(self, case: str) -> dict[str, CaseVerdict]:
        """Test framework -> verdict on this case against the baseline."""
        out = {}
        for fw, report in self.comparisons.items():
            for v in report.cases:
                if v.case == case:
                    out[fw] = v
        return out

    def unreadable_files(self) -> list[str]:
        """One sentence per file (or directory) of the run that could not be read or is not a
        lockstep record, each naming it: what the report had to leave out."""
        lines = list(self.problems)
        for case, by_fw in sorted(self.unreadable.items()):
            lines += list(by_fw.values())
        return lines

    @property
    def passed(self) -> bool | None:
        judged = [r for r in self.comparisons.values() if r.judged]
        if not judged:
            return None
        return all(r.passed for r in judged)


def _pid_alive(pid) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: asks whether the process exists, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, run by another user
    return True


def unfinished_state(manifest: dict) -> str | None:
    """"interrupted", "running", "killed" or None: see ReportData.unfinished."""
    status = manifest.get("status")
    if status == "interrupted":
        return "interrupted"
    if status == "running":
        return "running" if _pid_alive(manifest.get("pid")) else "killed"
    return None


def interrupted_pairs(run_dir: Path, data: "ReportData") -> dict[str, list[str]]:
    """For a run that did not end (interrupted, killed or still running): framework -> the cases it
    planned that have no record (and were neither skipped nor unreadable): the case that was stopped
    and those that never started. Empty for a run that ended."""
    manifest = read_manifest(run_dir)
    if unfinished_state(manifest) is None:
        return {}
    cases = [c.get("name") for c in manifest.get("cases", []) if isinstance(c, dict) and isinstance(c.get("name"), str)]
    out: dict[str, list[str]] = {}
    for fw in [f for f in manifest.get("frameworks", []) if isinstance(f, str)]:
        missing = [c for c in cases if fw not in data.records.get(c, {}) and fw not in data.unreadable.get(c, {})
                   and c not in data.skipped.get(fw, {})]
        if missing:
            out[fw] = missing
    return out


def gather(run_dir: str | Path, baseline_framework: str = "pytorch",
           options: CompareOptions | None = None,
           comparisons: dict[str, ComparisonReport] | None = None, files=None) -> ReportData:
    """What the report shows. `comparisons`: each test framework's comparison as the run already
    made it (lockstep run compares once); without it, the records are compared here."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FormatError(run_dir, "is not a run directory")
    options = options or CompareOptions()
    present = [d.name for d in framework_dirs(run_dir)]
    if not present:
        raise FormatError(run_dir, "holds no framework directories with case files (<framework>/<case>.jsonl)")
    if baseline_framework not in present:
        raise FormatError(run_dir, f"has no case files for the baseline framework {baseline_framework} "
                                   f"(frameworks present: {', '.join(present)}); choose one with --baseline")
    frameworks = [baseline_framework] + [f for f in present if f != baseline_framework]
    data = ReportData(run_dir, baseline_framework, frameworks, metadata=collect_run_metadata(run_dir, files),
                      options=options)
    try:
        data.skipped = skipped_pairs(run_dir)
    except LockstepError as e:
        data.problems.append(str(e))
    data.timing = timing_of(run_dir)
    manifest = read_manifest(run_dir)
    lines = manifest.get("verdict_lines")
    if manifest.get("baseline") == baseline_framework and isinstance(lines, list) and lines and \
            all(isinstance(line, str) for line in lines):
        data.run_lines = lines  # the run's own verdict (against another --baseline it is not)
    sections = summary_sections(run_dir, ("resumes", "twins"), data.problems)
    data.resumes, data.twins = sections["resumes"], sections["twins"]
    for fw in frameworks:
        tree = collect_cases(run_dir / fw)
        data.problems += tree.unreadable
        for case, case_file in tree.files.items():
            side = load_side(case_file, options, files)
            if side.record is not None:
                data.records.setdefault(case, {})[fw] = side.record
            else:
                data.unreadable.setdefault(case, {})[fw] = side.error or "unreadable"
        for case, paths in tree.conflicts.items():
            data.unreadable.setdefault(case, {})[fw] = (f"{run_dir / fw}: {len(paths)} files for the case {case}: "
                                                        f"{', '.join(map(str, paths))}")
        if fw != baseline_framework:
            data.comparisons[fw] = (comparisons[fw] if comparisons is not None and fw in comparisons else
                                    compare_frameworks_in_run(run_dir, baseline_framework, fw, options))
    return data


def summary_sections(run_dir: Path, keys: tuple[str, ...], problems: list[str]) -> dict[str, list[dict]]:
    """summary.json's per-framework verdict lists by key ("resumes": compare/resume.py, "twins":
    compare/twins.py), each [] when the run wrote no summary or judged none. An unreadable summary
    is a problem of the report."""
    empty: dict[str, list[dict]] = {k: [] for k in keys}
    path = run_dir / SUMMARY_NAME
    if not path.is_file():
        return empty
    try:
        doc = json.loads(read_text(path, "run summary"))
    except (LockstepError, ValueError) as e:
        problems.append(f"{path}: cannot be read ({e}); its resume and recompute verdicts are left out")
        return empty
    for key in keys:
        entries = doc.get(key) if isinstance(doc, dict) else None
        empty[key] = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    return empty
