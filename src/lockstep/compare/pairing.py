"""Which file holds which case: collect `<case>.jsonl` / `<case>.log` from a run dir, a framework
dir or a single file, and pair the baseline's cases with the test's.

Rules (SPEC section 6): in one directory `<case>.jsonl` (lockstep's record) wins over
`<case>.log` (the native log it came with); files named `build*`, `ctest_*`, `*_profile.log`,
`run_metadata.log` are not case logs; two case files of the same name elsewhere in one tree
are an error, since it cannot be known which one the user meant.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.errors import FormatError

CASE_SUFFIXES = (".jsonl", ".log")
# Names that are never case files (build logs, CTest logs, profiler output, run metadata, our own output).
IGNORED_FILE_PATTERNS = ("build*", "ctest_*", "*_profile.log", "run_metadata.*", ".*")
IGNORED_DIR_PATTERNS = ("build*", "report_files", ".*", "__pycache__")


@dataclass(frozen=True)
class CaseFile:
    case: str
    path: Path

    @property
    def is_record(self) -> bool:
        return self.path.suffix == ".jsonl"


@dataclass
class CaseTree:
    """The case files found under one path; `conflicts` holds case names found twice."""

    root: Path
    files: dict[str, CaseFile] = field(default_factory=dict)
    conflicts: dict[str, list[Path]] = field(default_factory=dict)

    @property
    def cases(self) -> set[str]:
        return set(self.files) | set(self.conflicts)


def is_case_file_name(name: str) -> bool:
    return name.endswith(CASE_SUFFIXES) and not any(fnmatch.fnmatch(name, p) for p in IGNORED_FILE_PATTERNS)


def collect_cases(path: str | os.PathLike) -> CaseTree:
    """Every case file under `path` (a file, a framework dir, or a tree of them)."""
    root = Path(path)
    if root.is_file():
        # A single file named by the user is read whatever its name: they chose it.
        return CaseTree(root, {root.stem: CaseFile(root.stem, root)})
    if not root.is_dir():
        raise FormatError(root, "no such file or directory")
    tree = CaseTree(root)
    found: dict[str, list[Path]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not any(fnmatch.fnmatch(d, p) for p in IGNORED_DIR_PATTERNS))
        names = [n for n in sorted(filenames) if is_case_file_name(n)]
        stems = {n.rsplit(".", 1)[0] for n in names}
        for stem in sorted(stems):
            # The record beats the log of the same run in the same directory.
            chosen = f"{stem}.jsonl" if f"{stem}.jsonl" in names else f"{stem}.log"
            found.setdefault(stem, []).append(Path(dirpath) / chosen)
    for case, paths in sorted(found.items()):
        if len(paths) == 1:
            tree.files[case] = CaseFile(case, paths[0])
        else:
            tree.conflicts[case] = paths
    return tree


@dataclass(frozen=True)
class CasePair:
    case: str
    baseline: CaseFile
    test: CaseFile


def pair_single_files(baseline: Path, test: Path) -> CasePair:
    """Two files named directly are one comparison, whatever their names."""
    case = baseline.stem if baseline.stem == test.stem else f"{baseline.stem} vs {test.stem}"
    return CasePair(case, CaseFile(baseline.stem, baseline), CaseFile(test.stem, test))
