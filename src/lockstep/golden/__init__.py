"""Golden values: per-case, per-step reference losses with a tolerance, recorded once from
repeated reference runs, so that a later run (e.g. a CI job holding only the InfiniTrain build)
is judged without re-running the references.

For each case and step, over the N recorded losses (the reference framework of every run dir
given, and every `--repeat` of it):

    mean      = the mean of the N losses
    spread    = max - min of the N losses (0 when the reference is bitwise deterministic)
    tolerance = max(threshold, K * spread)

threshold is the case's comparison threshold, the policy's (docs/reference/case-matrices.md#thresholds), the floor:
a golden file never judges tighter than a live comparison would. K = 3 (GOLDEN_K): the range of a
handful of repeats underestimates a noisy framework's true spread, and three ranges keep a run
exactly as noisy as the recorded ones from failing, while a real change of the curve (which
moves it by far more than the run-to-run noise) still does. A step passes when
|loss - mean| <= tolerance.

Each case also records the environment its values came from (golden/environment.py), and a
golden file is validated when it is read (validate_golden): a tampered tolerance, an empty or
non-numeric step is refused in one sentence rather than judged by.

A record is judged only against golden values of the same run: the same steps, the same case spec
(as recorded: `case_spec`) and the same inputs digest (the environment's `case_inputs`: weights,
tokens, steps, hyper-parameters). A record that differs in any of them is an error saying what
differs, never a PASS over the steps both happen to have (unlike_golden).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from lockstep.cases.spec import dtype_of_case_name
from lockstep.compare.inputs import SPEC_FIELDS
from lockstep.compare.policy import DTYPES, loss_threshold
from lockstep.errors import FormatError, LockstepError
from lockstep.formats.run_manifest import baseline_of
from lockstep.formats.run_record import RunRecord, read_run_record
from lockstep.fsutil import atomic_write
from lockstep.golden.environment import changes, changes_sentence, environment_of
from lockstep.history.keys import case_inputs_sha256

GOLDEN_K = 3.0
GOLDEN_SCHEMA = 2  # 2: each case records its environment; 1 (no environment) is still read
READABLE_SCHEMAS = (1, 2)
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
        threshold, _ = loss_threshold(case, dtype)
        steps = []
        for step in sorted(losses[0]):
            vals = [ls[step] for ls in losses]
            mean = math.fsum(vals) / len(vals)
            spread = max(vals) - min(vals)
            steps.append({"step": step, "mean": mean, "spread": spread,
                          "tolerance": max(threshold, k * spread), "n": len(vals)})
        cases[case] = {"dtype": dtype, "threshold": threshold, "repeats": len(records), "steps": steps,
                       "environment": environment_of(records[0])}
        if isinstance(records[0].meta.get("case_spec"), dict):
            cases[case]["case_spec"] = records[0].meta["case_spec"]  # what check_record judges like with like
    return {"kind": GOLDEN_KIND, "schema": GOLDEN_SCHEMA, "framework": frameworks.pop(), "k": k,
            "tolerance_rule": "max(threshold, k * spread), spread = max - min over the repeats",
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "sources": [str(Path(d).resolve()) for d in run_dirs], "cases": cases}


def write_golden(path: str | os.PathLike, golden: dict) -> None:
    with atomic_write(path, "w", what="golden file") as f:
        json.dump(golden, f, indent=2)
        f.write("\n")


def read_golden(path: str | os.PathLike) -> dict:
    """A golden file, validated (validate_golden): a file that does not hold what `record`
    writes is refused in one sentence naming the file, the case and the key."""
    path = Path(path)
    try:
        golden = json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(path, "no such golden file") from None
    except (OSError, ValueError) as e:
        raise FormatError(path, f"not a lockstep golden file ({e})") from None
    if not isinstance(golden, dict) or golden.get("kind") != GOLDEN_KIND or not isinstance(golden.get("cases"), dict):
        raise FormatError(path, "not a lockstep golden file (no \"kind\": \"lockstep-golden\" with cases)")
    if golden.get("schema") not in READABLE_SCHEMAS:
        raise FormatError(path, f"golden schema {golden.get('schema')}, this lockstep reads "
                                f"{', '.join(map(str, READABLE_SCHEMAS))}")
    validate_golden(path, golden)
    return golden


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def validate_golden(path: Path, golden: dict) -> None:
    """What `record` writes, and nothing a check could be fooled by: a finite positive k; per
    case a known dtype and a non-empty list of numbered steps; per step a finite mean, a finite
    spread >= 0 smaller than the loss itself, and the tolerance record's rule gives,
    max(threshold, k * spread), finite and at least the dtype's threshold. A tolerance of inf or
    1e9 would pass any run; a negative one no run."""
    k = golden.get("k", GOLDEN_K)
    if not _number(k) or not math.isfinite(k) or k <= 0:
        raise FormatError(path, f"\"k\" is {k!r}; it must be a finite positive number, as golden record writes it")
    if not golden["cases"]:
        raise FormatError(path, "holds no cases to judge by")
    for case, g in golden["cases"].items():
        where = f"case {case}"
        if not isinstance(g, dict):
            raise FormatError(path, f"{where} is {type(g).__name__}, not an object of golden values")
        dtype = g.get("dtype")
        if dtype not in DTYPES:
            raise FormatError(path, f"{where}: \"dtype\" is {dtype!r}, not one of {', '.join(DTYPES)}")
        threshold, _ = loss_threshold(case, dtype)  # what golden record used for this case
        steps = g.get("steps")
        if not isinstance(steps, list) or not steps:
            raise FormatError(path, f"{where}: \"steps\" is {json.dumps(steps)}; it must list at least one step")
        seen = set()
        for i, gs in enumerate(steps):
            at = f"{where}, steps[{i}]"
            if not isinstance(gs, dict):
                raise FormatError(path, f"{at} is {json.dumps(gs)}, not an object with step, mean and tolerance")
            step = gs.get("step")
            if not isinstance(step, int) or isinstance(step, bool) or step < 1 or step in seen:
                raise FormatError(path, f"{at}: \"step\" is {json.dumps(step)}; it must be a step number >= 1, "
                                        "once per case")
            seen.add(step)
            at = f"{where}, step {step}"
            for key in ("mean", "spread", "tolerance"):
                v = gs.get(key)
                if not _number(v) or not math.isfinite(v):
                    raise FormatError(path, f"{at}: \"{key}\" is {json.dumps(v)}; it must be a finite number")
            mean, spread, tol = gs["mean"], gs["spread"], gs["tolerance"]
            if spread < 0 or spread > max(abs(mean), threshold):
                raise FormatError(path, f"{at}: \"spread\" is {spread!r}; repeats' losses spread from 0 up to the "
                                        f"loss itself ({abs(mean):.4g})")
            if tol < threshold:
                raise FormatError(path, f"{at}: \"tolerance\" is {tol!r}, below the {dtype} threshold {threshold:g} "
                                        "golden record never goes under")
            expected = max(threshold, k * spread)
            if not math.isclose(tol, expected, rel_tol=1e-9, abs_tol=0.0):
                raise FormatError(path, f"{at}: \"tolerance\" is {tol!r}, not max(threshold, k x spread) = "
                                        f"{expected:.3e} as golden record writes it")



@dataclass
class GoldenVerdict:
    framework: str
    case: str
    outcome: str  # "passed" | "failure" | "error" | "skipped"
    message: str
    first_bad_step: int | None = None
    max_dev: float | None = None  # largest |loss - mean|
    max_dev_step: int | None = None
    environment_changes: tuple[str, ...] = ()  # what changed since the golden values were recorded

    def to_json(self) -> dict:
        return {"framework": self.framework, "case": self.case, "outcome": self.outcome, "message": self.message,
                "first_bad_step": self.first_bad_step, "max_dev": self.max_dev, "max_dev_step": self.max_dev_step,
                "environment_changes": list(self.environment_changes)}


def check_record(golden: dict, record: RunRecord) -> GoldenVerdict:
    fw, case = record.framework, record.case
    g = golden["cases"][case]
    if not record.ok:
        return GoldenVerdict(fw, case, "error", f"{record.source}: the run failed: {record.error}")
    if record.dtype and record.dtype != g["dtype"]:
        return GoldenVerdict(fw, case, "error", f"{record.source}: dtype {record.dtype}, the golden values are "
                                                f"{g['dtype']}")
    unlike = unlike_golden(g, record)
    if unlike:
        return GoldenVerdict(fw, case, "error", f"{record.source}: not the run the golden values were recorded from "
                                                f"({'; '.join(unlike)}), so it is not judged by them; record golden "
                                                "values of this run (golden record) to judge it")
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
        now = environment_of(record)
        verdict.environment_changes = tuple(changes(g.get("environment"), now))
        verdict.message += f"; {changes_sentence(g.get('environment'), now)}"
    else:
        verdict.message = (f"within tolerance at all {len(g['steps'])} steps (max deviation {verdict.max_dev:.3e} at "
                           f"step {verdict.max_dev_step})")
    return verdict


def unlike_golden(g: dict, record: RunRecord) -> list[str]:
    """What makes `record` another run than the one golden values `g` came from, one phrase each
    (the record's value first); empty when it is like (as far as both state). A step the record
    lacks is not here: that run stopped short, a failure at that step."""
    out = []
    spec_g, spec_r = g.get("case_spec") or {}, record.meta.get("case_spec") or {}
    for key in SPEC_FIELDS:
        if spec_g.get(key) is not None and spec_r.get(key) is not None and spec_g[key] != spec_r[key]:
            out.append(f"{key} {spec_r[key]} vs {spec_g[key]} in the golden file")
    golden_steps = {gs["step"] for gs in g["steps"]}
    beyond = sorted(s.step for s in record.steps if s.step not in golden_steps)
    if beyond and not any(p.startswith("steps ") for p in out):
        out.append(f"{len(record.steps)} steps vs {len(golden_steps)} in the golden file, which has no values for "
                   f"steps {beyond[0]}..{beyond[-1]}" if len(beyond) > 1 else
                   f"{len(record.steps)} steps vs {len(golden_steps)} in the golden file, which has no value for "
                   f"step {beyond[0]}")
    recorded, now = (g.get("environment") or {}).get("case_inputs"), case_inputs_sha256(record.meta)
    if recorded and now and recorded != now:
        out.append(f"inputs digest {now[:12]} vs {recorded[:12]} in the golden file: other weights, tokens, steps or "
                   "hyper-parameters")
    return out


NOT_JUDGED = "not judged"


def check_run_dir(golden: dict, run_dir: str | os.PathLike) -> list[GoldenVerdict]:
    """Every framework's record in RUN_DIR (a run dir, or one framework's dir) whose case the
    golden file has; pairs the run skipped (run.json) are reported as skipped. A record the
    golden file has no values for, or a log that is not a lockstep record, is an error saying
    it was not judged: a check that passes has judged every record it was given."""
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
            if case not in golden["cases"]:
                verdicts.append(GoldenVerdict(d.name, case, "error", f"{NOT_JUDGED}: the golden file has no values "
                                                                     f"for case {case}"))
                continue
            if not case_file.is_record:
                verdicts.append(GoldenVerdict(d.name, case, "error", f"{NOT_JUDGED}: {case_file.path} is not a "
                                                                     "lockstep run record"))
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
    if not any(v.outcome != "error" or not v.message.startswith(NOT_JUDGED) for v in verdicts):
        raise LockstepError(f"{run_dir}: no record of a case the golden file has "
                            f"({', '.join(sorted(golden['cases']))})")
    return verdicts


def golden_diff(old: dict, new: dict) -> list[str]:
    """What `golden record --update` changes, for the person who reviews it: cases added or
    removed, per case the environment that moved and every step whose mean or tolerance moved."""
    lines = []
    old_cases, new_cases = old.get("cases") or {}, new["cases"]
    for case in sorted(set(old_cases) | set(new_cases)):
        a, b = old_cases.get(case), new_cases.get(case)
        if b is None:
            lines.append(f"- {case}: removed ({len(a.get('steps') or []) if isinstance(a, dict) else 0} steps)")
            continue
        if not isinstance(a, dict):
            lines.append(f"+ {case}: added ({len(b['steps'])} steps, {b['dtype']})")
            continue
        moved = changes(a.get("environment"), b["environment"]) if a.get("environment") else []
        if not a.get("environment"):
            moved = ["environment recorded (the old values had none)"]
        old_steps = {s.get("step"): s for s in a.get("steps") or [] if isinstance(s, dict)}
        step_lines = []
        for s in b["steps"]:
            o = old_steps.pop(s["step"], None)
            if o is None:
                step_lines.append(f"    step {s['step']}: added, mean {s['mean']:.7f} tolerance {s['tolerance']:.1e}")
            elif o.get("mean") != s["mean"] or o.get("tolerance") != s["tolerance"]:
                step_lines.append(f"    step {s['step']}: mean {_fmt(o.get('mean'), '.7f')} -> {s['mean']:.7f} "
                                  f"({_delta(o.get('mean'), s['mean'])}), tolerance {_fmt(o.get('tolerance'), '.1e')} "
                                  f"-> {s['tolerance']:.1e}")
        step_lines += [f"    step {step}: removed" for step in sorted(old_steps, key=str)]
        if moved or step_lines:
            lines.append(f"~ {case}: " + ("; ".join(moved) if moved else "same environment")
                         + f", {len(step_lines)} of {len(b['steps'])} steps changed")
            lines += step_lines
        else:
            lines.append(f"= {case}: unchanged")
    return lines


def _fmt(x, spec: str) -> str:
    return format(x, spec) if _number(x) else repr(x)


def _delta(a, b) -> str:
    return f"{b - a:+.3e}" if _number(a) and math.isfinite(a) else "was not a number"
