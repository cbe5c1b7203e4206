"""`compare_paths`: every case of a baseline tree against the same case of a test tree."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.compare.loading import load_side
from lockstep.compare.options import CompareOptions
from lockstep.compare.policy import VerdictClass, comparison_passes
from lockstep.compare.pairing import (CasePair, CaseTree, bare_case_name, collect_cases, pair_single_files,
                                      skipped_cases)
from lockstep.errors import LockstepError
from lockstep.compare.verdict import CaseVerdict, judge_case


@dataclass(frozen=True)
class MissingCase:
    case: str
    missing_from: str  # "baseline" | "test"
    present_in: str  # the file the other side has

    @property
    def message(self) -> str:
        return f"case {self.case} is only in the {'test' if self.missing_from == 'baseline' else 'baseline'} ({self.present_in})"

    def to_json(self) -> dict:
        return {"case": self.case, "missing_from": self.missing_from, "present_in": self.present_in,
                "message": self.message}


@dataclass(frozen=True)
class ComparisonError:
    """A problem that stops one case (or the whole comparison) from being judged."""

    message: str  # one sentence naming the file
    case: str | None = None

    def to_json(self) -> dict:
        return {"case": self.case, "message": self.message}


@dataclass
class ComparisonReport:
    baseline: str
    test: str
    options: CompareOptions
    cases: list[CaseVerdict] = field(default_factory=list)
    missing: list[MissingCase] = field(default_factory=list)
    errors: list[ComparisonError] = field(default_factory=list)
    # case -> reason, for cases `lockstep run` skipped on one side (not missing: it said so up front)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def judged(self) -> bool:
        """Whether there is any verdict at all (False when every case was skipped on one side)."""
        return bool(self.cases or self.missing or self.errors)

    @property
    def passed(self) -> bool:
        """True only when something was compared, every compared case passed, nothing is missing."""
        return comparison_passes(self.cases, self.missing, self.errors)

    @property
    def counts(self) -> dict[str, int]:
        return {"passed": sum(c.passed for c in self.cases),
                "failed": sum(c.verdict.judged and c.error is None and c.not_comparable is None and not c.passed
                              for c in self.cases),
                "not_comparable": sum(c.not_comparable is not None and c.error is None for c in self.cases),
                "speed_only": sum(c.verdict is VerdictClass.SPEED_ONLY for c in self.cases),
                "missing": len(self.missing),
                "errors": len(self.errors),
                "skipped": len(self.skipped)}

    @property
    def classes(self) -> dict[str, int]:
        """How many cases the verdict policy put in each class."""
        return {c.value: sum(v.verdict is c for v in self.cases) for c in VerdictClass}

    def summary_line(self) -> str:
        n = self.counts
        line = f"{n['passed']} passed, {n['failed']} failed, {n['missing']} missing, {n['errors']} errors"
        line += f", {n['not_comparable']} not comparable" if n["not_comparable"] else ""
        line += f", {n['speed_only']} speed only (a speed anchor's loss is not judged)" if n["speed_only"] else ""
        return line + (f", {n['skipped']} skipped" if n["skipped"] else "")

    def to_json(self) -> dict:
        return {"passed": self.passed, "baseline": self.baseline, "test": self.test, "counts": self.counts, "classes": self.classes,
                "options": self.options.to_dict(),
                "cases": [c.to_json() for c in self.cases],
                "missing": [m.to_json() for m in self.missing],
                "errors": [e.to_json() for e in self.errors],
                "skipped": [{"case": c, "reason": r} for c, r in sorted(self.skipped.items())]}


def _check_include_cases(names: set[str], baseline: Path, test: Path, options: CompareOptions,
                         report: ComparisonReport) -> None:
    """A name given to --include-cases that neither side has is a typo, never a silent pass."""
    for name in options.include_cases:
        if name not in names:
            report.errors.append(ComparisonError(f"case {name} (--include-cases) is in neither {baseline} nor {test}",
                                                 case=name))


def _is_single_file(path: Path) -> bool:
    return path.exists() and not path.is_dir()


def _pairs(baseline: Path, test: Path, options: CompareOptions, report: ComparisonReport) -> list[CasePair]:
    if _is_single_file(baseline) and _is_single_file(test):
        _check_include_cases({baseline.stem, test.stem}, baseline, test, options, report)
        return [] if report.errors else [pair_single_files(baseline, test)]
    b_tree, t_tree = collect_cases(baseline), collect_cases(test)
    for tree in (b_tree, t_tree):
        report.errors += [ComparisonError(msg) for msg in tree.unreadable]
    if b_tree.is_run_dir != t_tree.is_run_dir:
        run, other = (b_tree, t_tree) if b_tree.is_run_dir else (t_tree, b_tree)
        fws = sorted({c.split("/", 1)[0] for c in run.cases})
        report.errors.append(ComparisonError(
            f"{run.root} is a lockstep run directory (frameworks: {', '.join(fws) or 'none'}) but {other.root} is not; "
            f"compare two run directories, or one framework directory ({run.root}/{fws[0] if fws else '<framework>'}) "
            f"with {other.root}"))
        return []
    skipped: dict[str, str] = {}
    for tree in (b_tree, t_tree):
        try:
            skipped.update(skipped_cases(tree))
        except LockstepError as e:
            report.errors.append(ComparisonError(str(e)))
    # A single file against a tree: the user asked about that one case only.
    only = {baseline.stem} if _is_single_file(baseline) else {test.stem} if _is_single_file(test) else None
    for side, tree in (("baseline", b_tree), ("test", t_tree)):
        if not tree.cases and not skipped:
            report.errors.append(ComparisonError(
                f"{tree.root}: no case files (<case>.jsonl or <case>.log) found for the {side}"))
    if report.errors:
        return []

    def wanted(case: str) -> bool:
        return options.includes(bare_case_name(case)) and (only is None or case in only)

    present = b_tree.cases | t_tree.cases
    _check_include_cases({bare_case_name(c) for c in present | set(skipped)}, baseline, test, options, report)
    # Cases `lockstep run` skipped are reported with the reason, whether one side or both lack them.
    report.skipped = {c: r for c, r in skipped.items()
                      if wanted(c) and not (c in b_tree.cases and c in t_tree.cases)}
    compared = sorted(c for c in present if wanted(c) and c not in report.skipped)
    if not compared and not report.skipped and not report.errors:
        report.errors.append(ComparisonError(f"no case of {baseline} or {test} matches the case filters"))
    pairs = []
    for case in compared:
        if _conflict(case, b_tree, report) | _conflict(case, t_tree, report):
            continue
        b, t = b_tree.files.get(case), t_tree.files.get(case)
        if b is None:
            report.missing.append(MissingCase(case, "baseline", str(t.path)))
        elif t is None:
            report.missing.append(MissingCase(case, "test", str(b.path)))
        else:
            pairs.append(CasePair(case, b, t))
    return pairs


def _conflict(case: str, tree: CaseTree, report: ComparisonReport) -> bool:
    paths = tree.conflicts.get(case)
    if paths:
        report.errors.append(ComparisonError(
            f"{tree.root}: case {case} has {len(paths)} files ({', '.join(map(str, paths))}); "
            "keep one per tree or point at the framework directory", case=case))
    return bool(paths)


def compare_paths(baseline: str | os.PathLike, test: str | os.PathLike,
                  options: CompareOptions | None = None, files=None) -> ComparisonReport:
    """Compare every case of `baseline` (a run record, a log, or a tree of them) with `test`.

    Bad inputs never raise: each becomes an error entry naming the file, so that one broken log
    does not hide the verdicts on the others. Raises FormatError only when a path does not exist.
    """
    options = options or CompareOptions()
    baseline, test = Path(baseline), Path(test)
    report = ComparisonReport(str(baseline), str(test), options)
    for case_pair in _pairs(baseline, test, options, report):
        verdict = judge_case(case_pair.case, load_side(case_pair.baseline, options, files),
                             load_side(case_pair.test, options, files), options)
        report.cases.append(verdict)
        if verdict.error is not None:
            report.errors.append(ComparisonError(verdict.error, case=verdict.case))
    return report
