"""What a run or a comparison adds to the history, taken from the comparison's own output
(summary.json's shape: the verdicts are never recomputed here) plus each side's record for the
framework's identity and the per-step tok/s."""

from __future__ import annotations

from lockstep.compare.policy import class_of
from lockstep.compare.throughput import coefficient_of_variation

import datetime as _dt
import math
import os
import platform
import secrets
import statistics
from pathlib import Path

from lockstep.errors import LockstepError
from lockstep.formats.run_record import RunRecord
from lockstep.history.keys import case_inputs_sha256, file_sha256
from lockstep.history.store import ResultRow, RunRow
from lockstep.step_contract import WARMUP_STEPS

# Frameworks whose code is lockstep's own checkout (its reference trainer) or a pinned PyPI
# package driven by it: their "commit" in a trend is lockstep's commit.
LOCKSTEP_DRIVEN = ("pytorch", "megatron")


def new_run_id(now: _dt.datetime | None = None) -> str:
    """Sortable and short enough to type: 20261130T052100Z-3fa2c1."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def tokens_per_s_stats(record: RunRecord, warmup_steps: int = WARMUP_STEPS) -> dict[str, float | None]:
    """median, min, max and coefficient of variation (compare's `coefficient_of_variation`, as the
    report shows it; None for a mean of 0) of tok/s over the
    steps after warm-up (docs/reference/training-contract.md#timing: steps 2..N)."""
    vals = [s.tokens_per_s for s in sorted(record.steps, key=lambda s: s.step)
            if s.step > warmup_steps and s.tokens_per_s is not None]
    if not vals:
        return {"tps_median": None, "tps_min": None, "tps_max": None, "tps_cv": None}
    cv = coefficient_of_variation(vals)
    return {"tps_median": statistics.median(vals), "tps_min": min(vals), "tps_max": max(vals),
            "tps_cv": cv if math.isfinite(cv) else None}


def identity(record: RunRecord) -> dict[str, str | None]:
    """The framework under test as its record states it."""
    meta = record.meta
    commit = meta.get("infinitrain_commit")
    if not commit and record.origin == "lockstep" and record.framework in LOCKSTEP_DRIVEN:
        commit = meta.get("lockstep_commit")
    return {"framework_commit": commit, "framework_version": meta.get("framework_version"),
            "framework_build": meta.get("infinitrain_build"), "torch_version": meta.get("torch_version"),
            "megatron_core_version": meta.get("megatron_core_version"), "device": meta.get("device"),
            "device_name": meta.get("device_name")}


def _load(path: str | None, files=None) -> RunRecord | None:
    if not path:
        return None
    from lockstep.formats.logs import load_with

    try:
        return load_with(files, path)
    except (LockstepError, OSError):
        return None  # the comparison already said what is wrong with it


def _fill_from_record(row: ResultRow, path: str | None, warmup_steps: int, files=None) -> ResultRow:
    record = _load(path, files)
    if record is not None:
        for k, v in {**identity(record), **tokens_per_s_stats(record, warmup_steps)}.items():
            setattr(row, k, v)
        row.inputs_sha256 = case_inputs_sha256(record.meta)
        row.record_sha256 = file_sha256(path)
        row.machine = record.meta.get("host")
        row.peak_mem_mb, row.mfu = _memory_and_mfu(record, warmup_steps)
        row.dtype = row.dtype or record.dtype
        if not row.losses and record.ok:
            row.losses = [s.loss for s in sorted(record.steps, key=lambda s: s.step)]
    return row


def _memory_and_mfu(record: RunRecord, warmup_steps: int) -> tuple[float | None, float | None]:
    from lockstep.compare.throughput import throughput_of

    try:
        t = throughput_of(record, warmup_steps)
    except Exception:  # a foreign record's odd meta: the history keeps the run without these figures
        return None, None
    return t.peak_allocated_mb, t.mfu


def _verdict(case: dict) -> str:
    return class_of(case).value


def results_from_comparisons(comparisons: list[dict], files=None) -> list[ResultRow]:
    """One row per (case, framework): the baseline's once, each test framework's with its verdict."""
    rows: dict[tuple[str, str], ResultRow] = {}
    for comp in comparisons:
        base_fw, test_fw = comp["baseline_framework"], comp["test_framework"]
        warmup = (comp.get("options") or {}).get("warmup_steps", WARMUP_STEPS)
        for c in comp.get("cases", []):
            b, t = c.get("baseline") or {}, c.get("test") or {}
            if (c["case"], base_fw) not in rows:
                rows[(c["case"], base_fw)] = _fill_from_record(
                    ResultRow(c["case"], base_fw, "baseline", dtype=c.get("dtype"), losses=list(b.get("losses") or [])),
                    b.get("file"), warmup, files)
            rows[(c["case"], test_fw)] = _fill_from_record(
                ResultRow(c["case"], test_fw, "test", verdict=_verdict(c), reason=c.get("error") or c.get("cause"), dtype=c.get("dtype"),
                          losses=list(t.get("losses") or []), max_abs_diff=c.get("max_abs_diff"),
                          max_diff_step=c.get("max_diff_step"), threshold=c.get("threshold")),
                t.get("file"), warmup, files)
        for sk in comp.get("skipped", []):
            rows.setdefault((sk["case"], test_fw), ResultRow(sk["case"], test_fw, "test", verdict="SKIPPED",
                                                             reason=sk["reason"]))
        for m in comp.get("missing", []):
            rows.setdefault((m["case"], test_fw), ResultRow(m["case"], test_fw, "test", verdict="ERROR",
                                                            reason=m.get("message")))
        for e in comp.get("errors", []):
            if e.get("case"):
                rows.setdefault((e["case"], test_fw), ResultRow(e["case"], test_fw, "test", verdict="ERROR",
                                                                reason=e.get("message")))
    return list(rows.values())


def _run_level_commit(summary: dict) -> str | None:
    commit = (summary.get("metadata") or {}).get("lockstep_commit")
    if isinstance(commit, list):
        return ",".join(map(str, commit))
    if commit:
        return str(commit)
    from lockstep.runners.base import git_commit

    return git_commit()


def run_from_summary(summary: dict, run_dir: str | os.PathLike, files=None) -> RunRow:
    """A `lockstep run`: its summary.json plus the records of frameworks that were not compared
    (a one-framework run, a failed baseline) and the pairs run.json lists as skipped."""
    from lockstep.compare import framework_dirs
    from lockstep.compare.pairing import collect_cases
    from lockstep.formats.run_manifest import skipped_pairs

    run_dir = Path(run_dir)
    baseline = summary.get("baseline")
    results = results_from_comparisons(summary.get("comparisons", []), files)
    have = {(r.case, r.framework) for r in results}
    for fw_dir in framework_dirs(run_dir):
        for case, case_file in sorted(collect_cases(fw_dir).files.items()):
            if (case, fw_dir.name) in have:
                continue
            role = "baseline" if fw_dir.name == baseline else "test"
            row = _fill_from_record(ResultRow(case, fw_dir.name, role), str(case_file.path), 1, files)
            record = _load(str(case_file.path), files)
            if record is not None and not record.ok:
                row.verdict, row.reason = "ERROR", record.error
            results.append(row)
            have.add((case, fw_dir.name))
    for fw, cases in skipped_pairs(run_dir).items():
        for case, reason in cases.items():
            if (case, fw) not in have:
                results.append(ResultRow(case, fw, "baseline" if fw == baseline else "test", verdict="SKIPPED",
                                         reason=reason))
    return RunRow(run_id=new_run_id(), recorded_at=_now(), kind="run", source=str(run_dir.resolve()),
                  lockstep_commit=_run_level_commit(summary), baseline_framework=baseline,
                  passed=summary.get("passed"), host=platform.node(), results=results)


def run_from_comparison(report_json: dict, baseline_framework: str, test_framework: str) -> RunRow:
    """A `lockstep compare BASELINE TEST`: its report (ComparisonReport.to_json()) as one comparison."""
    comp = {"baseline_framework": baseline_framework, "test_framework": test_framework, **report_json}
    results = results_from_comparisons([comp])
    return RunRow(run_id=new_run_id(), recorded_at=_now(), kind="compare",
                  source=f"{report_json.get('baseline')} vs {report_json.get('test')}",
                  lockstep_commit=_run_level_commit({}), baseline_framework=baseline_framework,
                  passed=report_json.get("passed") if report_json.get("cases") or report_json.get("errors") else None,
                  host=platform.node(), results=results)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")
