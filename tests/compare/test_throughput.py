"""Throughput statistics, MFU and the noisy flag on fixed inputs (compare/throughput.py), and
that summary.json, `lockstep compare` and the report all show them."""

from __future__ import annotations

import json
import math

import pytest

from lockstep.cli import main
from lockstep.compare import compare_paths
from lockstep.compare.options import CompareOptions
from lockstep.compare.throughput import (Spread, Throughput, device_peak_tflops, format_memory, format_mfu,
                                         format_repeated_tokens_per_s, format_roofline, format_tokens_per_s,
                                         overall_tokens_per_s, throughput_of, throughput_over_repeats, throughput_ratio)
from lockstep.formats.run_record import RunRecord, StepRecord, read_run_record, write_run_record
from lockstep.models import SHAPES
from lockstep.report import write_report

SPEC = {"name": "gpt2_2", "model": "gpt2", "dtype": "bfloat16", "micro_batch": 80, "seq_len": 64,
        "total_batch": 5120, "steps": 5, "lr": 1e-4, "dp": 1, "tp": 1, "pp": 1}


def record(tps: list[float], *, device="cuda", device_name="NVIDIA H200", spec=SPEC, meta=None) -> RunRecord:
    steps = [StepRecord(i + 1, 10.0 - 0.1 * i, spec["total_batch"] / t * 1e3, t, 1e-4, 500.0 + i)
             for i, t in enumerate(tps)]
    return RunRecord("pytorch", spec["name"], steps, meta={
        "case_spec": spec, "model": {"name": "gpt2", **SHAPES["gpt2"].config.to_dict()}, "device": device,
        "device_name": device_name, **(meta or {})})


def test_spread_of_fixed_values():
    s = Spread.of([2, 3, 4, 5], [100.0, 110.0, 90.0, 100.0])
    assert (s.median, s.mean, s.min, s.max) == (100.0, 100.0, 90.0, 110.0)
    assert s.cv == pytest.approx(math.sqrt(200 / 3) / 100)  # sample standard deviation / mean = 0.0816
    assert not s.noisy
    assert Spread.of([2, 3, 4], [100.0, 200.0, 100.0]).noisy  # CV 0.43
    assert Spread.of([2], [5.0]).cv == 0.0 and Spread.of([], []) is None


def test_throughput_pooled_over_repeats():
    # Step 1 of each repeat is warm-up; the pooled median is over all nine measured steps.
    repeats = [record([1.0, 100.0, 110.0, 120.0]), record([1.0, 90.0, 95.0, 100.0]), record([9.0, 200.0, 210.0, 220.0])]
    t = throughput_over_repeats(repeats)
    assert t.repeats == 3 and t.medians == (110.0, 95.0, 210.0)
    assert t.pooled.median == 110.0 and (t.pooled.min, t.pooled.max) == (90.0, 220.0) and len(t.pooled.steps) == 9
    m = t.repeat_medians
    assert (m.median, m.min, m.max) == (110.0, 95.0, 210.0) and m.cv == pytest.approx(62.517 / 138.333, abs=1e-4)
    assert t.noisy and format_repeated_tokens_per_s(t) == "110 (repeats 95-210 ±45%) NOISY"
    steady = throughput_over_repeats([record([1.0, 100.0, 100.0]), record([1.0, 101.0, 101.0])])
    assert not steady.noisy and format_repeated_tokens_per_s(steady) == "100 (repeats 100-101 ±1%)"
    assert steady.to_json()["repeat_medians"]["values"] == [100.0, 101.0]
    assert throughput_over_repeats([record([5.0])]) is None and format_repeated_tokens_per_s(None) == "-"


def test_flops_per_token_palm_convention():
    gpt2 = SHAPES["gpt2"].config
    # 6 x 123,689,472 (all parameters but wpe; the tied wte counts once) + 12 x L12 x T64 x C768
    assert gpt2.matmul_parameters() == 123_689_472
    assert gpt2.flops_per_token(64) == 6 * 123_689_472 + 12 * 12 * 64 * 768 == 749_214_720
    llama = SHAPES["llama3"].config  # untied: the input embedding is a lookup, lm_head a matmul
    assert llama.matmul_parameters() == llama.num_parameters() - 128256 * 2048
    assert llama.flops_per_token(64) == 6 * llama.matmul_parameters() + 12 * 16 * 64 * 2048
    qwen = SHAPES["qwen3-1.7b"].config
    assert qwen.flops_per_token(1024) == 6 * (qwen.num_parameters() - 151936 * 2048) + 12 * 28 * 1024 * 2048


def test_median_spread_and_mfu_over_steps_after_warmup():
    # Step 1 (warm-up, 1,000 tok/s) is left out; steps 2..5 all 100,000 tok/s.
    t = throughput_of(record([1000.0, 100000.0, 100000.0, 100000.0, 100000.0]))
    assert t.tokens_per_s.steps == (2, 3, 4, 5) and t.tokens_per_s.median == 100000.0 and t.tokens_per_s.cv == 0.0
    assert t.peak_tflops == 989.5 and t.devices == 1  # H200, bf16 dense
    assert t.model_tflops == pytest.approx(749_214_720 * 1e5 / 1e12)
    assert t.mfu == pytest.approx(749_214_720 * 1e5 / 989.5e12)  # 7.57%
    assert format_mfu(t) == "7.6%"
    assert t.peak_allocated_mb == 504.0  # max of the steps' peaks when the record states no run peak


def test_peak_for_dtype_devices_and_override():
    assert device_peak_tflops("NVIDIA H200", "float32") == 66.9
    assert device_peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.5
    assert device_peak_tflops("NVIDIA A100-SXM4-80GB", "float32") == 19.5
    assert device_peak_tflops("x86_64", "float32") is None
    fp32_dp2 = {**SPEC, "dtype": "float32", "dp": 2}
    t = throughput_of(record([1.0, 2e4, 2e4], spec=fp32_dp2))
    assert t.devices == 2 and t.mfu == pytest.approx(749_214_720 * 2e4 / (66.9e12 * 2))
    cpu = record([1.0, 2e4, 2e4], device="cpu", device_name="x86_64")
    assert throughput_of(cpu).mfu is None and format_mfu(throughput_of(cpu)) == "-"
    forced = throughput_of(cpu, peak_tflops=1.0)
    assert forced.mfu == pytest.approx(749_214_720 * 2e4 / 1e12) and forced.peak_tflops_source == "--peak-tflops"


def test_peak_memory_from_run_meta_and_infinitrain_tail():
    t = throughput_of(record([1.0, 2.0], meta={"peak_memory_mb": {"allocated": 1234.5, "reserved": 2048.0}}))
    assert (t.peak_allocated_mb, t.peak_reserved_mb) == (1234.5, 2048.0)
    assert format_memory(t) == "1,234 / 2,048 MB"
    infinitrain = throughput_of(record([1.0, 2.0], meta={"peak_reserved_mb": 4096.0}))
    assert (infinitrain.peak_allocated_mb, infinitrain.peak_reserved_mb) == (501.0, 4096.0)


def test_noisy_flag_in_table_text_and_json_round_trip():
    noisy = throughput_of(record([1.0, 100.0, 200.0, 100.0, 90.0]))
    assert noisy.noisy and format_tokens_per_s(noisy).endswith("NOISY")
    steady = throughput_of(record([1.0, 100.0, 101.0, 99.0, 100.0]))
    assert format_tokens_per_s(steady) == "100 ±1%"
    back = Throughput.from_json(json.loads(json.dumps(noisy.to_json())))
    assert back == noisy and back.mfu == noisy.mfu


def test_summary_compare_and_report_show_spread_and_noisy(tmp_path, capsys):
    run = tmp_path / "run"
    write_run_record(run / "pytorch" / "gpt2_2.jsonl", record([1.0, 100.0, 101.0, 99.0, 100.0]))
    noisy = record([1.0, 100.0, 200.0, 100.0, 90.0])
    noisy.framework = "megatron"
    write_run_record(run / "megatron" / "gpt2_2.jsonl", noisy)
    verdict = compare_paths(run / "pytorch", run / "megatron").cases[0].to_json()
    assert verdict["test"]["throughput"]["noisy"] is True and verdict["baseline"]["throughput"]["noisy"] is False
    assert verdict["test"]["throughput"]["tokens_per_s"]["median"] == 100.0
    assert main(["compare", str(run / "pytorch"), str(run / "megatron")]) == 0
    out = capsys.readouterr().out
    assert "NOISY" in out and "100 ±1%" in out
    _, md = write_report(run, "pytorch", CompareOptions())
    text = md.read_text()
    assert "## Throughput" in text and "| gpt2_2 | megatron | 100 | 90 | 200 |" in text and "NOISY" in text


# Steps 2..10 of 5,120 tokens: the baseline at 1,000 tok/s (5.12 s a step); the test the same but
# for one step of 100,000 tok/s (51.2 ms). The mean of step rates calls the test 12x faster; over
# the 41.0112 s the test took for its 46,080 tokens it is 1.12x.
ONE_FAST_STEP = ([1.0] + [1000.0] * 9, [1.0] + [1000.0] * 8 + [100000.0])
HEADLINE = 46080 / (8 * 5.12 + 0.0512) / 1000.0


def test_headline_ratio_is_tokens_over_time_not_a_mean_of_step_rates():
    base, test = (record(tps) for tps in ONE_FAST_STEP)
    assert overall_tokens_per_s(base) == pytest.approx(1000.0)
    assert overall_tokens_per_s(test) == pytest.approx(1123.59, abs=0.01)
    ratio = throughput_ratio(base, test)
    assert ratio.overall == pytest.approx(HEADLINE) and ratio.overall == pytest.approx(1.1236, abs=1e-4)
    assert ratio.mean_of_steps == pytest.approx(12.0)
    # A log that states no step times: the harmonic mean of tok/s, the same quotient for equal steps.
    for s in test.steps:
        s.step_ms = None
    assert overall_tokens_per_s(test) == pytest.approx(1123.59, abs=0.01)


def test_every_output_shows_the_headline_and_the_seed_scripts_ratio(tmp_path, capsys):
    from rich.console import Console

    from lockstep.commands.run import print_comparison

    run = tmp_path / "run"
    base, test = (record(tps) for tps in ONE_FAST_STEP)
    test.framework = "megatron"
    write_run_record(run / "pytorch" / "gpt2_2.jsonl", base)
    write_run_record(run / "megatron" / "gpt2_2.jsonl", test)
    case = compare_paths(run / "pytorch", run / "megatron").to_json()["cases"][0]
    assert case["throughput_ratio"] == pytest.approx(HEADLINE)
    assert case["throughput_ratio_mean_of_steps"] == pytest.approx(12.0)
    assert case["throughput_ratio_definition"].startswith("test / baseline: tokens / time over the steps after")
    assert case["test"]["tokens_per_s_overall"] == pytest.approx(1123.59, abs=0.01)
    assert case["test"]["tokens_per_s_mean"] == pytest.approx(12000.0)
    assert main(["compare", str(run / "pytorch"), str(run / "megatron")]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("│ gpt2_2 │ DP=1"))
    assert [c.strip() for c in row.split("│")[5:7]] == ["1.124", "12.000"] and "scripts)" in out
    _, md = write_report(run, "pytorch", CompareOptions())
    text = md.read_text()
    assert "test/baseline (tokens ÷ time) | test/baseline (mean of steps 2..N, as the seed scripts) |" in text
    assert "| 1.124 | 12.000 |" in text
    console = Console(record=True, width=400)
    old = {k: v for k, v in case.items() if not k.startswith("throughput_ratio_mean")}  # a summary from before
    print_comparison(console, {"comparisons": [{"test_framework": "megatron", "baseline_framework": "pytorch",
                                                "cases": [case, {**old, "case": "gpt2_old"}]}]})
    lines = console.export_text().splitlines()
    assert "ratio (tokens ÷ time)" in lines[2] and "ratio (mean of steps 2..N, as the seed scripts)" in lines[2]
    new_row = next(line for line in lines if "gpt2_2" in line)
    old_row = next(line for line in lines if "gpt2_old" in line)
    assert [c.strip() for c in new_row.split("│")[10:12]] == ["1.12", "12.00"]
    assert [c.strip() for c in old_row.split("│")[10:12]] == ["1.12", "-"]


def test_dense_peak_table_by_part_and_dtype():
    assert device_peak_tflops("NVIDIA GH200 480GB", "bfloat16") == 989.5  # not taken for an H200 NVL
    assert device_peak_tflops("NVIDIA H200 NVL", "bfloat16") == 835.5 and device_peak_tflops("NVIDIA H200 NVL", "float32") == 60.0
    assert device_peak_tflops("NVIDIA H100 PCIe", "float32") == 51.2 and device_peak_tflops("NVIDIA H100 PCIe", "bfloat16") == 756.0
    assert device_peak_tflops("NVIDIA H100 NVL", "bfloat16") == 835.5
    assert device_peak_tflops("NVIDIA H100 80GB HBM3", "float32", tf32=True) == 494.5
    assert device_peak_tflops("NVIDIA A100 80GB PCIe", "float32", tf32=True) == 156.0
    assert device_peak_tflops("NVIDIA L40S", "bfloat16") == 362.05 and device_peak_tflops("NVIDIA L40", "bfloat16") == 181.05
    assert device_peak_tflops("NVIDIA L4", "float32") == 30.3
    assert device_peak_tflops("NVIDIA A10G", "bfloat16") is None  # not an A100: no peak rather than a wrong one
    assert device_peak_tflops(None, "float32") is None


def _run_with_roofline(tmp_path):
    """A run directory whose run.json holds gpt2_2's roofline: 80 x 64 tokens in 0.02 s = 256,000 tok/s."""
    from lockstep.roofline import RUN_JSON_KEY, ShapeRoofline

    run = tmp_path / "run"
    write_run_record(run / "pytorch" / "gpt2_2.jsonl", record([1.0, 1e5, 1e5, 1e5, 1e5]))
    slower = record([1.0, 8e4, 8e4, 8e4, 8e4])
    slower.framework = "megatron"
    write_run_record(run / "megatron" / "gpt2_2.jsonl", slower)
    roofline = ShapeRoofline("NVIDIA H200", "bfloat16", 80, 64, 1, 0.02, 10**12, False, 2.5)
    (run / "run.json").write_text(json.dumps({RUN_JSON_KEY: {"gpt2_2": roofline.to_json()}}))
    return run


def test_share_of_roofline_in_json_compare_and_report(tmp_path, capsys):
    run = _run_with_roofline(tmp_path)
    t = throughput_of(read_run_record(run / "pytorch" / "gpt2_2.jsonl"))
    assert t.roofline_tokens_per_s == 256_000.0 and t.roofline_fraction == 0.390625
    assert format_roofline(t) == "39% of 256,000" and format_roofline(t, with_limit=False) == "39%"
    assert Throughput.from_json(json.loads(json.dumps(t.to_json()))) == t
    assert format_roofline(throughput_of(record([1.0, 2.0]))) == "-"  # no run.json beside it
    verdict = compare_paths(run / "pytorch", run / "megatron").cases[0].to_json()
    assert verdict["test"]["throughput"]["roofline_fraction"] == 0.3125
    assert verdict["baseline"]["throughput"]["roofline_tokens_per_s"] == 256_000.0
    assert main(["compare", str(run / "pytorch"), str(run / "megatron")]) == 0
    out = capsys.readouterr().out
    assert "% of roofline" in out and "39% / 31%" in out
    _, md = write_report(run, "pytorch", CompareOptions())
    text = md.read_text()
    assert ("| case | framework | tok/s median | min | max | CV | spread | MFU | model TFLOP/s | roofline tok/s "
            "| % of roofline | peak allocated MB | peak reserved MB |") in text
    assert "| gpt2_2 | megatron | 80,000 | 80,000 | 80,000 | 0.0% | ok | 6.1% | 59.94 | 256,000 | 31.2% |" in text
    assert "Roofline tok/s = devices × B·T ÷ the time of the case's own GEMMs" in text


def test_tok_s_over_repeats_against_the_roofline(tmp_path):
    run = _run_with_roofline(tmp_path)
    first = read_run_record(run / "pytorch" / "gpt2_2.jsonl")  # repeat 1 sits in the run directory
    t = throughput_over_repeats([first, record([1.0, 1e5, 1e5, 1e5, 1e5])])
    assert t.roofline_tokens_per_s == 256_000.0 and t.to_json()["roofline_fraction"] == 0.390625
    assert format_repeated_tokens_per_s(t) == "100,000 (repeats 100,000-100,000 ±0%), 39% of roofline"
