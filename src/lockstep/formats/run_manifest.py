"""run.json: what a `lockstep run` asked for and how it ended, at the top of its run directory.

The one module that writes and reads it. Written first, before any case starts, with status
"running" (the cases, frameworks, baseline, device, models with their checkpoint and token files
and their sha256, the node layout); then, as the run goes, the pairs it skipped with the reason;
at the end its status ("finished", "interrupted", "failed"), its verdict word and its "timing".
Every run.json lockstep writes carries `"schema": "lockstep.run/1"`: how lockstep knows its own
run directories from anyone else's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lockstep.errors import FormatError, LockstepError
from lockstep.fsutil import atomic_write, read_text

RUN_MANIFEST = "run.json"
RUN_SCHEMA = "lockstep.run/1"  # in every run.json lockstep writes: how it knows its own directories


def manifest_of(plan) -> dict:
    """What a plan (lockstep.plan.RunPlan) asks for, as run.json holds it when the run starts."""
    models = [{"name": m.model_name, **m.model.to_dict(), "optimizer": m.family.optimizer.to_dict(),
               "checkpoint": str(m.checkpoint), "checkpoint_sha256": m.checkpoint_sha256, "data": str(m.tokens),
               "data_sha256": m.tokens_sha256, "corpus": m.corpus} for m in plan.models()]
    first = plan.models()[0]
    return {"cases": [c.to_dict() for c in plan.cases], "frameworks": [r.name for r in plan.runners],
            "baseline": plan.runners[0].name, "device": plan.device, "model": models[0], "models": models,
            "checkpoint": str(first.checkpoint), "checkpoint_sha256": first.checkpoint_sha256,
            "data": str(first.tokens), "data_sha256": first.tokens_sha256, "corpus": first.corpus, "skipped": [],
            "nodes": plan.nodes.label, "oversubscribe": any(i.oversubscribe for i in plan.inputs.values())}


def skip_entry(case: str, framework: str, reason: str) -> dict:
    """One element of run.json's "skipped"."""
    return {"case": case, "framework": framework, "reason": reason}


def manifest_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / RUN_MANIFEST


def write_manifest(run_dir: str | os.PathLike, manifest: dict) -> None:
    """Write run.json (atomically), always marked as lockstep's; a failure is one sentence naming
    the file and the reason."""
    with atomic_write(manifest_path(run_dir), "w", what="run manifest") as f:
        json.dump({"schema": RUN_SCHEMA, **manifest}, f, indent=2)
        f.write("\n")


def read_manifest(run_dir: str | os.PathLike) -> dict:
    """run.json's content; {} when there is none or it cannot be read (callers that must know why
    use `lockstep_manifest` or `require_manifest`)."""
    path = manifest_path(run_dir)
    if not path.is_file():
        return {}
    try:
        doc = json.loads(read_text(path, "run manifest"))
    except (LockstepError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def lockstep_manifest(run_dir: str | os.PathLike) -> tuple[dict | None, str]:
    """(run.json's content, "") when `run_dir` holds a run.json lockstep wrote; (None, why not) otherwise."""
    path = manifest_path(run_dir)
    if not path.exists():
        return None, "no run.json"
    try:
        doc = json.loads(read_text(path, "run manifest"))
    except LockstepError as e:
        return None, f"its run.json cannot be read ({e})"
    except ValueError:
        return None, f"its run.json is not JSON, so lockstep did not write it (lockstep's has \"schema\": \"{RUN_SCHEMA}\")"
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema == RUN_SCHEMA:
        return doc, ""
    if isinstance(schema, str) and schema.startswith("lockstep.run/"):
        return None, f"its run.json is of another lockstep version ({schema}; this one reads {RUN_SCHEMA})"
    return None, f"its run.json was not written by lockstep (it has no \"schema\": \"{RUN_SCHEMA}\")"


def require_manifest(run_dir: str | os.PathLike) -> dict:
    """run.json of a directory `lockstep run` wrote; LockstepError naming the directory otherwise."""
    doc, why_not = lockstep_manifest(run_dir)
    if doc is None:
        raise LockstepError(f"{run_dir}: {why_not}, so not a directory `lockstep run` wrote")
    return doc


def baseline_of(run_dir: str | os.PathLike) -> str | None:
    """The run's baseline framework, or None (no run.json, or one without it)."""
    baseline = read_manifest(run_dir).get("baseline")
    return baseline if isinstance(baseline, str) else None


def timing_of(run_dir: str | os.PathLike) -> dict | None:
    """run.json's "timing", or None (an older run, another tool's files, or no run.json)."""
    timing = read_manifest(run_dir).get("timing")
    return timing if isinstance(timing, dict) and isinstance(timing.get("pairs"), list) else None


def skipped_pairs(run_dir: str | os.PathLike) -> dict[str, dict[str, str]]:
    """framework -> {case: reason} for the pairs `lockstep run` skipped (from run.json's `skipped`;
    empty when there is no run.json). Raises FormatError naming run.json when it is unreadable."""
    path = manifest_path(run_dir)
    if not path.is_file():
        return {}
    try:
        doc = json.loads(read_text(path, "run manifest"))
    except ValueError as e:
        raise FormatError(path, f"is not valid JSON ({e})") from None
    entries = doc.get("skipped", []) if isinstance(doc, dict) else None
    out: dict[str, dict[str, str]] = {}
    for e in entries if isinstance(entries, list) else [None]:
        if not (isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("framework", "case", "reason"))):
            raise FormatError(path, "`skipped` must be a list of {framework, case, reason} strings")
        out.setdefault(e["framework"], {})[e["case"]] = e["reason"]
    return out
