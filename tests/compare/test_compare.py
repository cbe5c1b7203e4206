"""lockstep compare: pairing, filters, thresholds, every bad input of
docs/reference/comparison.md#what-is-an-error-exit-1-not-a-verdict, JSON schema,
summary.json, and the CLI's exit codes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lockstep.cli import main
from lockstep.compare import CompareOptions, compare_paths, compare_run_dir
from lockstep.compare.pairing import collect_cases
from lockstep.errors import FormatError
from lockstep.formats.logs import (LOCKSTEP_MEGATRON_MARKER, infinitrain_step_line,
                                   megatron_iteration_line, perf_step_line)
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record

BASE_LOSSES = [5.356193 - 0.03 * i for i in range(10)]
GLOG = "E20251021 14:16:23.511394 140590029197312 main.cc:262] "


def case_spec(name: str, dtype: str = "float32", steps: int = 10) -> dict:
    return {"name": name, "model": "gpt2", "dtype": dtype, "micro_batch": 4, "seq_len": 64, "total_batch": 256,
            "steps": steps, "lr": 1e-4, "dp": 1, "tp": 1, "pp": 1, "vpp": 1, "sp": False}


def put_record(directory: Path, case: str, losses: list[float], tps: float | list[float] = 1000.0,
               dtype: str | None = "float32", framework: str | None = None, status: str = "ok",
               steps: list[int] | None = None, **meta) -> Path:
    tps_list = tps if isinstance(tps, list) else [tps] * len(losses)
    steps = steps or list(range(1, len(losses) + 1))
    if dtype is not None:
        meta["case_spec"] = case_spec(case, dtype, len(losses))
    rec = RunRecord(framework or directory.name, case,
                    [StepRecord(s, loss, 256 / t * 1000, t) for s, loss, t in zip(steps, losses, tps_list)],
                    meta=meta, status=status, error="worker 0 exited with code 1" if status == "failed" else None)
    path = directory / f"{case}.jsonl"
    write_run_record(path, rec)
    return path


def put_infinitrain_log(directory: Path, case: str, losses: list[float], tps: float = 900.0,
                        steps: list[int] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    steps = steps or list(range(1, len(losses) + 1))
    lines = ["I20251021 14:16:20.000000 140590029197312 main.cc:100] Rank 0: start training"]
    lines += [infinitrain_step_line(GLOG, s, len(losses), loss, 1e-4, 256 / tps * 1000, tps, 100, 200)
              for s, loss in zip(steps, losses)]
    path = directory / f"{case}.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def put_megatron_lm_log(directory: Path, case: str, true_losses: list[float], step_ms: float = 500.0,
                        lockstep_written: bool = False) -> Path:
    """An upstream Megatron-LM log logs iteration 2 as the mean of 1 and 2; lockstep's runner does not."""
    directory.mkdir(parents=True, exist_ok=True)
    logged = list(true_losses)
    lines = ["    seq_length ...................................... 64"]
    if lockstep_written:
        lines = ["[COMMAND] torchrun ...", f"[INFO] {LOCKSTEP_MEGATRON_MARKER}", "[CONFIG] seq=64"]
    else:
        logged[1] = (true_losses[0] + true_losses[1]) / 2
    for i, loss in enumerate(logged, start=1):
        lines.append(megatron_iteration_line("2026-09-10 03:40:58.636444", i, len(logged), 4 * i, step_ms, 1e-4, 4, loss))
        if lockstep_written:
            lines.append(perf_step_line(i, len(logged), step_ms, 256 / step_ms * 1000))
    path = directory / f"{case}.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def shifted(losses: list[float], delta: float, at: int | None = None) -> list[float]:
    return [x + (delta if at is None or i + 1 == at else 0.0) for i, x in enumerate(losses)]


@pytest.fixture
def dirs(tmp_path):
    b, t = tmp_path / "run" / "pytorch", tmp_path / "run" / "infinitrain"
    b.mkdir(parents=True)
    t.mkdir(parents=True)
    return b, t


# ---------------------------------------------------------------- pairing

def test_record_preferred_over_log_and_non_case_files_ignored(dirs):
    b, _ = dirs
    put_record(b, "gpt2_1", BASE_LOSSES)
    (b / "gpt2_1.log").write_text("the native log of the same run\n")
    for name in ("build.log", "build_cuda.log", "ctest_gpt2.log", "gpt2_1_profile.log", "run_metadata.log",
                 "notes.txt"):
        (b / name).write_text("not a case\n")
    (b / "build").mkdir()
    (b / "build" / "gpt2_9.log").write_text("x\n")
    tree = collect_cases(b)
    assert set(tree.files) == {"gpt2_1"}
    assert tree.files["gpt2_1"].path.name == "gpt2_1.jsonl"
    assert not tree.conflicts


def test_two_files_with_one_case_name_in_a_tree_is_an_error(tmp_path, dirs):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES)
    put_infinitrain_log(t / "a", "gpt2_1", BASE_LOSSES)
    put_infinitrain_log(t / "b", "gpt2_1", BASE_LOSSES)
    report = compare_paths(b, t)
    assert not report.passed
    assert len(report.errors) == 1 and "gpt2_1 has 2 files" in report.errors[0].message
    assert str(t / "a" / "gpt2_1.log") in report.errors[0].message


def test_single_files_and_file_against_directory(dirs):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES)
    put_record(b, "gpt2_2", BASE_LOSSES)
    log = put_infinitrain_log(t, "gpt2_1", BASE_LOSSES)
    report = compare_paths(b / "gpt2_1.jsonl", log)
    assert report.passed and [c.case for c in report.cases] == ["gpt2_1"]
    # A file against a tree compares that case only: gpt2_2 is not "missing".
    report = compare_paths(b, log)
    assert report.passed and [c.case for c in report.cases] == ["gpt2_1"] and not report.missing
    # Two files of different names are still one comparison.
    other = put_infinitrain_log(t / "x", "renamed", BASE_LOSSES)
    report = compare_paths(b / "gpt2_1.jsonl", other)
    assert report.passed and report.cases[0].case == "gpt2_1 vs renamed"


# ---------------------------------------------------------------- filters

def test_include_prefix_and_include_cases(dirs):
    b, t = dirs
    for case in ("gpt2_1", "gpt2_2", "llama3_1"):
        put_record(b, case, BASE_LOSSES)
        put_infinitrain_log(t, case, BASE_LOSSES)
    assert [c.case for c in compare_paths(b, t, CompareOptions(include_prefixes=("llama",))).cases] == ["llama3_1"]
    opts = CompareOptions(include_cases=("gpt2_2",), include_prefixes=("llama",))
    assert [c.case for c in compare_paths(b, t, opts).cases] == ["gpt2_2", "llama3_1"]
    report = compare_paths(b, t, CompareOptions(include_cases=("gpt2_9",)))
    assert not report.passed and "gpt2_9" in report.errors[0].message
    report = compare_paths(b, t, CompareOptions(include_prefixes=("qwen",)))
    assert not report.passed and "matches" in report.errors[0].message


# ---------------------------------------------------------------- thresholds

def test_fp32_threshold(dirs):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES)
    put_record(b, "gpt2_2", BASE_LOSSES)
    put_infinitrain_log(t, "gpt2_1", shifted(BASE_LOSSES, 8e-6, at=4))
    put_infinitrain_log(t, "gpt2_2", shifted(BASE_LOSSES, 3e-5, at=7))
    report = compare_paths(b, t)
    v1, v2 = report.cases
    assert v1.passed and v1.threshold == 1e-5 and v1.dtype == "float32"
    assert v1.max_diff_step == 4 and v1.max_abs_diff == pytest.approx(8e-6, abs=1e-6)
    assert not v2.passed and v2.error is None and v2.max_diff_step == 7 and v2.first_failing_step == 7
    assert report.counts == {"passed": 1, "failed": 1, "not_comparable": 0, "speed_only": 0, "missing": 0, "errors": 0,
                             "skipped": 0}
    assert compare_paths(b, t, CompareOptions(threshold_fp32=1e-4)).passed
    # rtol: 3e-5 <= 1e-5 + 1e-5 * |loss ~ 5|
    assert compare_paths(b, t, CompareOptions(rtol=1e-5)).passed


def test_a_records_departure_from_the_contract_is_said_beside_its_verdict(dirs):
    """megatron-te's FP32 records say Transformer Engine's GEMMs are TF32: the FAIL says it too, and its class stays."""
    b, t = dirs
    put_record(b, "gpt2_2", BASE_LOSSES)
    put_record(t, "gpt2_2", shifted(BASE_LOSSES, 3e-5, at=5), framework="megatron-te",
               departures=["its GEMMs are TF32"])
    (case,) = compare_paths(b, t).cases
    assert not case.passed and "test (megatron-te) departs from the contract: its GEMMs are TF32" in case.notes
    put_record(t, "gpt2_2", shifted(BASE_LOSSES, 3e-5, at=5), framework="megatron-te")
    assert not any("departs" in n for n in compare_paths(b, t).cases[0].notes)


def test_bf16_dtype_from_case_name_and_from_case_spec(dirs):
    b, t = dirs
    # No case spec on either side: the name suffix says BF16 (threshold 1e-2).
    put_infinitrain_log(b, "gpt2_1_bfloat16", BASE_LOSSES)
    put_infinitrain_log(t, "gpt2_1_bfloat16", shifted(BASE_LOSSES, 5e-3))
    put_infinitrain_log(b, "gpt2_1_bf16", BASE_LOSSES)
    put_infinitrain_log(t, "gpt2_1_bf16", shifted(BASE_LOSSES, 2e-2))
    report = compare_paths(b, t)
    by = {c.case: c for c in report.cases}
    assert by["gpt2_1_bfloat16"].dtype == "bfloat16" and by["gpt2_1_bfloat16"].passed
    assert by["gpt2_1_bf16"].threshold == 1e-2 and not by["gpt2_1_bf16"].passed
    assert not compare_paths(b, t, CompareOptions(threshold_bf16=1e-3)).cases[0].passed


def test_case_spec_dtype_wins_over_the_name(dirs):
    b, t = dirs
    put_record(b, "custom", BASE_LOSSES, dtype="bfloat16")
    put_infinitrain_log(t, "custom", shifted(BASE_LOSSES, 5e-3))
    v = compare_paths(b, t).cases[0]
    assert v.dtype == "bfloat16" and v.threshold == 1e-2 and v.passed


def test_dtype_disagreement_between_records_is_an_error(dirs):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES, dtype="float32")
    put_record(t, "gpt2_1", BASE_LOSSES, dtype="bfloat16")
    v = compare_paths(b, t).cases[0]
    assert v.error and "dtype" in v.error and str(t / "gpt2_1.jsonl") in v.error


def test_megatron_lm_gpt2_baseline_uses_fp32_2e3(tmp_path):
    base = tmp_path / "megatron"
    put_megatron_lm_log(base, "gpt2_1", BASE_LOSSES)
    put_infinitrain_log(tmp_path / "it", "gpt2_1", shifted(BASE_LOSSES, 1e-3))
    v = compare_paths(base, tmp_path / "it").cases[0]
    assert v.threshold == 2e-3 and v.threshold_source == "megatron-lm gpt2 default" and v.passed
    v = compare_paths(base, tmp_path / "it", CompareOptions(threshold_fp32=1e-5)).cases[0]
    assert v.threshold == 1e-5 and not v.passed
    v = compare_paths(tmp_path / "it", base).cases[0]  # the Megatron-LM log as the test side
    assert v.threshold == 2e-3 and v.passed


# ---------------------------------------------------------------- Megatron-LM step-2 correction

def test_step2_correction_auto_on_off(tmp_path):
    put_megatron_lm_log(tmp_path / "megatron", "gpt2_1", BASE_LOSSES)
    put_record(tmp_path / "pytorch", "gpt2_1", BASE_LOSSES)
    opts = dict(threshold_fp32=1e-5)
    v = compare_paths(tmp_path / "pytorch", tmp_path / "megatron", CompareOptions(**opts)).cases[0]
    assert v.passed and v.test.step2_corrected and any("step-2" in n for n in v.notes)
    v = compare_paths(tmp_path / "pytorch", tmp_path / "megatron",
                      CompareOptions(megatron_step2_correction="off", **opts)).cases[0]
    assert not v.passed and v.max_diff_step == 2 and not v.test.step2_corrected


def test_step2_correction_never_touches_lockstep_megatron_logs_or_records(tmp_path):
    put_megatron_lm_log(tmp_path / "megatron", "gpt2_1", BASE_LOSSES, lockstep_written=True)
    put_record(tmp_path / "megatron_rec", "gpt2_1", BASE_LOSSES, framework="megatron")
    put_record(tmp_path / "pytorch", "gpt2_1", BASE_LOSSES)
    for test_dir in ("megatron", "megatron_rec"):
        for mode in ("auto", "on"):
            v = compare_paths(tmp_path / "pytorch", tmp_path / test_dir,
                              CompareOptions(megatron_step2_correction=mode)).cases[0]
            assert v.passed and not v.test.step2_corrected, (test_dir, mode)
    # lockstep's megatron log has PERF lines for every step, including 1-2.
    v = compare_paths(tmp_path / "pytorch", tmp_path / "megatron").cases[0]
    assert v.test.throughput_steps == list(range(2, 11))


# ---------------------------------------------------------------- bad inputs: errors, not verdicts

@pytest.mark.parametrize("problem", ["one_side_step", "duplicate_step", "nan_loss", "no_records", "failed_record",
                                     "not_a_log"])
def test_bad_inputs_are_errors_naming_the_file(dirs, problem):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES)
    put_record(b, "gpt2_2", BASE_LOSSES)
    put_infinitrain_log(t, "gpt2_2", BASE_LOSSES)  # a good case beside the bad one still gets its verdict
    if problem == "one_side_step":
        bad = put_infinitrain_log(t, "gpt2_1", BASE_LOSSES[:9])
        expect = "lacks step(s) 10"
    elif problem == "duplicate_step":
        bad = put_infinitrain_log(t, "gpt2_1", BASE_LOSSES + [4.0], steps=list(range(1, 11)) + [5])
        expect = "step 5 appears twice"
    elif problem == "nan_loss":
        bad = put_record(t, "gpt2_1", shifted(BASE_LOSSES, math.nan, at=3))
        expect = "non-finite"
    elif problem == "no_records":
        bad = put_record(t, "gpt2_1", [])
        expect = "no step records"
    elif problem == "failed_record":
        bad = put_record(t, "gpt2_1", BASE_LOSSES[:3], status="failed")
        expect = "the run failed: worker 0 exited"
    else:
        bad = t / "gpt2_1.log"
        bad.write_text("Segmentation fault (core dumped)\n")
        expect = "no step records"
    report = compare_paths(b, t)
    assert not report.passed
    by = {c.case: c for c in report.cases}
    assert by["gpt2_2"].passed
    assert by["gpt2_1"].error and expect in by["gpt2_1"].error and str(bad) in by["gpt2_1"].error
    assert report.counts == {"passed": 1, "failed": 0, "not_comparable": 0, "speed_only": 0, "missing": 0, "errors": 1, "skipped": 0}


def test_step_missing_from_the_baseline_names_the_baseline(dirs):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES[:8])
    put_infinitrain_log(t, "gpt2_1", BASE_LOSSES)
    v = compare_paths(b, t).cases[0]
    assert v.error.startswith(str(b / "gpt2_1.jsonl")) and "9-10" in v.error


def test_case_on_one_side_only_is_missing(dirs):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES)
    put_record(b, "gpt2_2", BASE_LOSSES)
    put_infinitrain_log(t, "gpt2_1", BASE_LOSSES)
    put_infinitrain_log(t, "gpt2_3", BASE_LOSSES)
    report = compare_paths(b, t)
    assert not report.passed
    assert {(m.case, m.missing_from) for m in report.missing} == {("gpt2_2", "test"), ("gpt2_3", "baseline")}
    assert report.summary_line() == "1 passed, 0 failed, 2 missing, 0 errors"


def test_empty_directory_is_an_error_and_absent_path_raises(tmp_path, dirs):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES)
    report = compare_paths(b, t)
    assert not report.passed and str(t) in report.errors[0].message
    with pytest.raises(FormatError):
        compare_paths(b, tmp_path / "nowhere")


# ---------------------------------------------------------------- throughput and JSON

def test_throughput_means_after_warmup_and_ratio(dirs):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES, tps=[1.0] + [1000.0] * 9)
    put_record(t, "gpt2_1", BASE_LOSSES, tps=[5.0] + [500.0] * 9)
    v = compare_paths(b, t).cases[0]
    assert v.baseline.tokens_per_s_mean == 1000.0 and v.test.tokens_per_s_mean == 500.0
    assert v.throughput_ratio == 0.5 and v.throughput_passed is None and v.passed
    assert v.baseline.throughput_steps == list(range(2, 11))
    v = compare_paths(b, t, CompareOptions(warmup_steps=0)).cases[0]
    assert v.baseline.tokens_per_s_mean == pytest.approx(9001 / 10)
    v = compare_paths(b, t, CompareOptions(min_tps_ratio=0.8)).cases[0]
    assert v.loss_passed and v.throughput_passed is False and not v.passed
    assert compare_paths(b, t, CompareOptions(min_tps_ratio=0.4)).passed


def test_json_schema(dirs):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES)
    put_infinitrain_log(t, "gpt2_1", BASE_LOSSES)
    put_record(b, "gpt2_2", BASE_LOSSES)
    doc = json.loads(json.dumps(compare_paths(b, t).to_json()))
    assert set(doc) >= {"passed", "cases", "missing", "errors"}
    assert doc["passed"] is False
    (case,) = doc["cases"]
    assert set(case) >= {"case", "dtype", "threshold", "max_abs_diff", "max_diff_step", "passed", "steps", "baseline",
                         "test", "throughput_ratio", "error"}
    assert case["case"] == "gpt2_1" and case["dtype"] == "float32" and case["threshold"] == 1e-5
    assert case["passed"] is True and case["steps"] == 10 and case["error"] is None
    assert case["baseline"]["losses"] == BASE_LOSSES and case["test"]["losses"] == pytest.approx(BASE_LOSSES, abs=1e-6)
    assert case["baseline"]["tokens_per_s_mean"] == 1000.0 and case["test"]["tokens_per_s_mean"] == 900.0
    assert case["throughput_ratio"] == pytest.approx(0.9)
    assert doc["missing"][0]["case"] == "gpt2_2"


def test_compare_run_dir_writes_summary(tmp_path):
    run = tmp_path / "run"
    meta = {"device": "cpu", "device_name": "x86_64", "lockstep_commit": "abc123", "framework_version": "torch 2.13"}
    put_record(run / "pytorch", "gpt2_1", BASE_LOSSES, **meta)
    put_record(run / "megatron", "gpt2_1", BASE_LOSSES, **{**meta, "framework_version": "megatron-core 0.16"})
    put_infinitrain_log(run / "infinitrain", "gpt2_1", shifted(BASE_LOSSES, 1e-3))
    summary = compare_run_dir(run, "pytorch", CompareOptions())
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert summary["passed"] is False
    pairs = {(c["baseline_framework"], c["test_framework"]): c for c in summary["comparisons"]}
    assert set(pairs) == {("pytorch", "megatron"), ("pytorch", "infinitrain")}
    assert pairs[("pytorch", "megatron")]["passed"] and not pairs[("pytorch", "infinitrain")]["passed"]
    md = summary["metadata"]
    assert md["device"] == "cpu" and md["lockstep_commit"] == "abc123"
    assert md["frameworks"]["megatron"]["framework_version"] == "megatron-core 0.16"
    # A second call rewrites it, it does not read its own summary as a case.
    assert compare_run_dir(run, "pytorch")["frameworks"] == ["infinitrain", "megatron", "pytorch"]


def test_compare_run_dir_with_one_framework_has_nothing_to_judge(tmp_path):
    run = tmp_path / "run"
    put_record(run / "pytorch", "gpt2_1", BASE_LOSSES)
    summary = compare_run_dir(run, "pytorch")
    assert summary["passed"] is None and summary["comparisons"] == []


# ---------------------------------------------------------------- CLI exit codes

def test_cli_exit_0_on_pass_and_json(dirs, tmp_path, capsys):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES)
    put_infinitrain_log(t, "gpt2_1", BASE_LOSSES)
    out_json = tmp_path / "out" / "cmp.json"
    assert main(["compare", str(b), str(t), "--json", str(out_json)]) == 0
    out, err = capsys.readouterr()
    assert "PASS" in out and "1 passed, 0 failed, 0 missing, 0 errors" in out and "tok/s" in out
    assert err == ""
    assert json.loads(out_json.read_text())["passed"] is True


def test_cli_exit_1_on_failure_shows_the_step_series(dirs, capsys):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES)
    put_infinitrain_log(t, "gpt2_1", shifted(BASE_LOSSES, 1e-3, at=6))
    assert main(["compare", str(b), str(t)]) == 1
    out, err = capsys.readouterr()
    assert "FAIL" in out and "first failing step 6" in out and "0 passed, 1 failed" in out
    assert "Traceback" not in err


def test_cli_exit_1_on_bad_input_without_traceback(dirs, capsys):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES)
    (t / "gpt2_1.log").write_text("nothing useful\n")
    assert main(["compare", str(b), str(t)]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "gpt2_1.log" in err and "0 passed, 0 failed, 0 missing, 1 errors" in out


def test_cli_exit_1_on_missing_case(dirs, capsys):
    b, t = dirs
    put_record(b, "gpt2_1", BASE_LOSSES)
    put_record(b, "gpt2_2", BASE_LOSSES)
    put_infinitrain_log(t, "gpt2_1", BASE_LOSSES)
    assert main(["compare", str(b), str(t)]) == 1
    assert "1 missing" in capsys.readouterr().out
    assert main(["compare", str(b), str(t), "--include-cases", "gpt2_1"]) == 0


@pytest.mark.parametrize("argv", [["--threshold-fp32", "abc"], ["--threshold-bf16", "-1"], ["--warmup-steps", "-1"],
                                  ["--megatron-step2-correction", "maybe"], ["--seq-length", "0"]])
def test_cli_usage_errors_exit_2(dirs, capsys, argv):
    b, t = dirs
    with pytest.raises(SystemExit) as e:
        main(["compare", str(b), str(t), *argv])
    assert e.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_cli_absent_path_exits_2(dirs, tmp_path, capsys):
    b, _ = dirs
    assert main(["compare", str(b), str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "Traceback" not in err


def test_cli_megatron_lm_log_with_seq_length_and_step2_options(tmp_path, capsys):
    put_record(tmp_path / "pytorch", "gpt2_1", BASE_LOSSES)
    log = put_megatron_lm_log(tmp_path / "mlm", "gpt2_1", BASE_LOSSES)
    log.write_text("\n".join(line for line in log.read_text().splitlines() if "seq_length" not in line) + "\n")
    args = ["compare", str(tmp_path / "pytorch"), str(tmp_path / "mlm"), "--threshold-fp32", "1e-5"]
    assert main(args + ["--seq-length", "64", "--json", str(tmp_path / "a.json")]) == 0
    case = json.loads((tmp_path / "a.json").read_text())["cases"][0]
    assert case["test"]["throughput_steps"] == list(range(3, 11))
    assert case["test"]["tokens_per_s_mean"] == pytest.approx(4 * 64 / 0.5)
    assert main(args + ["--megatron-step2-correction", "off"]) == 1
    capsys.readouterr()


def test_sequence_parallel_fp32_cases_use_the_seeds_2e_2(tmp_path):
    """docs/reference/case-matrices.md#thresholds / issue 11: an FP32 case named `_sp_` compares at 2e-2, others at 1e-5."""
    from lockstep.compare.comparison import compare_paths
    from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record

    for side, loss2 in (("base", 10.0), ("test", 10.015)):
        for case in ("qwen3_tp8_sp_fp32", "qwen3_tp8_fp32"):
            rec = RunRecord(framework=side, case=case, steps=[StepRecord(1, 11.0), StepRecord(2, loss2)],
                            meta={"case_spec": {"dtype": "float32"}})
            (tmp_path / side).mkdir(exist_ok=True)
            write_run_record(tmp_path / side / f"{case}.jsonl", rec)
    report = compare_paths(tmp_path / "base", tmp_path / "test")
    verdicts = {c.case: (c.threshold, c.passed) for c in report.cases}
    assert verdicts["qwen3_tp8_sp_fp32"] == (2e-2, True)
    assert verdicts["qwen3_tp8_fp32"] == (1e-5, False)


def test_a_reference_trained_at_its_dp_layout_is_said_in_the_notes(tmp_path):
    layout = "DP2 (TP/SP/PP do not change the contract's arithmetic)"
    put_record(tmp_path / "pytorch", "gpt2_4", BASE_LOSSES, reference_layout=layout)
    put_record(tmp_path / "megatron", "gpt2_4", BASE_LOSSES)
    v = compare_paths(tmp_path / "pytorch", tmp_path / "megatron").cases[0]
    assert v.passed and f"baseline (pytorch) reference_layout: {layout}" in v.notes
    # Negative control: a record trained at its own layout adds no such note.
    put_record(tmp_path / "pytorch2", "gpt2_4", BASE_LOSSES, framework="pytorch")
    v = compare_paths(tmp_path / "pytorch2", tmp_path / "megatron").cases[0]
    assert v.passed and not any("reference_layout" in n for n in v.notes)
