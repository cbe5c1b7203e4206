"""How `lockstep run` ends: the overall verdict, a run that compared nothing, bad --out and --seed."""

from __future__ import annotations

import json
import re

import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.cli import main
from lockstep.formats.run_record import RunRecord, StepRecord
from lockstep.execute import CaseOutcome
from lockstep.run_verdict import run_verdict

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)


def run_cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(["run", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_run_where_everything_was_skipped_fails_saying_nothing_was_compared(capsys, tmp_path, tiny_checkpoint,
                                                                             tiny_shakespeare_train):
    out_dir = tmp_path / "o"
    rc, out, err = run_cli(capsys, "--cases", "gpt2_3,gpt2_3_bfloat16", "--frameworks", "pytorch",
                           "--llmc", str(tiny_checkpoint), "--data", str(tiny_shakespeare_train),
                           "--device", "cpu", "--out", str(out_dir))
    assert rc == 1 and "Traceback" not in err
    lines = out.strip().splitlines()
    verdict = next(i for i, ln in enumerate(lines) if ln.startswith("FAIL"))
    assert lines[verdict] == "FAIL: nothing was compared: all 2 (case, framework) pairs were skipped on this machine"
    assert lines[verdict + 1].startswith("  skipped (2): needs 8 devices, this machine has ")
    assert lines[verdict + 1].endswith(": pytorch/gpt2_3, pytorch/gpt2_3_bfloat16")
    manifest = json.loads((out_dir / "run.json").read_text())
    assert manifest["status"] == "finished" and manifest["verdict"] == "FAIL" and len(manifest["skipped"]) == 2
    assert not (out_dir / "report.html").exists()  # a report of nothing is not written


def test_the_run_ends_with_the_verdict_and_where_everything_is(capsys, tmp_path, tiny_checkpoint,
                                                              tiny_shakespeare_train):
    out_dir = tmp_path / "o"
    rc, out, err = run_cli(capsys, "--cases", "gpt2_1,gpt2_3", "--frameworks", "pytorch", "--steps", "2",
                           "--llmc", str(tiny_checkpoint), "--data", str(tiny_shakespeare_train),
                           "--device", "cpu", "--out", str(out_dir))
    assert rc == 1, err  # one framework: nothing compared, nothing proven
    tail = out.strip().splitlines()[-3:]
    assert tail[0] == "RAN: pytorch only (one framework): nothing was compared; name a framework to compare it with (--frameworks pytorch,megatron) or --repeat N to compare its repeats | 0 PASS, 0 PASS within logging precision, 0 FAIL, 0 FAIL unexplained, 0 errors | 0 failed runs | 1 skipped"
    assert tail[1].startswith("  skipped (1): needs 8 devices") and tail[1].endswith(": pytorch/gpt2_3")
    assert out.count("needs 8 devices") == 1 and "gpt2_3" not in "".join(out.strip().splitlines()[:-3])  # said once
    assert tail[2] == (f"  report: {out_dir / 'report.html'}, {out_dir / 'report.md'} | "
                       f"summary: {out_dir / 'summary.json'} | run: {out_dir / 'run.json'}")
    assert json.loads((out_dir / "run.json").read_text())["status"] == "finished"

    # The same directory again: the earlier run's outputs go, the new run's come; a record-like file
    # the earlier run did not write is moved out of the way (said), a user's other file stays.
    (out_dir / "pytorch" / "stale.jsonl").write_text("{}")
    (out_dir / "pytorch" / "notes.txt").write_text("mine")
    rc, out, err = run_cli(capsys, "--cases", "gpt2_1", "--frameworks", "pytorch", "--steps", "1",
                           "--llmc", str(tiny_checkpoint), "--data", str(tiny_shakespeare_train),
                           "--device", "cpu", "--out", str(out_dir), "--no-report")
    assert rc == 1, err  # pytorch alone: nothing compared
    names = sorted(p.name for p in (out_dir / "pytorch").iterdir())
    assert names[:3] == ["gpt2_1.jsonl", "gpt2_1.log", "notes.txt"] and len(names) == 4
    assert re.fullmatch(r"stale\.jsonl\.moved-by-lockstep-\d{8}T\d{6}Z", names[3])
    assert (out_dir / "pytorch" / names[3]).read_text() == "{}"
    assert f"moved aside (not written by lockstep, in the way of its outputs): {out_dir / 'pytorch' / 'stale.jsonl'} " \
           f"-> pytorch/{names[3]}" in out
    assert not (out_dir / "report.html").exists() and not (out_dir / "report_files").exists()


def outcome(case: str, framework: str, ok: bool = True, skipped: str | None = None) -> CaseOutcome:
    spec = CaseSpec(name=case, model="gpt2", dtype="float32", micro_batch=4, seq_len=64, total_batch=256, steps=2,
                    lr=1e-4)
    if skipped:
        return CaseOutcome(spec, framework, skipped=skipped)
    rec = RunRecord(framework=framework, case=case, steps=[StepRecord(step=1, loss=10.9), StepRecord(step=2, loss=10.8)])
    if not ok:
        rec.status, rec.error = "failed", "worker exited with status 1"
    return CaseOutcome(spec, framework, record=rec)


def test_verdict_counts_fails_failed_runs_and_groups_skips(tmp_path):
    outcomes = [outcome("gpt2_1", "pytorch"), outcome("gpt2_1", "megatron"), outcome("gpt2_2", "pytorch"),
                outcome("gpt2_2", "megatron"), outcome("gpt2_1", "infinitrain", ok=False),
                outcome("gpt2_3", "pytorch", skipped="needs 8 devices, this machine has 2 GPUs"),
                outcome("gpt2_3", "megatron", skipped="needs 8 devices, this machine has 2 GPUs"),
                outcome("gpt2_2", "infinitrain", skipped="InfiniTrain's BF16 crashes on CPU")]
    summary = {"passed": False, "errors": [], "comparisons": [
        {"baseline_framework": "pytorch", "test_framework": "megatron", "missing": [], "errors": [],
         "cases": [{"case": "gpt2_1", "passed": True, "max_abs_diff": 1.0e-7, "verdict": "PASS"},
                   {"case": "gpt2_2", "passed": False, "max_abs_diff": 2.1e-4, "verdict": "FAIL",
                    "cause": "gradient of qkvb only, in 12 layers (0..11)"},
                   {"case": "gpt2_3", "passed": True, "max_abs_diff": 1.9e-5, "verdict": "PASS within logging precision",
                    "cause": "within 1e-05 + the test's logging precision"}]},
        {"baseline_framework": "pytorch", "test_framework": "infinitrain", "missing": [], "errors": [],
         "cases": [{"case": "gpt2_1", "passed": False, "error": "infinitrain/gpt2_1.jsonl: run failed"}]}]}
    v = run_verdict(outcomes, summary, ["pytorch", "megatron", "infinitrain"], tmp_path, [tmp_path / "report.html"])
    assert v.exit_code == 1 and v.word == "FAIL"
    assert v.lines == [
        "FAIL: 1 PASS, 1 PASS within logging precision, 1 FAIL, 0 FAIL unexplained, 1 error | 1 failed run | 3 skipped",
        "  FAIL megatron vs pytorch: gpt2_2 (gradient of qkvb only, in 12 layers (0..11))",
        "  PASS within logging precision megatron vs pytorch: gpt2_3 (within 1e-05 + the test's logging precision)",
        "  ERROR infinitrain vs pytorch: gpt2_1 (infinitrain/gpt2_1.jsonl: run failed)",
        "  failed runs: infinitrain/gpt2_1 (errors above, and in each record)",
        "  skipped (2): needs 8 devices, this machine has 2 GPUs: pytorch/gpt2_3, megatron/gpt2_3",
        "  skipped (1): InfiniTrain's BF16 crashes on CPU: infinitrain/gpt2_2",
        f"  report: {tmp_path / 'report.html'} | summary: {tmp_path / 'summary.json'} | run: {tmp_path / 'run.json'}"]


def test_two_frameworks_that_never_ran_the_same_case_fail(tmp_path):
    outcomes = [outcome("gpt2_1_bfloat16", "pytorch"),
                outcome("gpt2_1_bfloat16", "megatron", skipped="megatron-core's bf16 autocast backward needs CUDA")]
    summary = {"passed": None, "errors": [], "comparisons": [
        {"baseline_framework": "pytorch", "test_framework": "megatron", "missing": [], "errors": [], "cases": [],
         "passed": None}]}
    v = run_verdict(outcomes, summary, ["pytorch", "megatron"], tmp_path)
    assert v.exit_code == 1
    assert v.lines[0].startswith("FAIL: nothing was compared: no case ran on both the baseline pytorch and another")


def test_a_one_framework_run_ends_with_one_word_whatever_it_compared_within(tmp_path):
    """A pytorch-only run ended FAIL, a pytorch-only checkpoint run OK: both are one framework, with
    nothing to agree or differ with, so both say RAN; the exit code is the one rule of every run
    (0 only when something was compared and holds)."""
    head = "0 PASS, 0 PASS within logging precision, 0 FAIL, 0 FAIL unexplained, 0 errors | 0 failed runs | 0 skipped"
    alone = run_verdict([outcome("gpt2_1", "pytorch")], {"passed": None, "comparisons": []}, ["pytorch"], tmp_path)
    assert (alone.word, alone.exit_code) == ("RAN", 1)
    assert alone.lines[0] == ("RAN: pytorch only (one framework): nothing was compared; name a framework to compare it "
                              f"with (--frameworks pytorch,megatron) or --repeat N to compare its repeats | {head}")
    resume = {"framework": "pytorch", "case": "gpt2_1_resume", "resume_case": "gpt2_1", "passed": True}
    saved = run_verdict([outcome("gpt2_1", "pytorch"), outcome("gpt2_1_resume", "pytorch")],
                        {"passed": None, "comparisons": [], "resumes": [resume]}, ["pytorch"], tmp_path)
    assert (saved.word, saved.exit_code) == ("RAN", 0)
    assert saved.lines[0] == ("RAN: pytorch only (one framework): its resumes compared with the runs that saved them | "
                              + head)
    broken = run_verdict([outcome("gpt2_1", "pytorch"), outcome("gpt2_1_resume", "pytorch")],
                         {"passed": None, "comparisons": [], "resumes": [{**resume, "passed": False}]}, ["pytorch"],
                         tmp_path)
    assert (broken.word, broken.exit_code) == ("FAIL", 1)
    assert broken.lines[0].startswith("FAIL: pytorch only (one framework): its resumes compared")


@pytest.mark.parametrize("seed,message", [("-1", "-1 is negative"), ("x", "'x' is not a whole number")])
def test_bad_seed_is_a_usage_error(capsys, seed, message):
    with pytest.raises(SystemExit) as e:
        main(["run", "--seed", seed])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument --seed: {message}" in err and "Traceback" not in err


def test_out_that_is_a_file_is_refused_before_anything_runs(capsys, tmp_path, tiny_checkpoint, tiny_shakespeare_train):
    f = tmp_path / "out"
    f.write_text("x")
    rc, out, err = run_cli(capsys, "--frameworks", "pytorch", "--llmc", str(tiny_checkpoint),
                           "--data", str(tiny_shakespeare_train), "--out", str(f))
    assert rc == 1 and err == f"lockstep: error: {f}: --out is a file, not a directory; choose another --out\n"
    assert f.read_text() == "x"


def test_force_writes_into_a_foreign_directory_and_keeps_its_files(capsys, tmp_path, tiny_checkpoint,
                                                                  tiny_shakespeare_train):
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    (out_dir / "thesis.tex").write_text("keep me")
    rc, out, err = run_cli(capsys, "--cases", "gpt2_1", "--frameworks", "pytorch", "--steps", "1", "--force",
                           "--llmc", str(tiny_checkpoint), "--data", str(tiny_shakespeare_train),
                           "--device", "cpu", "--out", str(out_dir), "--no-report")
    assert rc == 1 and "RAN: pytorch only (one framework): nothing was compared" in out, err
    assert (out_dir / "thesis.tex").read_text() == "keep me" and (out_dir / "pytorch" / "gpt2_1.jsonl").is_file()


def test_another_tools_folder_is_refused_and_with_force_moved_aside_not_deleted(capsys, tmp_path, tiny_checkpoint,
                                                                                tiny_shakespeare_train):
    """Issue 26: a folder holding another tool's run.json and a pytorch/ lost pytorch/model.pt."""
    out_dir = tmp_path / "o"
    (out_dir / "pytorch").mkdir(parents=True)
    (out_dir / "pytorch" / "model.pt").write_text("weights")
    (out_dir / "run.json").write_text('{"tool": "trainer-x", "epochs": 3}')
    args = ["--cases", "gpt2_1", "--frameworks", "pytorch", "--steps", "1", "--llmc", str(tiny_checkpoint),
            "--data", str(tiny_shakespeare_train), "--device", "cpu", "--out", str(out_dir), "--no-report"]
    rc, out, err = run_cli(capsys, *args)
    assert rc == 1 and out == ""
    assert err == (f"lockstep: error: {out_dir}: output directory is not empty (pytorch, run.json) and was not written "
                   'by lockstep run: its run.json was not written by lockstep (it has no "schema": "lockstep.run/1"); '
                   "choose another --out, empty it, or pass --force (lockstep then moves what is in its way aside, "
                   "and deletes nothing)\n")
    assert sorted(p.name for p in out_dir.rglob("*")) == ["model.pt", "pytorch", "run.json"]

    rc, out, err = run_cli(capsys, *args, "--force")
    assert rc == 1 and "RAN: pytorch only (one framework): nothing was compared" in out, err  # written all the same
    manifest = json.loads((out_dir / "run.json").read_text())
    moved = {m["from"]: m["to"] for m in manifest["moved_aside"]}
    assert sorted(moved) == ["pytorch", "run.json"] and manifest["schema"] == "lockstep.run/1"
    assert (out_dir / moved["pytorch"] / "model.pt").read_text() == "weights"
    assert (out_dir / moved["run.json"]).read_text() == '{"tool": "trainer-x", "epochs": 3}'
    for name, to in moved.items():
        assert f"{out_dir / name} -> {to}" in out
