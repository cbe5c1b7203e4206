"""Small run dirs made of real run records, compared by the real comparison code."""

from __future__ import annotations

import json
from pathlib import Path

from lockstep.compare import compare_run_dir
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record

BASE_LOSSES = [10.98, 10.71, 10.52, 10.40]
TPS = [50.0, 100.0, 110.0, 90.0]  # step 1 is warm-up: statistics over 100, 110, 90


def write_record(run_dir: Path, fw: str, case: str, losses: list[float], meta: dict | None = None,
                 tps: list[float] = TPS, dtype: str = "float32") -> Path:
    path = run_dir / fw / f"{case}.jsonl"
    write_run_record(path, RunRecord(
        framework=fw, case=case, meta={"case_spec": {"dtype": dtype, "model": "gpt2-tiny"}, "device": "cpu",
                                       "torch_version": "2.13.0", **(meta or {})},
        steps=[StepRecord(step=i + 1, loss=v, step_ms=10.0, tokens_per_s=t) for i, (v, t) in enumerate(zip(losses, tps))]))
    return path


def make_run(run_dir: Path, lockstep_commit: str, infinitrain_commit: str, drift: float,
             tps_scale: float = 1.0, skipped: list[dict] | None = None) -> dict:
    """pytorch (baseline) and infinitrain on case gpt2_1; infinitrain's loss drifts by
    drift * step. Returns the summary the real comparison wrote."""
    common = {"lockstep_commit": lockstep_commit}
    write_record(run_dir, "pytorch", "gpt2_1", BASE_LOSSES, {**common, "framework_version": "lockstep-pytorch"})
    write_record(run_dir, "infinitrain", "gpt2_1", [v + drift * (i + 1) for i, v in enumerate(BASE_LOSSES)],
                 {**common, "framework_version": "infinitrain", "infinitrain_commit": infinitrain_commit,
                  "infinitrain_build": "/opt/InfiniTrain/build"}, tps=[t * tps_scale for t in TPS])
    (run_dir / "run.json").write_text(json.dumps({"baseline": "pytorch", "skipped": skipped or []}))
    return compare_run_dir(run_dir, "pytorch")
