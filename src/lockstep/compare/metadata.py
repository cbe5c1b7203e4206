"""The run's metadata as its records state it (versions, device, commit), for summary.json and
the report."""

from __future__ import annotations

import os
from pathlib import Path

from lockstep.compare.pairing import collect_cases
from lockstep.errors import LockstepError
from lockstep.formats.run_record import read_run_record

# Keys of a record's meta that describe the run rather than the case.
RUN_KEYS = ("lockstep_version", "lockstep_commit", "device", "device_name", "host", "torch_version",
            "python_version", "corpus", "checkpoint", "checkpoint_sha256", "data", "data_sha256")
FRAMEWORK_KEYS = ("framework_version", "device_name", "torch_version", "started_at", "finished_at")


def framework_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """The framework directories of a run dir: subdirectories holding case files."""
    run_dir = Path(run_dir)
    out = []
    for d in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        if d.name.startswith((".", "build")) or d.name == "report_files":
            continue
        try:
            tree = collect_cases(d)
        except LockstepError:
            continue
        if tree.cases:
            out.append(d)
    return out


def collect_run_metadata(run_dir: str | os.PathLike) -> dict:
    """One value per run-level key where the records agree (a list of the distinct values where
    they do not), and per framework its version, device and times, from the first record found."""
    values: dict[str, list] = {k: [] for k in RUN_KEYS}
    frameworks: dict[str, dict] = {}
    for fw_dir in framework_dirs(run_dir):
        tree = collect_cases(fw_dir)
        for case_file in sorted(tree.files.values(), key=lambda f: f.case):
            if not case_file.is_record:
                continue
            try:
                rec = read_run_record(case_file.path)
            except LockstepError:
                continue
            for k in RUN_KEYS:
                v = rec.meta.get(k)
                if v not in (None, "") and v not in values[k]:
                    values[k].append(v)
            fw = frameworks.setdefault(fw_dir.name, {})
            for k in FRAMEWORK_KEYS:
                if rec.meta.get(k) not in (None, "") and k not in fw:
                    fw[k] = rec.meta[k]
        frameworks.setdefault(fw_dir.name, {})
    run = {k: (v[0] if len(v) == 1 else v) for k, v in values.items() if v}
    return {**run, "frameworks": frameworks}
