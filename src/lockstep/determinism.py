"""`lockstep run --repeat N`: is each framework bitwise deterministic on each case?

Repeat 1 of a pair is written where every record lives (`<out>/<fw>/<case>.jsonl`), so the
comparison and the report read it unchanged; repeats 2..N go to
`<out>/repeats/<k>/<fw>/<case>.jsonl`. The analysis reads them back from disk, so it judges what
was written, not what a runner returned. It also pools each pair's tok/s over the repeats
(compare/throughput.py: the pooled median and the spread of the per-repeat medians).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.compare.policy import loss_threshold
from lockstep.compare.throughput import RepeatedThroughput, throughput_over_repeats
from lockstep.errors import LockstepError
from lockstep.formats.run_record import read_run_record

REPEATS_DIR = "repeats"


def repeat_dir(out_dir: str | os.PathLike, k: int) -> Path:
    """Where repeat k (1-based) of a run writes its framework dirs."""
    return Path(out_dir) if k == 1 else Path(out_dir) / REPEATS_DIR / str(k)


def _bits(x: float) -> bytes:
    # Bitwise, not ==: -0.0 == 0.0 and nan != nan, neither of which is what "identical" means here.
    return struct.pack("<d", float(x))


@dataclass
class PairDeterminism:
    framework: str
    case: str
    repeats: int  # how many repeats had a complete record
    bitwise_identical: bool
    max_abs_diff: float  # largest |loss_k - loss_1| over steps and repeats (0.0 when identical)
    max_diff_step: int | None
    max_diff_repeat: int | None
    problems: list[str] = field(default_factory=list)  # repeats that failed or lack steps
    dtype: str | None = None  # from the record's case spec
    throughput: RepeatedThroughput | None = None  # tok/s pooled over the repeats that finished

    def to_json(self) -> dict:
        return {"framework": self.framework, "case": self.case, "repeats": self.repeats,
                "bitwise_identical": self.bitwise_identical, "max_abs_diff": self.max_abs_diff,
                "max_diff_step": self.max_diff_step, "max_diff_repeat": self.max_diff_repeat,
                "problems": self.problems, "dtype": self.dtype,
                "tokens_per_s_over_repeats": self.throughput.to_json() if self.throughput else None}


@dataclass
class DeterminismReport:
    repeats: int
    baseline: str
    pairs: list[PairDeterminism] = field(default_factory=list)

    def warnings(self) -> list[str]:
        """A non-deterministic baseline bounds every comparison against it."""
        out = []
        for p in self.pairs:
            if p.framework == self.baseline and not p.bitwise_identical and p.repeats > 1:
                threshold = loss_threshold(p.case, p.dtype)[0] if p.dtype in ("float32", "bfloat16") else None
                beyond = (f", which exceeds the {p.dtype} threshold {threshold:.0e}: its verdicts at that threshold "
                          "are noise" if threshold is not None and p.max_abs_diff > threshold else "")
                out.append(f"baseline {p.framework} is not deterministic on {p.case}: its own repeats differ by up to "
                           f"{p.max_abs_diff:.3e} (step {p.max_diff_step}); a comparison against it cannot be "
                           f"tighter than that spread{beyond}")
        return out

    def to_json(self) -> dict:
        return {"repeats": self.repeats, "baseline": self.baseline,
                "bitwise_identical": all(p.bitwise_identical for p in self.pairs),
                "pairs": [p.to_json() for p in self.pairs], "warnings": self.warnings()}


def analyse_pair(out_dir: Path, framework: str, case: str, repeats: int) -> PairDeterminism:
    losses: dict[int, list[float]] = {}
    finished = []
    problems = []
    dtype = None
    for k in range(1, repeats + 1):
        path = repeat_dir(out_dir, k) / framework / f"{case}.jsonl"
        try:
            rec = read_run_record(path)
        except LockstepError as e:
            problems.append(f"repeat {k}: {e}")
            continue
        if not rec.ok:
            problems.append(f"repeat {k}: {path}: the run failed: {rec.error}")
            continue
        losses[k] = [s.loss for s in sorted(rec.steps, key=lambda s: s.step)]
        finished.append(rec)
        dtype = dtype or rec.dtype
    result = PairDeterminism(framework, case, len(losses), bitwise_identical=not problems, max_abs_diff=0.0,
                             max_diff_step=None, max_diff_repeat=None, problems=problems, dtype=dtype,
                             throughput=throughput_over_repeats(finished))
    if not losses:
        result.bitwise_identical = False
        return result
    first_k = min(losses)
    ref = losses[first_k]
    for k, other in sorted(losses.items()):
        if k == first_k:
            continue
        if len(other) != len(ref):
            result.bitwise_identical = False
            result.problems.append(f"repeat {k} has {len(other)} steps, repeat {first_k} has {len(ref)}")
        for i, (x, y) in enumerate(zip(ref, other)):
            if _bits(x) != _bits(y):
                result.bitwise_identical = False
                d = abs(x - y)
                if d > result.max_abs_diff or result.max_diff_step is None:
                    result.max_abs_diff, result.max_diff_step, result.max_diff_repeat = d, i + 1, k
    return result


def analyse_repeats(out_dir: str | os.PathLike, pairs: list[tuple[str, str]], repeats: int,
                    baseline: str) -> DeterminismReport:
    """pairs: (framework, case) that ran (not skipped)."""
    report = DeterminismReport(repeats, baseline)
    for framework, case in pairs:
        report.pairs.append(analyse_pair(Path(out_dir), framework, case, repeats))
    return report
