"""Pairs that `lockstep run` skipped (run.json) are reported as skipped, never as missing."""

from __future__ import annotations

import json

from lockstep.compare import compare_run_dir
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record
from lockstep.report import write_report


def record(fw, case, losses, dtype="float32"):
    return RunRecord(framework=fw, case=case, meta={"case_spec": {"dtype": dtype}},
                     steps=[StepRecord(step=i + 1, loss=v, step_ms=10.0, tokens_per_s=100.0) for i, v in enumerate(losses)])


def test_skipped_pair_is_not_missing(tmp_path):
    write_run_record(tmp_path / "pytorch" / "gpt2_1.jsonl", record("pytorch", "gpt2_1", [11.0, 10.9]))
    write_run_record(tmp_path / "pytorch" / "gpt2_1_bfloat16.jsonl",
                     record("pytorch", "gpt2_1_bfloat16", [11.0, 10.9], "bfloat16"))
    write_run_record(tmp_path / "megatron" / "gpt2_1.jsonl", record("megatron", "gpt2_1", [11.0, 10.9 + 2e-6]))
    (tmp_path / "run.json").write_text(json.dumps({"skipped": [
        {"case": "gpt2_1_bfloat16", "framework": "megatron", "reason": "needs CUDA"}]}))
    summary = compare_run_dir(tmp_path, "pytorch")
    comp = summary["comparisons"][0]
    assert summary["passed"] is True and comp["missing"] == []
    assert comp["skipped"] == [{"case": "gpt2_1_bfloat16", "reason": "needs CUDA"}]
    _, md = write_report(tmp_path, "pytorch")
    text = md.read_text()
    assert "**PASS: 1 passed" in text and "megatron / gpt2_1_bfloat16: skipped (needs CUDA)" in text
    assert "## Problems" not in text


def test_without_run_json_an_absent_case_is_missing(tmp_path):
    write_run_record(tmp_path / "pytorch" / "a.jsonl", record("pytorch", "a", [1.0]))
    write_run_record(tmp_path / "pytorch" / "b.jsonl", record("pytorch", "b", [1.0]))
    write_run_record(tmp_path / "megatron" / "a.jsonl", record("megatron", "a", [1.0]))
    summary = compare_run_dir(tmp_path, "pytorch")
    assert summary["passed"] is False
    assert [m["case"] for m in summary["comparisons"][0]["missing"]] == ["b"]


def test_everything_skipped_gives_no_verdict(tmp_path):
    write_run_record(tmp_path / "pytorch" / "x_bf16.jsonl", record("pytorch", "x_bf16", [1.0], "bfloat16"))
    (tmp_path / "megatron").mkdir()
    (tmp_path / "megatron" / "placeholder.txt").write_text("")
    (tmp_path / "run.json").write_text(json.dumps({"skipped": [
        {"case": "x_bf16", "framework": "megatron", "reason": "needs CUDA"}]}))
    summary = compare_run_dir(tmp_path, "pytorch")
    assert summary["passed"] is None
