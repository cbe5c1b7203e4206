"""The run record: `<out>/<framework>/<case>.jsonl`, one per framework and case.

Line 1 is the metadata (`"type": "meta"`, with `status` "ok" or "failed" and the error),
then one `"type": "step"` line per optimizer step. Records are written atomically and only
once a run has ended, so a record on disk is either complete or explicitly failed.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lockstep.errors import FormatError
from lockstep.fsutil import atomic_write, read_text
from lockstep.step_contract import WARMUP_STEPS

RECORD_SCHEMA = 1


@dataclass
class StepRecord:
    step: int  # 1-based
    loss: float
    step_ms: float | None = None
    tokens_per_s: float | None = None
    lr: float | None = None
    peak_mem_mb: float | None = None
    # The same step's loss as an FP32 sequential sum of the same per-token losses would log it
    # (InfiniTrain's way, step_contract.fp32_sequential_loss); runners that hold the token losses.
    loss_fp32_sum: float | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None or k in ("step", "loss")}


@dataclass
class RunRecord:
    framework: str
    case: str
    steps: list[StepRecord] = field(default_factory=list)
    meta: dict = field(default_factory=dict)  # case spec, shapes, sha256s, versions, device, command, ...
    status: str = "ok"  # "ok" | "failed"
    error: str | None = None
    source: str | None = None  # file it was read from, for messages
    # "lockstep" for our own runs; parsers of foreign logs set e.g. "infinitrain-log", "megatron-lm-log".
    origin: str = "lockstep"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def dtype(self) -> str | None:
        return (self.meta.get("case_spec") or {}).get("dtype")

    def losses(self) -> list[float]:
        return [s.loss for s in self.steps]

    def mean_tokens_per_s(self, warmup_steps: int = WARMUP_STEPS) -> float | None:
        """Mean tok/s over the steps after warm-up (docs/reference/training-contract.md#timing: averages use steps 2..N)."""
        vals = [s.tokens_per_s for s in self.steps if s.step > warmup_steps and s.tokens_per_s is not None]
        return sum(vals) / len(vals) if vals else None

    def mean_step_ms(self, warmup_steps: int = WARMUP_STEPS) -> float | None:
        vals = [s.step_ms for s in self.steps if s.step > warmup_steps and s.step_ms is not None]
        return sum(vals) / len(vals) if vals else None


def write_run_record(path: str | os.PathLike, record: RunRecord) -> None:
    head = {"type": "meta", "schema": RECORD_SCHEMA, "framework": record.framework, "case": record.case,
            "status": record.status, "error": record.error, "origin": record.origin, **record.meta}
    with atomic_write(path, "w", what="run record") as f:
        f.write(json.dumps(head, sort_keys=False, allow_nan=True) + "\n")
        for s in record.steps:
            f.write(json.dumps({"type": "step", **s.to_dict()}, allow_nan=True) + "\n")


_HEAD_KEYS = {"type", "schema", "framework", "case", "status", "error", "origin"}
STATUSES = ("ok", "failed")
# Beside a case's record: `<case>.out/`, the files a trainer run as a command writes (its {out}); never a case.
CASE_OUT_SUFFIX = ".out"
_STEP_REQUIRED = ("step", "loss")
_STEP_OPTIONAL = ("step_ms", "tokens_per_s", "lr", "peak_mem_mb", "loss_fp32_sum")
# Far beyond any run, far below the size where integer arithmetic or formatting gets slow.
MAX_STEP = 10**12
# case_spec fields whose type the comparison relies on (dtype picks the threshold, the parallel
# sizes label the config); the rest of the metadata is shown as text and may be anything JSON.
_SPEC_TYPES = {"name": str, "model": str, "dtype": str, "micro_batch": int, "seq_len": int, "total_batch": int,
               "steps": int, "lr": (int, float), "dp": int, "tp": int, "pp": int, "vpp": int, "sp": bool}


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _type_name(x) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(x), type(x).__name__)


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice")
        out[k] = v
    return out


def _parse_line(path: Path, lineno: int, line: str) -> dict:
    try:
        row = json.loads(line, object_pairs_hook=_no_duplicate_keys)
    except RecursionError:
        raise FormatError(path, f"line {lineno} is nested too deeply to be a run record line") from None
    except ValueError as e:  # JSONDecodeError, duplicate keys, integers beyond Python's digit limit
        msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e).split(";")[0]
        raise FormatError(path, f"line {lineno} is not valid JSON ({msg})") from None
    if not isinstance(row, dict):
        raise FormatError(path, f"line {lineno} is {_type_name(row)}, not a JSON object")
    return row


def _check_head(path: Path, head: dict) -> None:
    if head.get("type") != "meta":
        raise FormatError(path, "not a lockstep run record: the first line is not a metadata line "
                                '({"type": "meta", ...})')
    for key in ("framework", "case", "origin"):
        if key in head and not isinstance(head[key], str):
            raise FormatError(path, f"line 1: {key} is {_type_name(head[key])}, not a string")
    if "schema" in head and head["schema"] != RECORD_SCHEMA:
        raise FormatError(path, f"line 1: schema {head['schema']!r} is not the schema this lockstep reads ({RECORD_SCHEMA})")
    if head.get("status", "ok") not in STATUSES:
        raise FormatError(path, f"line 1: status {head.get('status')!r} is not one of {', '.join(STATUSES)}")
    if head.get("error") is not None and not isinstance(head["error"], str):
        raise FormatError(path, f"line 1: error is {_type_name(head['error'])}, not a string")
    spec = head.get("case_spec")
    if spec is not None:
        if not isinstance(spec, dict):
            raise FormatError(path, f"line 1: case_spec is {_type_name(spec)}, not an object")
        for key, want in _SPEC_TYPES.items():
            v = spec.get(key)
            ok = v is None or (isinstance(v, want) and not (want is not bool and isinstance(v, bool)))
            if ok and want is int and v is not None and not 0 <= v <= MAX_STEP:
                ok = False
            if ok and key == "lr" and v is not None and not math.isfinite(v):
                ok = False
            if not ok:
                raise FormatError(path, f"line 1: case_spec.{key} is {v!r:.40}, not a valid {key}")
    parallel = head.get("parallel")
    if parallel is not None and not (isinstance(parallel, dict)
                                     and all(_is_int(v) and 0 <= v <= MAX_STEP for v in parallel.values())):
        raise FormatError(path, "line 1: parallel must map names to small non-negative integers")
    if head.get("megatron_step2_corrected") and not _is_number(head.get("megatron_step2_logged_loss")):
        raise FormatError(path, "line 1: megatron_step2_corrected without a numeric megatron_step2_logged_loss")


def _step_from_row(path: Path, lineno: int, row: dict) -> StepRecord:
    if row.get("type") != "step":
        raise FormatError(path, f"line {lineno} is not a step line (its type is {row.get('type')!r:.40})")
    missing = [k for k in _STEP_REQUIRED if k not in row]
    if missing:
        raise FormatError(path, f"line {lineno}: step line without {' and '.join(missing)}")
    extra = sorted(set(row) - {"type", *_STEP_REQUIRED, *_STEP_OPTIONAL})
    if extra:
        raise FormatError(path, f"line {lineno}: unknown key(s) {', '.join(map(repr, extra))} in a step line")
    step = row["step"]
    if not _is_int(step):
        raise FormatError(path, f"line {lineno}: step is {_type_name(step)}, not an integer")
    if not 1 <= step <= MAX_STEP:
        raise FormatError(path, f"line {lineno}: step {step if abs(step) < 10**15 else '(huge)'} is outside 1..{MAX_STEP}")
    if not _is_number(row["loss"]):
        # A non-finite loss is kept: check_steps names the step (a diverging run says so).
        raise FormatError(path, f"line {lineno}: loss is {_type_name(row['loss'])}, not a number")
    values = {}
    for key in _STEP_OPTIONAL:
        v = row.get(key)
        if key == "loss_fp32_sum" and v is not None and _is_number(v):
            values[key] = float(v)  # a loss, like `loss`: a diverging run's may be non-finite
            continue
        if v is not None and not (_is_number(v) and math.isfinite(v) and v >= 0):
            raise FormatError(path, f"line {lineno}: {key} is {v!r:.40}, not a finite non-negative number")
        values[key] = None if v is None else float(v)
    return StepRecord(step=step, loss=float(row["loss"]), **values)


def read_run_record(path: str | os.PathLike) -> RunRecord:
    """Read a record strictly: anything but a well-formed record raises FormatError naming the
    file and the line (never another exception: records come from crashing runs and other tools)."""
    path = Path(path)
    text = read_text(path, "run record")
    numbered = [(i, ln) for i, ln in enumerate(text.splitlines(), start=1) if ln.strip()]
    if not numbered:
        raise FormatError(path, "empty run record (no metadata line)")
    head = _parse_line(path, *numbered[0])
    _check_head(path, head)
    steps: list[StepRecord] = []
    for lineno, line in numbered[1:]:
        step = _step_from_row(path, lineno, _parse_line(path, lineno, line))
        if steps and step.step <= steps[-1].step:
            word = "appears twice" if any(s.step == step.step for s in steps) else f"comes after step {steps[-1].step}"
            raise FormatError(path, f"line {lineno}: step {step.step} {word}")
        steps.append(step)
    return RunRecord(framework=head.get("framework", "?"), case=head.get("case", path.stem), steps=steps,
                     meta={k: v for k, v in head.items() if k not in _HEAD_KEYS},
                     status=head.get("status", "ok"), error=head.get("error"), source=str(path),
                     origin=head.get("origin", "lockstep"))


def check_steps(record: RunRecord) -> None:
    """The checks every comparison needs (docs/reference/comparison.md#what-is-an-error-exit-1-not-a-verdict);
    raises FormatError naming the file."""
    src = record.source or f"{record.framework}/{record.case}"
    if not record.ok:
        raise FormatError(src, f"the run failed: {record.error or 'no reason recorded'}")
    if not record.steps:
        raise FormatError(src, "holds no step records")
    seen = set()
    for s in record.steps:
        if s.step in seen:
            raise FormatError(src, f"step {s.step} appears twice")
        seen.add(s.step)
        if not (isinstance(s.loss, (int, float)) and math.isfinite(s.loss)):
            raise FormatError(src, f"step {s.step} has a non-finite loss ({s.loss})")
    planned, said = planned_steps(record)
    last = max(s.step for s in record.steps)
    if planned is not None and last < planned:
        raise FormatError(src, f"is incomplete: {said} {planned} steps but it ends at step {last} "
                               "(did the run crash or get killed?)")


def planned_steps(record: RunRecord) -> tuple[int | None, str]:
    """How many steps the run meant to make, and where that is said: a log's `N/M` step lines,
    or the case spec of a lockstep record."""
    planned = record.meta.get("steps_planned")
    if isinstance(planned, int) and not isinstance(planned, bool):
        return planned, "its step lines (N/M) plan"
    spec = record.meta.get("case_spec") or {}
    steps = spec.get("steps") if isinstance(spec, dict) else None
    if record.origin == "lockstep" and isinstance(steps, int) and not isinstance(steps, bool):
        return steps, "its case spec plans"
    return None, ""
