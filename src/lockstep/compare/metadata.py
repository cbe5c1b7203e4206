"""The run's metadata as its records state it (versions, device, commit), for summary.json and
the report."""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

from lockstep.compare.pairing import DIAGNOSE_DIR, EVIDENCE_DIR, STEP1_DIR
from lockstep.compare.pairing import collect_cases
from lockstep.formats.run_manifest import read_manifest as run_manifest
from lockstep.errors import LockstepError
from lockstep.formats.run_record import read_run_record
from lockstep.fsutil import MOVED_ASIDE_MARK

# Keys of a record's meta that describe the run rather than the case.
RUN_KEYS = ("lockstep_version", "lockstep_commit", "device", "device_name", "host", "torch_version",
            "python_version", "corpus", "checkpoint", "checkpoint_sha256", "data", "data_sha256")
FRAMEWORK_KEYS = ("framework_version", "device_name", "torch_version")
# Times span every record: the earliest start and the latest finish.
TIME_KEYS = {"started_at": min, "finished_at": max}


def framework_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """The framework directories of a run dir: subdirectories holding case files."""
    run_dir = Path(run_dir)
    out = []
    for d in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        # repeats/: `lockstep run --repeat`'s extra runs, which only the determinism check reads.
        if (d.name.startswith((".", "build")) or d.name in ("report_files", "repeats", STEP1_DIR, EVIDENCE_DIR, DIAGNOSE_DIR)
                or MOVED_ASIDE_MARK in d.name):
            continue
        try:
            tree = collect_cases(d)
        except LockstepError:
            continue
        if tree.cases:
            out.append(d)
    return out


def _instant(text) -> _dt.datetime | None:
    try:
        t = _dt.datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def _span(times: dict[str, list[str]], key: str, value) -> None:
    if _instant(value) is not None:
        times.setdefault(key, []).append(str(value))


def _pick(key: str, texts: list[str]) -> str:
    return TIME_KEYS[key](texts, key=_instant)


def collect_run_metadata(run_dir: str | os.PathLike, files=None) -> dict:
    """One value per run-level key where the records agree (a list of the distinct values where
    they do not); the model shape (run.json's, else the records'); the run's start and finish
    over all records; per framework its version, device and its own earliest start / latest finish."""
    values: dict[str, list] = {k: [] for k in (*RUN_KEYS, "model")}
    frameworks: dict[str, dict] = {}
    run_times: dict[str, list[str]] = {}
    fw_times: dict[str, dict[str, list[str]]] = {}
    for fw_dir in framework_dirs(run_dir):
        tree = collect_cases(fw_dir)
        for case_file in sorted(tree.files.values(), key=lambda f: f.case):
            if not case_file.is_record:
                continue
            try:
                rec = files.load(case_file.path) if files is not None else read_run_record(case_file.path)
            except LockstepError:
                continue
            for k in RUN_KEYS:
                v = rec.meta.get(k)
                if v not in (None, "") and v not in values[k]:
                    values[k].append(v)
            v = rec.meta.get("model")
            if isinstance(v, dict) and v not in values["model"]:
                values["model"].append(v)
            fw = frameworks.setdefault(fw_dir.name, {})
            for k in FRAMEWORK_KEYS:
                if rec.meta.get(k) not in (None, "") and k not in fw:
                    fw[k] = rec.meta[k]
            for k in TIME_KEYS:
                _span(run_times, k, rec.meta.get(k))
                _span(fw_times.setdefault(fw_dir.name, {}), k, rec.meta.get(k))
        frameworks.setdefault(fw_dir.name, {})
    manifest = run_manifest(run_dir)
    models = manifest.get("models")
    if isinstance(models, list) and models and all(isinstance(m, dict) for m in models):
        values["model"] = models  # what the run was asked to train: names the shapes
    elif isinstance(manifest.get("model"), dict):
        values["model"] = [manifest["model"]]
    run = {k: (v[0] if len(v) == 1 else v) for k, v in values.items() if v}
    run.update({k: _pick(k, texts) for k, texts in run_times.items()})
    for name, times in fw_times.items():
        frameworks[name].update({k: _pick(k, texts) for k, texts in times.items()})
    return {**run, "frameworks": frameworks}


def model_label(model) -> str:
    """`gpt2-tiny (gpt2: L=2 NH=12 C=96 V=50257 maxT=1024)` from run.json's or a record's `model`
    (older run.json files hold the shape without its `name`)."""
    if isinstance(model, list):
        return "; ".join(model_label(m) for m in model)
    if not isinstance(model, dict):
        return str(model)
    dims = " ".join(f"{label}={model[key]}" for key, label in (
        ("num_layers", "L"), ("num_heads", "NH"), ("num_kv_heads", "kv"), ("channels", "C"), ("vocab_size", "V"),
        ("max_seq_len", "maxT")) if key in model)
    family = model.get("family")
    inner = ": ".join(str(x) for x in (family, dims) if x)
    name = model.get("name")
    return f"{name} ({inner})" if name and inner else str(name or inner or "-")
