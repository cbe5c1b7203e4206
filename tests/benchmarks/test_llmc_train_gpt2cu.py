"""benchmarks/llmc/train_gpt2cu.py: llm.c's CUDA trainer as a command-runner speed anchor. Its
checkpoint conversion and step-line parser here on CPU; the real binary only on a GPU where
LOCKSTEP_LLMC_BUILD names llm.c's directory holding a built train_gpt2cu."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from lockstep.cli import main

HERE = Path(__file__).resolve().parents[2] / "benchmarks" / "llmc"
TOML = HERE / "train_gpt2cu.toml"
# train_gpt2.cu's printf (karpathy/llm.c f1e2ace, line 1872), filled as it fills it.
LLMC_STEP_FORMAT = ("step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | "
                    "%.0f tok/s")


def _wrapper():
    spec = importlib.util.spec_from_file_location("train_gpt2cu_wrapper", HERE / "train_gpt2cu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bf16_checkpoint_is_torchs_rounding_of_every_tensor(tmp_path, tiny_checkpoint):
    w = _wrapper()
    out = tmp_path / "bf16.bin"
    w.to_bf16_checkpoint(tiny_checkpoint, out)
    src, dst = tiny_checkpoint.read_bytes(), out.read_bytes()
    header_src, header_dst = np.frombuffer(src[:1024], "<i4"), np.frombuffer(dst[:1024], "<i4")
    assert header_dst[1] == 5 and header_src[1] == 3
    assert (np.delete(header_dst, 1) == np.delete(header_src, 1)).all()
    fp32 = torch.from_numpy(np.frombuffer(src[1024:], "<f4").copy())
    expect = fp32.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    assert dst[1024:] == expect and len(dst) == 1024 + (len(src) - 1024) // 2
    assert not list(tmp_path.glob("*.partial"))


def test_a_checkpoint_that_is_not_fp32_llmc_is_refused(tmp_path, tiny_checkpoint):
    w = _wrapper()
    bf16 = tmp_path / "bf16.bin"
    w.to_bf16_checkpoint(tiny_checkpoint, bf16)
    with pytest.raises(w.Refused, match="is a gpt2 checkpoint of version 5, not GPT-2's float32"):
        w.to_bf16_checkpoint(bf16, tmp_path / "again.bin")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\0" * 2048)
    with pytest.raises(w.Refused, match="unknown checkpoint magic number 0"):
        w.to_bf16_checkpoint(junk, tmp_path / "x.bin")
    assert not (tmp_path / "again.bin").exists() and not (tmp_path / "x.bin").exists()


def test_step_lines_as_llm_c_prints_them():
    w = _wrapper()
    text = "\n".join(["val loss 10.9872", LLMC_STEP_FORMAT % (1, 20, 10.987654, float("nan"), 15.2345, float("nan"),
                                                             3e-4, 123.456, 12.34, 41472.4),
                      LLMC_STEP_FORMAT % (2, 20, 9.5, 0.5, 3.1, -1.25, 3e-4, 52.1, -100.0, 98304.0),
                      "generating:"])
    assert w.step_records(text) == [{"step": 1, "loss": 10.987654, "step_ms": 123.46, "tokens_per_s": 41472.0},
                                    {"step": 2, "loss": 9.5, "step_ms": 52.1, "tokens_per_s": 98304.0}]


def test_a_missing_binary_is_one_sentence_and_writes_nothing(tmp_path, tiny_checkpoint, training_tokens, capsys):
    w = _wrapper()
    rc = w.main(["--build", str(tmp_path / "no-llm.c"), "--llmc", str(tiny_checkpoint), "--tokens",
                 str(training_tokens), "--out", str(tmp_path), "-B", "4", "-T", "64", "--total-batch", "256",
                 "--steps", "2", "--lr", "0.0001", "--steps-file", str(tmp_path / "steps.jsonl")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "is not an executable train_gpt2cu" in err
    assert not any(tmp_path.iterdir())


@pytest.mark.gpu
@pytest.mark.integration
@pytest.mark.skipif(not os.environ.get("LOCKSTEP_LLMC_BUILD"), reason="LOCKSTEP_LLMC_BUILD (llm.c with a built "
                    "train_gpt2cu) not given")
def test_train_gpt2cu_runs_as_a_speed_anchor(tmp_path, training_tokens):
    """GPT-2 124M's BF16 case, 3 steps: train_gpt2cu runs, its pairs are "speed only" with a tok/s ratio, the run passes."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "out"
    rc = main(["run", "--command-runner", str(TOML), "--command-build", os.environ["LOCKSTEP_LLMC_BUILD"],
               "--frameworks", "pytorch,llmc-cuda", "--cases", "gpt2_2_bfloat16", "--steps", "3",
               "--data", str(training_tokens), "--out", str(out), "--no-report", "--no-history"])
    summary = json.loads((out / "summary.json").read_text())
    case = summary["comparisons"][0]["cases"][0]
    assert rc == 0 and case["verdict"] == "speed only" and case["throughput_ratio"] > 0, case
