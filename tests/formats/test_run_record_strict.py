"""Run records are read strictly: every malformed row is a FormatError naming the file and line,
never another exception (records come from crashing runs and from other tools)."""

from __future__ import annotations

import json

import pytest

from lockstep.errors import FormatError
from lockstep.formats.run_record import RunRecord, StepRecord, check_steps, read_run_record, write_run_record

META = {"type": "meta", "schema": 1, "framework": "pytorch", "case": "gpt2_1", "status": "ok", "error": None,
        "origin": "lockstep", "case_spec": {"name": "gpt2_1", "dtype": "float32", "steps": 2}}
STEP = {"type": "step", "step": 1, "loss": 10.9, "step_ms": 12.5, "tokens_per_s": 20480.0, "lr": 1e-4}


def lines(*rows) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


def step(**kw) -> dict:
    return {**STEP, **kw}


@pytest.mark.parametrize("content, problem", [
    (b"", "empty run record"),
    (lines(step()), "the first line is not a metadata line"),
    (lines("[1, 2]", step()), "line 1 is a list, not a JSON object"),
    (lines(META, "[1, 2]"), "line 2 is a list, not a JSON object"),
    (lines(META, '"step"'), "line 2 is a string, not a JSON object"),
    (lines(META, "{not json"), "line 2 is not valid JSON"),
    (lines(META, step(step="1")), "line 2: step is a string, not an integer"),
    (lines(META, step(step=1.0)), "line 2: step is a number, not an integer"),
    (lines(META, step(step=True)), "line 2: step is a boolean, not an integer"),
    (lines(META, step(step=0)), "line 2: step 0 is outside 1..1000000000000"),
    (lines(META, '{"type": "step", "step": ' + "7" * 7000 + ', "loss": 1.0}'), "line 2 is not valid JSON"),
    (lines(META, step(step=10**40)), "line 2: step (huge) is outside"),
    (lines(META, {"type": "step", "step": 1}), "line 2: step line without loss"),
    (lines(META, {"type": "step", "loss": 1.0}), "line 2: step line without step"),
    (lines(META, step(norm=1.0)), "line 2: unknown key(s) 'norm' in a step line"),
    (lines(META, step(loss="10.9")), "line 2: loss is a string, not a number"),
    (lines(META, step(loss=None)), "line 2: loss is null, not a number"),
    (lines(META, step(step_ms="fast")), "line 2: step_ms is 'fast', not a finite non-negative number"),
    (lines(META, step(tokens_per_s=float("inf"))), "line 2: tokens_per_s is inf"),
    (lines(META, step(lr=float("nan"))), "line 2: lr is nan"),
    (lines(META, step(step_ms=-1)), "line 2: step_ms is -1"),
    (lines(META, {"type": "note"}), "line 2 is not a step line"),
    (lines(META, step(), step()), "line 3: step 1 appears twice"),
    (lines(META, step(step=2), step(step=1)), "line 3: step 1 comes after step 2"),
    (lines(META, '{"type": "step", "step": 1, "step": 2, "loss": 1.0}'), "key 'step' appears twice"),
    (lines({**META, "status": "maybe"}, step()), "line 1: status 'maybe' is not one of ok, failed"),
    (lines({**META, "framework": 3}, step()), "line 1: framework is an integer, not a string"),
    (lines({**META, "case_spec": [1]}, step()), "line 1: case_spec is a list, not an object"),
    (lines({**META, "case_spec": {"dtype": 32}}, step()), "line 1: case_spec.dtype is 32"),
    (lines({**META, "case_spec": {"tp": "2"}}, step()), "line 1: case_spec.tp is '2'"),
    (lines({**META, "schema": 2}, step()), "line 1: schema 2 is not the schema this lockstep reads"),
    (lines(META, step()).replace(b"10.9", b"10.\xff9"), "is not UTF-8 text: byte 0xff"),
    (b"[" * 100000, "line 1 is nested too deeply"),
])
def test_malformed_records_are_format_errors_naming_file_and_line(tmp_path, content, problem):
    path = tmp_path / "gpt2_1.jsonl"
    path.write_bytes(content)
    with pytest.raises(FormatError) as info:
        read_run_record(path)
    assert info.value.path == str(path) and problem in info.value.problem, info.value.problem


def test_round_trip_and_non_finite_loss_is_kept_for_check_steps(tmp_path):
    path = tmp_path / "gpt2_1.jsonl"
    rec = RunRecord("pytorch", "gpt2_1", [StepRecord(1, 10.9, 12.5, 20480.0, 1e-4), StepRecord(2, float("nan"))],
                    meta={"case_spec": {"dtype": "float32", "steps": 2}})
    write_run_record(path, rec)
    back = read_run_record(path)
    assert back.steps[0] == StepRecord(1, 10.9, 12.5, 20480.0, 1e-4) and back.dtype == "float32"
    with pytest.raises(FormatError, match="step 2 has a non-finite loss"):
        check_steps(back)


def test_a_record_ending_before_its_planned_steps_is_incomplete(tmp_path):
    path = tmp_path / "gpt2_1.jsonl"
    path.write_bytes(lines({**META, "case_spec": {"dtype": "float32", "steps": 4}}, step(), step(step=2)))
    with pytest.raises(FormatError, match="is incomplete: its case spec plans 4 steps but it ends at step 2"):
        check_steps(read_run_record(path))
