"""compare on the inputs issue 17 found wanting: FIFOs in a tree, crashed (incomplete) logs,
--include-cases typos, skipped vs missing, run directories, log precision, 100k-step logs."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from lockstep.cli import main
from lockstep.compare import compare_paths
from lockstep.formats.logs import infinitrain_step_line, llmc_step_line

from test_compare import BASE_LOSSES, GLOG, put_infinitrain_log, put_record, shifted


@pytest.fixture
def no_hang():
    """Fail, rather than hang the suite, if something blocks (e.g. opening a FIFO)."""
    def timeout(*_):
        raise AssertionError("compare blocked for 30 s")
    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_fifo_inside_a_tree_is_an_error_not_a_hang(tmp_path, no_hang, capsys):
    b, t = tmp_path / "b", tmp_path / "t"
    for case in ("gpt2_1", "gpt2_2"):
        put_record(b, case, BASE_LOSSES)
    put_infinitrain_log(t, "gpt2_1", BASE_LOSSES)
    os.mkfifo(t / "gpt2_2.log")
    rc, out, err = run_cli(capsys, b, t)
    assert rc == 1 and "1 passed, 0 failed, 0 missing, 1 errors" in out
    assert err.strip() == f"lockstep: error: {t / 'gpt2_2.log'}: is a FIFO, not a log file (only regular files are read)"


def test_a_log_that_stops_before_its_planned_steps_is_incomplete(tmp_path, capsys):
    """The outside check's case: an InfiniTrain log that segfaults after step 2 of 4, against a
    2-step baseline, compared as PASS. Its step lines say 4 are planned."""
    base = put_record(tmp_path / "b", "gpt2_1", BASE_LOSSES[:2])
    log = tmp_path / "t" / "gpt2_1.log"
    log.parent.mkdir()
    log.write_text("\n".join([infinitrain_step_line(GLOG, s, 4, BASE_LOSSES[s - 1], 1e-4, 10.0, 100.0)
                              for s in (1, 2)] + ["Segmentation fault (core dumped)"]) + "\n")
    rc, out, err = run_cli(capsys, base, log, "--json", tmp_path / "v.json")
    verdict = json.loads((tmp_path / "v.json").read_text())
    assert rc == 1 and verdict["passed"] is False and "PASS" not in out
    assert err.strip() == (f"lockstep: error: {log}: is incomplete: its step lines (N/M) plan 4 steps but it ends at "
                           "step 2 (did the run crash or get killed?)")


def test_include_cases_naming_a_case_on_neither_side_fails(tmp_path, capsys):
    b, t = tmp_path / "b", tmp_path / "t"
    put_record(b, "gpt2_1", BASE_LOSSES)
    put_infinitrain_log(t, "gpt2_1", BASE_LOSSES)
    rc, out, err = run_cli(capsys, b, t, "--include-cases", "gpt2_1,gtp2_2")
    assert rc == 1 and "1 passed, 0 failed, 0 missing, 1 errors" in out
    assert err.strip() == f"lockstep: error: case gtp2_2 (--include-cases) is in neither {b} nor {t}"
    # Two files named directly: the filter still has to name one of them.
    rc, _, err = run_cli(capsys, b / "gpt2_1.jsonl", t / "gpt2_1.log", "--include-cases", "gpt2_9")
    assert rc == 1 and "case gpt2_9 (--include-cases) is in neither" in err


def make_run_dir(run: Path, megatron_delta: float = 0.0, manifest: bool = True) -> Path:
    """What `lockstep run` leaves on a CPU: BF16 and DP=8 skipped, each framework with a record and a log."""
    for fw, delta in (("pytorch", 0.0), ("megatron", megatron_delta)):
        put_record(run / fw, "gpt2_1", shifted(BASE_LOSSES, delta, at=4), framework=fw)
        (run / fw / "gpt2_1.log").write_text("the native log beside the record\n")
    put_record(run / "pytorch", "gpt2_1_bfloat16", BASE_LOSSES, dtype="bfloat16", framework="pytorch")
    if manifest:
        (run / "run.json").write_text(json.dumps({"frameworks": ["pytorch", "megatron"], "skipped": [
            {"case": "gpt2_1_bfloat16", "framework": "megatron", "reason": "megatron-core's bf16 needs CUDA"},
            {"case": "gpt2_8", "framework": "pytorch", "reason": "needs 8 devices, 1 present"},
            {"case": "gpt2_8", "framework": "megatron", "reason": "needs 8 devices, 1 present"}]}))
    return run


def test_after_a_green_run_the_readme_compare_exits_0_with_skips_named(tmp_path, capsys):
    run = make_run_dir(tmp_path / "run")
    rc, out, err = run_cli(capsys, run / "pytorch", run / "megatron", "--json", tmp_path / "v.json")
    assert rc == 0 and err == ""
    assert "skipped: gpt2_1_bfloat16 (megatron-core's bf16 needs CUDA)" in out
    assert "1 passed, 0 failed, 0 missing, 0 errors, 2 skipped" in out
    verdict = json.loads((tmp_path / "v.json").read_text())
    assert verdict["missing"] == [] and {s["case"] for s in verdict["skipped"]} == {"gpt2_1_bfloat16", "gpt2_8"}


def test_without_run_json_an_absent_case_is_missing(tmp_path, capsys):
    run = make_run_dir(tmp_path / "run", manifest=False)
    rc, out, _ = run_cli(capsys, run / "pytorch", run / "megatron")
    assert rc == 1 and "1 passed, 0 failed, 1 missing, 0 errors" in out


def test_two_run_directories_pair_framework_by_framework(tmp_path, capsys):
    a = make_run_dir(tmp_path / "a")
    b = make_run_dir(tmp_path / "b", megatron_delta=1e-3)
    report = compare_paths(a, b)
    by_case = {c.case: c for c in report.cases}
    assert set(by_case) == {"pytorch/gpt2_1", "pytorch/gpt2_1_bfloat16", "megatron/gpt2_1"}
    assert by_case["pytorch/gpt2_1"].passed and by_case["pytorch/gpt2_1_bfloat16"].passed
    assert not by_case["megatron/gpt2_1"].passed and by_case["megatron/gpt2_1"].first_failing_step == 4
    assert set(report.skipped) == {"megatron/gpt2_1_bfloat16", "pytorch/gpt2_8", "megatron/gpt2_8"}
    assert not report.missing and not report.errors
    rc, out, err = run_cli(capsys, a, a)
    assert rc == 0 and "3 passed, 0 failed, 0 missing, 0 errors, 3 skipped" in out and err == ""
    rc, _, err = run_cli(capsys, a, b / "pytorch")
    assert rc == 1 and err.strip() == (
        f"lockstep: error: {a} is a lockstep run directory (frameworks: megatron, pytorch) but {b / 'pytorch'} is "
        f"not; compare two run directories, or one framework directory ({a}/megatron) with {b / 'pytorch'}")


def test_errors_are_printed_once(tmp_path, capsys):
    b, t = tmp_path / "b", tmp_path / "t"
    put_record(b, "gpt2_1", BASE_LOSSES)
    put_record(t, "gpt2_1", BASE_LOSSES).write_bytes(b'{"type": "meta"}\n[1, 2]\n')
    rc, out, err = run_cli(capsys, b, t)
    message = f"{t / 'gpt2_1.jsonl'}: line 2 is a list, not a JSON object"
    assert rc == 1 and err == f"lockstep: error: {message}\n" and message not in out


def write_llmc_log(path: Path, losses: list[float]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(llmc_step_line(i + 1, len(losses), x, 1e-4, 10.0, 100.0) + "\n"
                            for i, x in enumerate(losses)))
    return path


def test_six_decimal_logs_say_their_precision_limits_the_comparison(tmp_path, capsys):
    """Records hold the full float; `%.6f` logs only 1e-6 steps, within 10x of the FP32 threshold."""
    b = write_llmc_log(tmp_path / "b" / "gpt2_1.log", BASE_LOSSES)
    t = write_llmc_log(tmp_path / "t" / "gpt2_1.log", shifted(BASE_LOSSES, 4e-7))
    rc, out, _ = run_cli(capsys, b, t, "--json", tmp_path / "v.json")
    case = json.loads((tmp_path / "v.json").read_text())["cases"][0]
    assert case["resolution"] == pytest.approx(1e-6)
    assert case["baseline"]["loss_quantum"] == pytest.approx(1e-6) and case["test"]["loss_quantum"] == pytest.approx(1e-6)
    assert "loss precision: baseline" in " ".join(out.split()) and "the log's precision limits this comparison" in " ".join(out.split())
    # A record against a log: only the log's side is named.
    rec = put_record(tmp_path / "r", "gpt2_1", BASE_LOSSES)
    v = compare_paths(rec, t).cases[0]
    assert v.resolution == pytest.approx(5e-7) and v.baseline.loss_quantum is None
    assert any(n.startswith(f"loss precision: test ({t}) prints losses to 1e-06") for n in v.notes)
    assert compare_paths(rec, rec).cases[0].resolution is None


def test_a_long_failing_run_prints_a_summary_and_keeps_every_step_in_the_json(tmp_path, capsys):
    losses = [10.0 - 1e-3 * i for i in range(500)]
    moved = [x + (3e-5 if (i + 1) % 7 == 0 else 0.0) + (9e-5 if i + 1 == 300 else 0.0) for i, x in enumerate(losses)]
    b = write_llmc_log(tmp_path / "b" / "gpt2_1.log", losses)
    t = write_llmc_log(tmp_path / "t" / "gpt2_1.log", moved)
    rc, out, _ = run_cli(capsys, b, t, "--json", tmp_path / "v.json")
    text = " ".join(out.split())
    assert rc == 1 and "72 of 500 steps fail; first failing step 7, worst step 300" in text
    assert len(out.splitlines()) < 40  # not one line per step
    case = json.loads((tmp_path / "v.json").read_text())["cases"][0]
    assert len(case["abs_diffs"]) == 500 and case["failing_steps"] == 72 and case["first_failing_step"] == 7
