"""A seeded mutator over real run records and real native logs (docs/results): whatever the bytes,
reading and comparing raise nothing but LockstepError, and a PASS never hides a loss that moved
beyond the threshold."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest

from lockstep.compare.policy import THRESHOLDS
from lockstep.compare import CompareOptions, compare_paths
from lockstep.errors import LockstepError
from lockstep.formats.logs import load_run
from lockstep.formats.run_record import check_steps

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
REAL_FILES = sorted(p for p in RESULTS.rglob("*") if p.suffix in (".jsonl", ".log") and p.is_file())
CASES = 400
NUMBER_RE = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
# A loss as a record (`"loss": 10.98`), an llm.c / InfiniTrain line (`train loss 10.98`) or a
# Megatron line (`lm loss: 1.098E+01`) holds it.
LOSS_RE = re.compile(rb'(?:"loss": |train loss |lm loss: )(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)')
# Megatron-LM's own GPT-2 FP32 default applies when a mutation turns a log into an upstream one.
ALLOWED_THRESHOLDS = {*THRESHOLDS.values(), 2e-3}

JUNK = [b"\xff", b"\x00", b"\xc3\x28", b"[1, 2]", b'"x"', b"null", b"true", b"NaN", b"-Infinity", b"1e999",
        b"7" * 7000, b"{}", b"[", b"}", b"\n", b",", b'"step": 3', b'"loss": "1"', b"nan", b"-nan", b"inf",
        b"step 99999999999999999999/3 | train loss 1.0 | lr 1e-4 | (1.0 ms | 1 tok/s)"]


def mutate(data: bytes, rng: random.Random) -> bytes:
    kind = rng.randrange(12)
    losses = list(LOSS_RE.finditer(data))
    if kind >= 9 and losses:  # move one loss by a small or a large amount
        m = rng.choice(losses)
        delta = rng.choice([1e-9, 4e-6, 2e-5, 5e-3, 0.02, 0.5]) * rng.choice([-1, 1])
        return data[:m.start(1)] + repr(float(m.group(1)) + delta).encode() + data[m.end(1):]
    lines = data.split(b"\n")
    if kind == 0 and data:  # flip a byte
        i = rng.randrange(len(data))
        return data[:i] + bytes([rng.randrange(256)]) + data[i + 1:]
    if kind == 1:  # insert junk
        i = rng.randrange(len(data) + 1)
        return data[:i] + rng.choice(JUNK) + data[i:]
    if kind == 2 and data:  # cut a range out (truncation included)
        i = rng.randrange(len(data))
        return data[:i] + data[i + rng.randrange(1, 200):]
    if kind == 3 and len(lines) > 1:  # duplicate, drop or swap lines
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        op = rng.randrange(3)
        if op == 0:
            lines.insert(j, lines[i])
        elif op == 1:
            del lines[i]
        else:
            lines[i], lines[j] = lines[j], lines[i]
        return b"\n".join(lines)
    numbers = list(NUMBER_RE.finditer(data))
    if numbers and kind in (4, 5, 6, 7):  # replace a number: junk, a small or a large change
        m = rng.choice(numbers)
        if kind == 4:
            new = rng.choice(JUNK)
        else:
            try:
                value = float(m.group())
            except ValueError:
                value = 0.0
            delta = rng.choice([1e-9, 3e-6, 2e-5, 5e-3, 0.5, 100.0]) * rng.choice([-1, 1])
            new = repr(value + delta).encode() if kind != 7 or not math.isfinite(value) else str(int(value) + 1).encode()
        return data[:m.start()] + new + data[m.end():]
    return data + rng.choice(JUNK)


def loss_by_step(path: Path) -> dict[int, float] | None:
    try:
        rec = load_run(path)
        check_steps(rec)
    except LockstepError:
        return None
    return {s.step: s.loss for s in rec.steps}


@pytest.mark.skipif(not REAL_FILES, reason="docs/results holds no records or logs")
def test_mutated_records_and_logs_never_raise_and_never_pass_a_moved_loss(tmp_path):
    rng = random.Random(20261130)
    options = CompareOptions(megatron_step2_correction="off")
    passes = fails = errors = 0
    for n in range(CASES):
        original = REAL_FILES[n % len(REAL_FILES)]
        data = original.read_bytes()
        for _ in range(rng.choice([1, 1, 2, 3])):
            data = mutate(data, rng)
        mutated = tmp_path / f"{n}" / original.name
        mutated.parent.mkdir()
        mutated.write_bytes(data)
        try:
            load_run(mutated)
        except LockstepError:
            pass  # anything else propagates and fails the test with its traceback
        report = compare_paths(original, mutated, options)  # never raises for a bad file
        verdict = report.cases[0] if report.cases else None
        if verdict is None or verdict.error:
            errors += 1
            continue
        if not verdict.passed:
            fails += 1
            continue
        passes += 1
        base, test = loss_by_step(original), loss_by_step(mutated)
        assert base is not None and test is not None and set(base) == set(test), mutated
        assert verdict.threshold in ALLOWED_THRESHOLDS
        for step, loss in base.items():
            assert math.isfinite(test[step]) and abs(test[step] - loss) <= verdict.threshold, (mutated, step)
    # The mutator must reach every outcome, or it tests nothing.
    assert passes > 20 and fails > 20 and errors > 20, (passes, fails, errors)
