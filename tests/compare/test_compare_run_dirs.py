"""`lockstep compare RUN_A RUN_B` of run directories as `lockstep run` leaves them: the repeats of
a `--repeat N` run (issue 36, item 8), and records that did not train from the same inputs (item 7)."""

from __future__ import annotations

import json
from pathlib import Path

from lockstep.cli import main
from lockstep.compare import compare_paths
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record

LOSSES = [10.9 - 0.05 * i for i in range(4)]


def put(path: Path, framework: str, case: str, losses: list[float], **meta) -> None:
    spec = {"name": case, "model": "gpt2-tiny", "dtype": "float32", "micro_batch": 4, "seq_len": 64,
            "total_batch": 256, "steps": len(losses), "lr": 1e-4}
    write_run_record(path, RunRecord(framework, case, [StepRecord(i + 1, x, 25.0, 10240.0) for i, x in
                                                       enumerate(losses)], meta={"case_spec": spec, **meta}))


def repeat_run(run: Path, repeats: int = 3, third: list[float] | None = None) -> Path:
    """A `lockstep run --frameworks pytorch --repeat N` directory."""
    put(run / "pytorch" / "gpt2_1.jsonl", "pytorch", "gpt2_1", LOSSES)
    for k in range(2, repeats + 1):
        put(run / "repeats" / str(k) / "pytorch" / "gpt2_1.jsonl", "pytorch", "gpt2_1",
            third if (k == 3 and third) else LOSSES)
    (run / "run.json").write_text(json.dumps({"schema": "lockstep.run/1", "frameworks": ["pytorch"],
                                              "cases": [{"name": "gpt2_1"}], "status": "finished"}))
    return run


def test_a_repeat_run_compares_with_itself_repeat_by_repeat(tmp_path, capsys):
    # issue 36, item 8: exit 1 "case repeats/gpt2_1 has 2 files" for the folders `golden record` reads.
    run = repeat_run(tmp_path / "ref")
    report = compare_paths(run, run)
    assert report.errors == [] and report.missing == []
    assert [(c.case, c.verdict.value) for c in report.cases] == [
        ("pytorch/gpt2_1", "PASS"), ("repeats/2/pytorch/gpt2_1", "PASS"), ("repeats/3/pytorch/gpt2_1", "PASS")]
    assert main(["compare", str(run), str(run), "--no-history"]) == 0
    assert "has 2 files" not in capsys.readouterr().err


def test_each_repeat_is_paired_with_the_same_repeat_of_the_other_run(tmp_path):
    # Negative control: repeat 3 of the test run parts; only that pair fails, named as such.
    base = repeat_run(tmp_path / "ref")
    test = repeat_run(tmp_path / "new", third=[x + (1e-3 if i == 2 else 0.0) for i, x in enumerate(LOSSES)])
    report = compare_paths(base, test)
    assert {c.case: c.passed for c in report.cases} == {"pytorch/gpt2_1": True, "repeats/2/pytorch/gpt2_1": True,
                                                         "repeats/3/pytorch/gpt2_1": False}
    shorter = repeat_run(tmp_path / "two", repeats=2)  # a run with fewer repeats: the third is missing
    report = compare_paths(base, shorter)
    assert [(m.case, m.missing_from) for m in report.missing] == [("repeats/3/pytorch/gpt2_1", "test")]


def test_records_from_different_initial_weights_are_not_comparable_never_a_fail(tmp_path, capsys):
    # issue 36, item 7: "FAIL unexplained" and a `diagnose --frameworks pytorch,pytorch` that cannot run.
    put(tmp_path / "a" / "gpt2_1.jsonl", "pytorch", "gpt2_1", LOSSES, checkpoint_sha256="a" * 64,
        data_sha256="d" * 64)
    put(tmp_path / "b" / "gpt2_1.jsonl", "pytorch", "gpt2_1", [x + 0.3 for x in LOSSES], checkpoint_sha256="b" * 64,
        data_sha256="d" * 64)
    (case,) = compare_paths(tmp_path / "a", tmp_path / "b").cases
    assert case.verdict.value == "not comparable" and not case.passed and case.diffs == []
    assert case.cause == f"not comparable: initial weights differ (checkpoint sha256 {'a' * 12}… vs {'b' * 12}…)"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--no-history"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "not comparable: initial weights differ" in out and "0 failed" in out and "1 not comparable" in out
    assert "FAIL" not in out and "lockstep diagnose" not in out


def test_tokens_hyper_parameters_and_steps_that_differ_are_named(tmp_path):
    spec_b = {"lr": 1e-3, "total_batch": 512, "steps": 3}
    put(tmp_path / "a" / "gpt2_1.jsonl", "pytorch", "gpt2_1", LOSSES, data_sha256="1" * 64,
        optimizer={"kind": "adam", "lr": 1e-4, "weight_decay": 0.0})
    b = RunRecord("megatron", "gpt2_1", [StepRecord(i + 1, x, 25.0, 10240.0) for i, x in enumerate(LOSSES[:3])],
                  meta={"case_spec": {"name": "gpt2_1", "model": "gpt2-tiny", "dtype": "float32", "micro_batch": 4,
                                      "seq_len": 64, **spec_b}, "data_sha256": "2" * 64,
                        "optimizer": {"kind": "adam", "lr": 1e-3, "weight_decay": 0.1}})
    write_run_record(tmp_path / "b" / "gpt2_1.jsonl", b)
    (case,) = compare_paths(tmp_path / "a", tmp_path / "b").cases
    assert case.cause == (f"not comparable: tokens differ (data sha256 {'1' * 12}… vs {'2' * 12}…); lr 0.0001 vs 0.001; "
                          "total_batch 256 vs 512; steps 4 vs 3; optimizer weight_decay 0.0 vs 0.1")


def test_the_same_inputs_are_judged_and_only_runnable_diagnose_commands_are_suggested(tmp_path, capsys):
    # Negative control: the same weights and tokens are compared as ever, and a FAIL is a FAIL.
    for fw in ("pytorch", "megatron"):
        put(tmp_path / "a" / fw / "gpt2_1.jsonl", fw, "gpt2_1", LOSSES, checkpoint_sha256="a" * 64)
        put(tmp_path / "b" / fw / "gpt2_1.jsonl", fw, "gpt2_1", [x + 1e-3 for x in LOSSES], checkpoint_sha256="a" * 64)
    for run in ("a", "b"):
        (tmp_path / run / "run.json").write_text('{"schema": "lockstep.run/1"}')
    report = compare_paths(tmp_path / "a", tmp_path / "b")
    assert [c.verdict.value for c in report.cases] == ["FAIL unexplained", "FAIL unexplained"]
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--no-history"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    # Both sides of each pair are one framework: no `diagnose --frameworks pytorch,pytorch`.
    assert "lockstep diagnose" not in out and "both sides are pytorch, and diagnose compares two frameworks" in out
    assert main(["compare", str(tmp_path / "a" / "pytorch"), str(tmp_path / "b" / "megatron"), "--no-history"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "lockstep diagnose --case gpt2_1 --frameworks pytorch,megatron" in out


def test_the_report_says_not_comparable_too(tmp_path):
    from lockstep.report import gather
    from lockstep.report import tables

    run = tmp_path / "run"
    put(run / "pytorch" / "gpt2_1.jsonl", "pytorch", "gpt2_1", LOSSES, checkpoint_sha256="a" * 64)
    put(run / "megatron" / "gpt2_1.jsonl", "megatron", "gpt2_1", LOSSES, checkpoint_sha256="b" * 64)
    (run / "run.json").write_text('{"schema": "lockstep.run/1", "frameworks": ["pytorch", "megatron"]}')
    data = gather(run)
    (row,) = tables.verdict_rows(data)
    assert row[tables.VERDICT_HEADER.index("verdict")] == "not comparable"
    assert tables.overall_line(data).startswith("FAIL: 0 passed, 0 failed, 0 missing, 0 errors, 1 not comparable")
