"""`lockstep inspect` on the JSON files lockstep writes: a run record (`<case>.jsonl`), a run's
`summary.json` and its `run.json`. They have no magic number; what they are is read from their
content, by the same marks the rest of lockstep knows them by (a record's metadata line, the
summary's keys, run.json's schema)."""

from __future__ import annotations

import json
from pathlib import Path

from lockstep.errors import FormatError
from lockstep.formats.detect import FileInfo
from lockstep.formats.run_manifest import RUN_SCHEMA
from lockstep.formats.run_record import read_run_record
from lockstep.fsutil import read_head, read_text
from lockstep.outdir import SUMMARY_KEYS


def looks_like_json(path: Path) -> bool:
    """The file starts with a JSON object: one of lockstep's JSON files, or no file of its at all."""
    return read_head(path, 64, "file").lstrip().startswith(b"{")


def inspect_json_file(path: Path) -> FileInfo:
    """What a lockstep JSON file is and what it says; FormatError when it is none of them."""
    text = read_text(path, "JSON file")
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    try:
        head = json.loads(first)
    except ValueError:
        head = None
    if isinstance(head, dict) and head.get("type") == "meta":
        return _record_info(path)
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise FormatError(path, f"starts like JSON but is not JSON ({e}); lockstep inspect reads LLMC checkpoints, "
                                "token files, run records, summary.json and run.json") from None
    if isinstance(doc, dict) and doc.get("schema") == RUN_SCHEMA:
        return _manifest_info(path, doc)
    if isinstance(doc, dict) and all(k in doc for k in SUMMARY_KEYS):
        return _summary_info(path, doc)
    raise FormatError(path, "is JSON, but not a file lockstep wrote (not a run record, a run's summary.json or its "
                            f"run.json, whose \"schema\" is {RUN_SCHEMA!r})")


def _record_info(path: Path) -> FileInfo:
    record = read_run_record(path)  # strict: a damaged record is one sentence naming the line
    losses = [s.loss for s in record.steps]
    fields = {"framework": record.framework, "case": record.case, "steps": len(record.steps),
              "status": record.status, "origin": record.origin}
    if record.error:
        fields["error"] = record.error
    derived = {"first step": record.steps[0].step if record.steps else None,
               "last step": record.steps[-1].step if record.steps else None,
               "first loss": losses[0] if losses else None, "last loss": losses[-1] if losses else None}
    for key in ("framework_version", "dtype", "device", "inputs_sha256"):
        if record.meta.get(key) is not None:
            derived[key.replace("_", " ")] = record.meta[key]
    return FileInfo(str(path), "lockstep-run-record", "run record", fields, derived)


def _manifest_info(path: Path, doc: dict) -> FileInfo:
    cases = [c.get("name") for c in doc.get("cases") or [] if isinstance(c, dict)]
    fields = {"status": doc.get("status"), "baseline": doc.get("baseline"),
              "frameworks": ", ".join(map(str, doc.get("frameworks") or [])), "cases": len(cases),
              "device": doc.get("device")}
    derived = {"case names": ", ".join(map(str, cases[:6])) + (", ..." if len(cases) > 6 else ""),
               "started at": doc.get("started_at"), "finished at": doc.get("finished_at"),
               "skipped": len(doc.get("skipped") or [])}
    return FileInfo(str(path), "lockstep-run-manifest", "run manifest (run.json)", fields, derived)


def _summary_info(path: Path, doc: dict) -> FileInfo:
    comparisons = [c for c in doc.get("comparisons") or [] if isinstance(c, dict)]
    cases = {c.get("case") for comp in comparisons for c in comp.get("cases") or [] if isinstance(c, dict)}
    verdict = {True: "PASS", False: "FAIL", None: "nothing compared"}.get(doc.get("passed"), str(doc.get("passed")))
    fields = {"run dir": doc.get("run_dir"), "baseline": doc.get("baseline"),
              "frameworks": ", ".join(map(str, doc.get("frameworks") or [])), "verdict": verdict}
    derived = {"comparisons": len(comparisons), "cases": len(cases - {None}),
               "errors": len(doc.get("errors") or [])}
    return FileInfo(str(path), "lockstep-run-summary", "run summary (summary.json)", fields, derived)
