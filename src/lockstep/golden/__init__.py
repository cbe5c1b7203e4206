"""Golden values: per-case, per-step reference losses with a tolerance, recorded once from
repeated reference runs, so that a later run (e.g. a CI job holding only the InfiniTrain build)
is judged without re-running the references.

For each case and step, over the N recorded losses (the reference framework of every run dir
given, and every `--repeat` of it):

    mean      = the mean of the N losses
    spread    = max - min of the N losses (0 when the reference is bitwise deterministic)
    tolerance = max(threshold, K * spread)

threshold is the dtype's comparison threshold (SPEC section 7: FP32 1e-5, BF16 1e-2), the floor:
a golden file never judges tighter than a live comparison would. K = 3 (GOLDEN_K): the range of a
handful of repeats underestimates a noisy framework's true spread, and three ranges keep a run
exactly as noisy as the recorded ones from failing, while a real change of the curve (which
moves it by far more than the run-to-run noise) still does. A step passes when
|loss - mean| <= tolerance.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from lockstep.cases.spec import dtype_of_case_name
from lockstep.compare.policy import THRESHOLDS
from lockstep.errors import FormatError, LockstepError
from lockstep.formats.run_manifest import baseline_of
from lockstep.formats.run_record import RunRecord, read_run_record
from lockstep.fsutil import atomic_write

GOLDEN_K = 3.0
GOLDEN_SCHEMA = 1
GOLDEN_KIND = "lockstep-golden"


def reference_records(run_dir: str | os.PathLike, framework: str | None) -> tuple[str, list[RunRecord]]:
    """The reference framework's records of a run dir, repeats included."""
    from lockstep.determinism import REPEATS_DIR

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FormatError(run_dir, "is not a run directory")
    framework = framework or baseline_of(run_dir) or "pytorch"
    dirs = [run_dir / framework]
    repeats = run_dir / REPEATS_DIR
    if repeats.is_dir():
        dirs += sorted((d / framework for d in repeats.iterdir() if (d / framework).is_dir()),
                       key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    records = []
    for d in dirs:
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.jsonl")):
            if path.name.startswith("."):
                continue
            rec = read_run_record(path)
            if rec.ok:
                records.append(rec)
    if not records:
        raise FormatError(run_dir / framework, f"holds no completed {framework} records to record golden values from")
    return framework, records


def record_golden(run_dirs: list[str | os.PathLike], framework: str | None = None, k: float = GOLDEN_K) -> dict:
    by_case: dict[str, list[RunRecord]] = {}
    frameworks = set()
    for run_dir in run_dirs:
        fw, records = reference_records(run_dir, framework)
        frameworks.add(fw)
        for rec in records:
            by_case.setdefault(rec.case, []).append(rec)
    if len(frameworks) > 1:
        raise LockstepError(f"the run dirs have different baselines ({', '.join(sorted(frameworks))}); "
                            "name the reference with --framework")
    cases = {}
    for case, records in sorted(by_case.items()):
        dtype = records[0].dtype or dtype_of_case_name(case)
        step_sets = {tuple(s.step for s in sorted(r.steps, key=lambda s: s.step)) for r in records}
        if len(step_sets) > 1:
            raise FormatError(records[0].source or case, f"case {case}: the recorded runs have different steps "
                              f"({', '.join(str(len(s)) for s in step_sets)} steps); record runs of the same length")
        losses = [{s.step: s.loss for s in r.steps} for r in records]
        steps = []
        for step in sorted(losses[0]):
            vals = [ls[step] for ls in losses]
            mean = math.fsum(vals) / len(vals)
            spread = max(vals) - min(vals)
            steps.append({"step": step, "mean": mean, "spread": spread,
                          "tolerance": max(THRESHOLDS[dtype], k * spread), "n": len(vals)})
        cases[case] = {"dtype": dtype, "threshold": THRESHOLDS[dtype], "repeats": len(records), "steps": steps}
    return {"kind": GOLDEN_KIND, "schema": GOLDEN_SCHEMA, "framework": frameworks.pop(), "k": k,
            "tolerance_rule": "max(threshold, k * spread), spread = max - min over the repeats",
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "sources": [str(Path(d).resolve()) for d in run_dirs], "cases": cases}


def write_golden(path: str | os.PathLike, golden: dict) -> None:
    with atomic_write(path, "w", what="golden file") as f:
        json.dump(golden, f, indent=2)
        f.write("\n")


def read_golden(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        golden = json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(path, "no such golden file") from None
    except (OSError, ValueError) as e:
        raise FormatError(path, f"not a lockstep golden file ({e})") from None
    if not isinstance(golden, dict) or golden.get("kind") != GOLDEN_KIND or not isinstance(golden.get("cases"), dict):
        raise FormatError(path, "not a lockstep golden file (no \"kind\": \"lockstep-golden\" with cases)")
    if golden.get("schema") != GOLDEN_SCHEMA:
        raise FormatError(path, f"golden schema {golden.get('schema')}, this lockstep reads {GOLDEN_SCHEMA}")
    return golden


@dataclass
class GoldenVerdict:
    framework: str
    case: str
    outcome: str  # "passed" | "failure" | "error" | "skipped"
    message: str
    first_bad_step: int | None = None
    max_dev: float | None = None  # largest |loss - mean|
    max_dev_step: int | None = None

    def to_json(self) -> dict:
        return {"framework": self.framework, "case": self.case, "outcome": self.outcome, "message": self.message,
                "first_bad_step": self.first_bad_step, "max_dev": self.max_dev, "max_dev_step": self.max_dev_step}


def check_record(golden: dict, record: RunRecord) -> GoldenVerdict:
    fw, case = record.framework, record.case
    g = golden["cases"][case]
    if not record.ok:
        return GoldenVerdict(fw, case, "error", f"{record.source}: the run failed: {record.error}")
    if record.dtype and record.dtype != g["dtype"]:
        return GoldenVerdict(fw, case, "error", f"{record.source}: dtype {record.dtype}, the golden values are "
                                                f"{g['dtype']}")
    losses = {s.step: s.loss for s in record.steps}
    verdict = GoldenVerdict(fw, case, "passed", "")
    for gs in g["steps"]:
        step = gs["step"]
        if step not in losses:
            verdict.outcome, verdict.first_bad_step = "failure", step
            verdict.message = f"{record.source}: step {step} is missing (the golden values have {len(g['steps'])} steps)"
            return verdict
        loss = losses[step]
        dev = abs(loss - gs["mean"]) if math.isfinite(loss) else math.inf
        if verdict.max_dev is None or dev > verdict.max_dev:
            verdict.max_dev, verdict.max_dev_step = dev, step
        if not dev <= gs["tolerance"] and verdict.first_bad_step is None:
            verdict.first_bad_step = step
            verdict.message = (f"step {step}: loss {loss:.7f} is {dev:.3e} from the golden mean {gs['mean']:.7f}, "
                               f"outside the tolerance {gs['tolerance']:.1e}")
    if verdict.first_bad_step is not None:
        verdict.outcome = "failure"
    else:
        verdict.message = (f"within tolerance at all {len(g['steps'])} steps (max deviation {verdict.max_dev:.3e} at "
                           f"step {verdict.max_dev_step})")
    return verdict


def check_run_dir(golden: dict, run_dir: str | os.PathLike) -> list[GoldenVerdict]:
    """Every framework's record in RUN_DIR (a run dir, or one framework's dir) whose case the
    golden file has; pairs the run skipped (run.json) are reported as skipped."""
    from lockstep.compare import framework_dirs
    from lockstep.compare.pairing import collect_cases
    from lockstep.formats.run_manifest import skipped_pairs

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FormatError(run_dir, "is not a run directory")
    dirs = framework_dirs(run_dir)
    if not dirs and collect_cases(run_dir).cases:
        dirs = [run_dir]
    verdicts = []
    for d in dirs:
        tree = collect_cases(d)
        for case, case_file in sorted(tree.files.items()):
            if case not in golden["cases"] or not case_file.is_record:
                continue
            try:
                record = read_run_record(case_file.path)
            except LockstepError as e:
                verdicts.append(GoldenVerdict(d.name, case, "error", str(e)))
                continue
            verdicts.append(check_record(golden, record))
    for fw, cases in skipped_pairs(run_dir).items():
        for case, reason in sorted(cases.items()):
            if case in golden["cases"]:
                verdicts.append(GoldenVerdict(fw, case, "skipped", reason))
    if not verdicts:
        raise LockstepError(f"{run_dir}: no record of a case the golden file has "
                            f"({', '.join(sorted(golden['cases']))})")
    return verdicts
