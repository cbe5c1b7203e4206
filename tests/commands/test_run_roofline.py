"""`lockstep run` and the shape roofline: the flag and its default, the pipeline's "roofline"
stage writing run.json's rooflines for the cases that trained, and the terminal's tables showing
MFU and the share of the roofline."""

from __future__ import annotations

import json

from rich.console import Console

from lockstep.cases.spec import CaseSpec
from lockstep.cli import build_parser
from lockstep.compare.options import CompareOptions
from lockstep.commands.run import outcome_table, print_comparison, request_from_args, timing_line
from lockstep.execute import CaseOutcome
from lockstep.formats.run_record import RunRecord, StepRecord, read_run_record, write_run_record
from lockstep.models.gpt2.config import GPT2Config
from lockstep.outdir import open_run_dir
from lockstep.pipeline import RunObserver, RunOutputs, RunResult, RunStages, RunTiming
from lockstep.plan import RunPlan
from lockstep.roofline import RUN_JSON_KEY, ShapeRoofline
from lockstep.runners.base import RunInputs

MICRO = GPT2Config(max_seq_len=8, vocab_size=16, num_layers=1, num_heads=2, channels=8, padded_vocab_size=16)


def _case(name: str) -> CaseSpec:
    return CaseSpec(name=name, model="micro", dtype="float32", micro_batch=1, seq_len=4, total_batch=4, steps=3, lr=1e-4)


def _record(case: str, tps: float, ok: bool = True) -> RunRecord:
    return RunRecord("pytorch", case, [StepRecord(i, 1.0, 1.0, tps) for i in (1, 2, 3)],
                     meta={"device": "cpu"}, status="ok" if ok else "failed")


def test_the_flag_and_its_default_on_cuda_only():
    parser = build_parser()
    base = ["run", "--matrix", "gpt2"]
    assert request_from_args(parser.parse_args(base)).roofline is None
    assert request_from_args(parser.parse_args(base + ["--roofline"])).roofline is True
    assert request_from_args(parser.parse_args(base + ["--no-roofline"])).roofline is False


def _stages(tmp_path, roofline: bool, outcomes: list[CaseOutcome], run_dir) -> RunStages:
    cases = [o.case for o in outcomes]
    inputs = {c.name: RunInputs(checkpoint=tmp_path / "w.bin", tokens=tmp_path / "t.bin", model=MICRO, device="cpu")
              for c in cases}
    plan = RunPlan(out_dir=run_dir.path, device="cpu", cases=cases, inputs=inputs, runners=[], roofline=roofline,
                   cache_dir=tmp_path / "cache")
    return RunStages(plan, CompareOptions(), RunOutputs(report=False), RunObserver(), RunTiming(),
                     RunResult(plan=plan, outcomes=outcomes))


def test_the_roofline_stage_measures_the_cases_that_trained_into_run_json(tmp_path):
    outcomes = [CaseOutcome(_case("a"), "pytorch", _record("a", 10.0)),
                CaseOutcome(_case("a"), "megatron", _record("a", 9.0)),
                CaseOutcome(_case("b"), "pytorch", _record("b", 1.0, ok=False)),
                CaseOutcome(_case("c"), "pytorch", skipped="no GPU")]
    with open_run_dir(tmp_path / "run", ["pytorch", "megatron"], {}) as run_dir:
        stages = _stages(tmp_path, True, outcomes, run_dir)
        stages.measure_rooflines(run_dir)
        rooflines = run_dir.read_manifest()[RUN_JSON_KEY]
        assert set(rooflines) == {"a"}  # b failed, c was skipped: nothing of theirs to set against it
        assert ShapeRoofline.from_json(rooflines["a"]).gemm_seconds > 0
        assert "roofline" in stages.timing.stages
        timing = stages.timing.to_json(outcomes)
        assert f"roofline {timing['stages']['roofline']:.1f}" in timing_line(timing)


def test_no_roofline_asked_for_measures_nothing(tmp_path):
    outcomes = [CaseOutcome(_case("a"), "pytorch", _record("a", 10.0))]
    with open_run_dir(tmp_path / "run", ["pytorch"], {}) as run_dir:
        stages = _stages(tmp_path, False, outcomes, run_dir)
        stages.measure_rooflines(run_dir)
        assert RUN_JSON_KEY not in run_dir.read_manifest() and "roofline" not in stages.timing.stages
    assert not (tmp_path / "cache").exists()


def _render(renderable) -> str:
    console = Console(width=250, record=True)
    console.print(renderable)
    return console.export_text()


def test_the_runs_table_shows_mfu_and_the_share_of_the_roofline(tmp_path):
    run = tmp_path / "run"
    path = run / "pytorch" / "a.jsonl"
    write_run_record(path, _record("a", 100.0))
    roofline = ShapeRoofline("cpu test", "float32", 1, 4, 1, 0.01, 10**6, True, 0.0)  # 400 tok/s
    (run / "run.json").write_text(json.dumps({RUN_JSON_KEY: {"a": roofline.to_json()}}))
    text = _render(outcome_table([CaseOutcome(_case("a"), "pytorch", read_run_record(path)),
                                  CaseOutcome(_case("b"), "megatron", skipped="no GPU")]))
    header = next(line for line in text.splitlines() if "framework" in line)
    assert [c.strip() for c in header.strip("┃│ ").split("┃")][-6:] == [
        "steps", "last loss", "tok/s", "MFU", "% of roofline", "peak memory"]
    row = next(line for line in text.splitlines() if "pytorch" in line)
    assert "100 ±0%" in row and "25% of 400" in row  # the CPU has no peak: MFU "-"


def test_the_comparison_table_shows_both_sides_against_the_limits():
    def side(tps: float, fraction: float | None):
        t = {"tokens_per_s": {"steps": [2, 3], "median": tps, "mean": tps, "min": tps, "max": tps, "cv": 0.0},
             "devices": 1, "flops_per_token": 10**9, "peak_tflops_per_device": 989.5,
             "roofline_tokens_per_s": None if fraction is None else tps / fraction}
        return {"throughput": t}

    summary = {"comparisons": [{"test_framework": "megatron", "baseline_framework": "pytorch", "cases": [
        {"case": "a", "dtype": "bfloat16", "max_abs_diff": 0.0, "max_diff_step": 1, "threshold": 1e-2,
         "verdict": "PASS", "throughput_ratio": 0.5, "baseline": side(1e5, 0.4), "test": side(5e4, 0.2)}]}]}
    console = Console(width=250, record=True)
    print_comparison(console, summary)
    text = console.export_text()
    assert "MFU (b / t)" in text and "% of roofline (b / t)" in text
    assert "10.1% / 5.1%" in text and "40% / 20%" in text
