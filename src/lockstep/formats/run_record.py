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
from lockstep.fsutil import atomic_write

RECORD_SCHEMA = 1


@dataclass
class StepRecord:
    step: int  # 1-based
    loss: float
    step_ms: float | None = None
    tokens_per_s: float | None = None
    lr: float | None = None
    peak_mem_mb: float | None = None

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

    def mean_tokens_per_s(self, warmup_steps: int = 1) -> float | None:
        """Mean tok/s over the steps after warm-up (SPEC section 4: averages use steps 2..N)."""
        vals = [s.tokens_per_s for s in self.steps if s.step > warmup_steps and s.tokens_per_s is not None]
        return sum(vals) / len(vals) if vals else None

    def mean_step_ms(self, warmup_steps: int = 1) -> float | None:
        vals = [s.step_ms for s in self.steps if s.step > warmup_steps and s.step_ms is not None]
        return sum(vals) / len(vals) if vals else None


def write_run_record(path: str | os.PathLike, record: RunRecord) -> None:
    head = {"type": "meta", "schema": RECORD_SCHEMA, "framework": record.framework, "case": record.case,
            "status": record.status, "error": record.error, "origin": record.origin, **record.meta}
    with atomic_write(path, "w") as f:
        f.write(json.dumps(head, sort_keys=False, allow_nan=True) + "\n")
        for s in record.steps:
            f.write(json.dumps({"type": "step", **s.to_dict()}, allow_nan=True) + "\n")


_HEAD_KEYS = {"type", "schema", "framework", "case", "status", "error", "origin"}


def read_run_record(path: str | os.PathLike) -> RunRecord:
    path = Path(path)
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    except FileNotFoundError:
        raise FormatError(path, "no such file") from None
    if not lines:
        raise FormatError(path, "empty run record (no metadata line)")
    try:
        rows = [json.loads(ln) for ln in lines]
    except json.JSONDecodeError as e:
        raise FormatError(path, f"not a lockstep run record: line {e.doc and lines.index(e.doc) + 1 or '?'} is not JSON ({e.msg})") from None
    head = rows[0]
    if not isinstance(head, dict) or head.get("type") != "meta":
        raise FormatError(path, "not a lockstep run record: the first line is not a metadata line")
    steps = []
    for i, row in enumerate(rows[1:], start=2):
        if row.get("type") != "step":
            raise FormatError(path, f"line {i} is not a step line")
        try:
            steps.append(StepRecord(**{k: v for k, v in row.items() if k != "type"}))
        except TypeError as e:
            raise FormatError(path, f"line {i}: bad step line ({e})") from None
    return RunRecord(framework=head.get("framework", "?"), case=head.get("case", path.stem), steps=steps,
                     meta={k: v for k, v in head.items() if k not in _HEAD_KEYS},
                     status=head.get("status", "ok"), error=head.get("error"), source=str(path),
                     origin=head.get("origin", "lockstep"))


def check_steps(record: RunRecord) -> None:
    """The checks every comparison needs (SPEC section 7); raises FormatError naming the file."""
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
