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


# -- a long history made of real runs' records ----------------------------------------------

REAL_RUNS = Path(__file__).resolve().parents[2] / "docs" / "results" / "2026-11-29-h200"
# (run dir, what it shows): InfiniTrain before its FP32 fix (FAIL unexplained) and after (PASS),
# both beside pytorch; the first also beside megatron. Real H200 records, compared here.
REAL_RUN_DIRS = ("single", "infinitrain_patched")
MACHINES = (("h200-a", "NVIDIA H200", 1.0), ("h200-b", "NVIDIA H200", 0.97), ("h100-c", "NVIDIA H100 80GB HBM3", 0.62))


def real_compared_runs(work: Path) -> list:
    """The real run dirs copied to `work` (records, run.json, report.html) and compared by the
    real comparison code: one RunRow each."""
    import shutil

    from lockstep.history import run_from_summary

    rows = []
    for name in REAL_RUN_DIRS:
        src, dst = REAL_RUNS / name, work / name
        for f in src.glob("*/*.jsonl"):
            (dst / f.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(f, dst / f.parent.name / f.name)
        for f in ("run.json", "report.html"):
            shutil.copy(src / f, dst / f)
        rows.append(run_from_summary(compare_run_dir(dst, "pytorch"), dst))
    return rows


def many_runs(n: int, work: Path) -> list:
    """n runs made from the real compared runs: the InfiniTrain commit moves every 5 runs (and
    with it the fix comes and goes), three machines take turns (their tok/s scaled by the
    machine and by +-3% noise), torch and megatron-core are upgraded part way. Every run's
    content differs, so the history keeps all n."""
    import copy
    import datetime as dt
    import random

    base = real_compared_runs(work)
    t0 = dt.datetime(2026, 9, 1, tzinfo=dt.timezone.utc)
    rng = random.Random(35)
    out = []
    for i in range(n):
        commit_no = i // 5
        variant = base[(commit_no // 7) % len(base)]
        host, device, speed = MACHINES[i % len(MACHINES)]
        when = t0 + dt.timedelta(minutes=37 * i)
        run = copy.deepcopy(variant)
        run.run_id = f"{when:%Y%m%dT%H%M%SZ}-{i:06x}"
        run.recorded_at = when.isoformat(timespec="microseconds")
        run.lockstep_commit = f"{(0x1000 + i // 20):04x}" + "c0ffee"
        run.host = host
        for r in run.results:
            noise = speed * (1 + rng.uniform(-0.03, 0.03))
            for name in ("tps_median", "tps_min", "tps_max", "mfu"):
                if getattr(r, name) is not None:
                    setattr(r, name, getattr(r, name) * noise)
            r.machine, r.device_name = host, device
            r.torch_version = "2.11.0+cu130" if i < n // 2 else "2.12.0+cu130"
            r.megatron_core_version = "0.16.1" if i < 3 * n // 5 else "0.17.0"
            if r.framework == "infinitrain":
                r.framework_commit = f"{0xab000 + commit_no:05x}" + "e1" * 16
            elif r.framework_commit:
                r.framework_commit = run.lockstep_commit
            if r.record_sha256:
                r.record_sha256 = f"{i:08x}" + r.record_sha256[8:]
        out.append(run)
    return out
