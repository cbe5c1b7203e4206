"""`lockstep run`'s step-1 certificate, end to end on the CPU: every FP32 pair's step 1 compared from
inside, its class in the terminal, summary.json, JUnit and history, and a gradient defect the loss
hides (5% on every LayerNorm bias gradient, as the InfiniTrain defect build has it) failed with
its cause. With an InfiniTrain build (LOCKSTEP_INFINITRAIN_BUILD, and the 5%-LayerNorm-bias build
in LOCKSTEP_INFINITRAIN_DEFECT_BUILD) the same against the real binaries."""

from __future__ import annotations

import json
import os
import sqlite3
import xml.etree.ElementTree as ET

import pytest

from lockstep.cli import main
from lockstep.runners.megatron.runner import megatron_core_installed
from support import defects

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

megatron = pytest.mark.skipif(not megatron_core_installed(), reason="megatron-core is not installed")


def run_cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(["run", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def summary_cases(out_dir) -> dict:
    summary = json.loads((out_dir / "summary.json").read_text())
    return {(comp["test_framework"], c["case"]): c for comp in summary["comparisons"] for c in comp["cases"]}


@megatron
def test_a_clean_pair_passes_with_a_certificate_that_holds(capsys, tmp_path, tiny_checkpoint,
                                                           tiny_shakespeare_train, private_history):
    out_dir = tmp_path / "o"
    rc, out, err = run_cli(capsys, "--cases", "gpt2_1", "--frameworks", "pytorch,megatron", "--steps", "3",
                           "--llmc", str(tiny_checkpoint), "--data", str(tiny_shakespeare_train), "--device", "cpu",
                           "--out", str(out_dir), "--junit", str(tmp_path / "j.xml"), "--no-report")
    assert rc == 0, out + err
    case = summary_cases(out_dir)[("megatron", "gpt2_1")]
    cert = case["certificate"]
    assert case["verdict"] == "PASS" and cert["holds"] and cert["findings"] == []
    assert cert["compared"]["gradients"] == 28 and cert["compared"]["module outputs"] == 16
    assert cert["worst"]["gradients"]["rel_error"] < 1e-6
    assert "step-1 certificate megatron vs pytorch on gpt2_1: step 1 agrees from inside" in out
    timing = json.loads((out_dir / "run.json").read_text())["timing"]  # where the time went
    assert {"plan", "runs", "certificates", "comparison"} <= set(timing["stages"])
    by_pair = {(p["framework"], p["case"]): p for p in timing["pairs"]}
    assert set(by_pair[("megatron", "gpt2_1")]["phases"]) == {"start-up", "weights", "data", "training", "teardown"}
    assert by_pair[("pytorch", "gpt2_1")]["step1_capture_s"] > 0
    assert sum(by_pair[("megatron", "gpt2_1")]["phases"].values()) == pytest.approx(
        by_pair[("megatron", "gpt2_1")]["wall_s"], abs=0.05)
    assert out.count("time: ") == 1 and "the runs' phases: start-up" in out
    assert (out_dir / "step1" / "pytorch" / "gpt2_1.npz").stat().st_size < 2_000_000  # sketches, not tensors
    junit = ET.parse(tmp_path / "j.xml").getroot()
    case_out = next(tc.find("system-out").text for tc in junit.iter("testcase") if tc.get("name") == "gpt2_1")
    assert "verdict: PASS" in case_out
    with sqlite3.connect(private_history) as db:
        assert ("megatron", "PASS") in db.execute("SELECT framework, verdict FROM results").fetchall()


@megatron
def test_a_gradient_defect_the_loss_hides_fails_with_its_cause(capsys, tmp_path, monkeypatch, tiny_checkpoint,
                                                              tiny_shakespeare_train):
    defects.worker_env("megatron_layernorm_bias_grad_5pct", monkeypatch)
    out_dir = tmp_path / "o"
    rc, out, err = run_cli(capsys, "--cases", "gpt2_1", "--frameworks", "pytorch,megatron", "--steps", "3",
                           "--llmc", str(tiny_checkpoint), "--data", str(tiny_shakespeare_train), "--device", "cpu",
                           "--out", str(out_dir), "--no-report")
    assert rc == 1
    case = summary_cases(out_dir)[("megatron", "gpt2_1")]
    assert case["loss_passed"] and case["max_abs_diff"] < 1e-5  # the loss alone would pass
    assert case["verdict"] == "FAIL" and not case["certificate"]["holds"]
    named = {t for f in case["certificate"]["findings"] for t in f.get("tensors", [f["where"]])}
    assert named == {"ln1b[0]", "ln1b[1]", "ln2b[0]", "ln2b[1]", "lnfb"}, case["certificate"]["findings"]
    assert "relative 5.00e-02" in case["cause"] or "5.00e-02" in json.dumps(case["certificate"]["findings"])
    assert "FAIL megatron vs pytorch: gpt2_1 (gradient of ln" in out and "; also ln" in case["cause"]
    assert "lockstep diagnose" in out  # where to look next


@megatron
def test_no_certify_keeps_the_loss_verdict_only(capsys, tmp_path, monkeypatch, tiny_checkpoint, tiny_shakespeare_train):
    defects.worker_env("megatron_layernorm_bias_grad_5pct", monkeypatch)
    out_dir = tmp_path / "o"
    rc, out, err = run_cli(capsys, "--cases", "gpt2_1", "--frameworks", "pytorch,megatron", "--steps", "2",
                           "--llmc", str(tiny_checkpoint), "--data", str(tiny_shakespeare_train), "--device", "cpu",
                           "--out", str(out_dir), "--no-report", "--no-certify")
    assert rc == 0
    case = summary_cases(out_dir)[("megatron", "gpt2_1")]
    assert case["verdict"] == "PASS" and case["certificate"] is None
    assert not (out_dir / "step1").exists()


INFINITRAIN = os.environ.get("LOCKSTEP_INFINITRAIN_BUILD")
DEFECT_BUILD = os.environ.get("LOCKSTEP_INFINITRAIN_DEFECT_BUILD")


@pytest.mark.slow
@pytest.mark.skipif(not INFINITRAIN, reason="needs an InfiniTrain build: set LOCKSTEP_INFINITRAIN_BUILD")
@pytest.mark.parametrize("build", ["clean", "lnbias5"])
def test_infinitrain_cpu_pass_and_the_lnbias_defect_named(build, capsys, tmp_path, tiny_checkpoint,
                                                          tiny_shakespeare_train):
    """Issue 21's acceptance on the CPU: gpt2_1 and gpt2_2 (gpt2-tiny) PASS (within logging
    precision where its FP32 loss sum shows) against the clean build, exit 0; FAIL naming
    ln1b/ln2b/lnfb against the build whose LayerNorm-bias gradients are 5% too large, exit 1."""
    if build == "lnbias5" and not DEFECT_BUILD:
        pytest.skip("needs the 5%-LayerNorm-bias InfiniTrain build: set LOCKSTEP_INFINITRAIN_DEFECT_BUILD")
    out_dir = tmp_path / "o"
    rc, out, err = run_cli(capsys, "--cases", "gpt2_1,gpt2_2", "--frameworks", "pytorch,infinitrain",
                           "--infinitrain-build", INFINITRAIN if build == "clean" else DEFECT_BUILD,
                           "--llmc", str(tiny_checkpoint), "--data", str(tiny_shakespeare_train), "--device", "cpu",
                           "--out", str(out_dir), "--no-report")
    cases = summary_cases(out_dir)
    if build == "clean":
        assert rc == 0, out + err
        assert {c["verdict"] for c in cases.values()} <= {"PASS", "PASS within logging precision"}
        assert all(c["certificate"]["holds"] for c in cases.values())
    else:
        assert rc == 1
        for name in ("gpt2_1", "gpt2_2"):
            c = cases[("infinitrain", name)]
            named = {t for f in c["certificate"]["findings"] for t in f.get("tensors", [f["where"]])}
            assert c["verdict"] == "FAIL" and {"ln1b[0]", "ln2b[1]", "lnfb"} <= named, c["certificate"]["findings"]
            assert c["cause"].startswith("gradient of ln1b only, in 2 layers (0..1)") and "also ln2b[0..1], lnfb" in c["cause"]
