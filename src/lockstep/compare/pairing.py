"""Which file holds which case: collect `<case>.jsonl` / `<case>.log` from a run dir, a framework
dir or a single file, and pair the baseline's cases with the test's.

Rules (docs/reference/logs.md): in one directory `<case>.jsonl` (lockstep's record) wins over
`<case>.log` (the native log it came with); files named `build*`, `ctest_*`, `*_profile.log`,
`run_metadata.log` are not case logs; two case files of the same name elsewhere in one tree
are an error, since it cannot be known which one the user meant.

A lockstep run directory (it holds `run.json`) is read framework by framework: its cases are
named `<framework>/<case>`, so `compare RUN_A RUN_B` pairs each framework's case with the same
framework's case of the other run (the same case under `pytorch/` and `megatron/` is no conflict).
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.errors import FormatError
from lockstep.formats.run_manifest import RUN_MANIFEST, skipped_pairs
from lockstep.formats.run_record import CASE_OUT_SUFFIX
from lockstep.fsutil import MOVED_ASIDE_MARK, os_problem

CASE_SUFFIXES = (".jsonl", ".log")
# Names that are never case files (build logs, CTest logs, profiler output, run metadata, our own
# output, and what `lockstep run --force` moved out of its way: someone else's, never this run's).
IGNORED_FILE_PATTERNS = ("build*", "ctest_*", "*_profile.log", "run_metadata.*", ".*", f"*{MOVED_ASIDE_MARK}*")
# Directories of a run dir that hold no framework's records: <out>/step1/<framework>/<case>.npz, the
# captures the step-1 certificates are made from; <out>/evidence/<case>.fp64.jsonl, the policy's
# FP64 reference runs; diagnose/, `lockstep diagnose`'s outputs.
STEP1_DIR, EVIDENCE_DIR, DIAGNOSE_DIR = "step1", "evidence", "diagnose"
# `lockstep run --repeat N` writes repeats 2..N under repeats/<k>/<framework>/ (determinism.py).
REPEATS_DIR = "repeats"
IGNORED_DIR_PATTERNS = ("build*", "report_files", ".*", "__pycache__", f"*{MOVED_ASIDE_MARK}*", STEP1_DIR, EVIDENCE_DIR,
                        DIAGNOSE_DIR, f"*{CASE_OUT_SUFFIX}")


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
    is_run_dir: bool = False  # case names are then `<framework>/<case>`
    unreadable: list[str] = field(default_factory=list)  # directories that could not be listed

    @property
    def cases(self) -> set[str]:
        return set(self.files) | set(self.conflicts)


def is_case_file_name(name: str) -> bool:
    return name.endswith(CASE_SUFFIXES) and not any(fnmatch.fnmatch(name, p) for p in IGNORED_FILE_PATTERNS)


def is_run_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / RUN_MANIFEST).is_file()


def bare_case_name(case: str) -> str:
    """`megatron/gpt2_1` (a case of a run directory) -> `gpt2_1`."""
    return case.rsplit("/", 1)[-1]


def collect_cases(path: str | os.PathLike) -> CaseTree:
    """Every case file under `path` (a file, a framework dir, a run dir, or a tree of them)."""
    root = Path(path)
    if root.exists() and not root.is_dir():
        # A single file named by the user is read whatever its name: they chose it. (Reading it
        # says what is wrong when it is no regular file.)
        return CaseTree(root, {root.stem: CaseFile(root.stem, root)})
    if not root.is_dir():
        raise FormatError(root, "no such file or directory")
    if is_run_dir(root):
        tree = CaseTree(root, is_run_dir=True)
        for fw_dir, label in _run_dir_framework_dirs(root):
            sub = _walk(fw_dir, CaseTree(fw_dir))
            tree.files.update({f"{label}/{c}": CaseFile(f"{label}/{c}", f.path) for c, f in sub.files.items()})
            tree.conflicts.update({f"{label}/{c}": paths for c, paths in sub.conflicts.items()})
            tree.unreadable += sub.unreadable
        return tree
    return _walk(root, CaseTree(root))


def _run_dir_framework_dirs(root: Path) -> list[tuple[Path, str]]:
    """(directory, how its cases are named) for every framework directory of a run dir; with
    `--repeat N`, repeat k's (`repeats/<k>/<framework>/`) are named `repeats/<k>/<framework>`, so
    that each repeat of a case is paired with the same repeat of the other run, never taken for a
    second file of the case."""
    out = [(p, p.name) for p in sorted(root.iterdir()) if p.is_dir() and not _ignored_dir(p.name)
           and p.name != REPEATS_DIR]
    repeats = root / REPEATS_DIR
    if repeats.is_dir() and not repeats.is_symlink():
        for k in sorted((p for p in repeats.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)):
            out += [(p, f"{REPEATS_DIR}/{k.name}/{p.name}") for p in sorted(k.iterdir())
                    if p.is_dir() and not _ignored_dir(p.name)]
    return out


def _ignored_dir(name: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in IGNORED_DIR_PATTERNS)


def _walk(root: Path, tree: CaseTree) -> CaseTree:
    found: dict[str, list[Path]] = {}
    def unreadable(e: OSError) -> None:
        tree.unreadable.append(f"{e.filename}: cannot list the directory: {os_problem(e)}")

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        dirnames[:] = sorted(d for d in dirnames if not _ignored_dir(d))
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


def skipped_cases(tree: CaseTree) -> dict[str, str]:
    """Case (named as `tree` names it) -> reason, for the pairs `lockstep run` skipped: from the
    run dir's own run.json, or for a framework dir from its parent's."""
    if tree.is_run_dir:
        return {f"{fw}/{case}": reason for fw, cases in skipped_pairs(tree.root).items()
                for case, reason in cases.items()}
    if tree.root.is_dir() and is_run_dir(tree.root.parent):
        return skipped_pairs(tree.root.parent).get(tree.root.name, {})
    return {}


@dataclass(frozen=True)
class CasePair:
    case: str
    baseline: CaseFile
    test: CaseFile


def pair_single_files(baseline: Path, test: Path) -> CasePair:
    """Two files named directly are one comparison, whatever their names."""
    case = baseline.stem if baseline.stem == test.stem else f"{baseline.stem} vs {test.stem}"
    return CasePair(case, CaseFile(baseline.stem, baseline), CaseFile(test.stem, test))
