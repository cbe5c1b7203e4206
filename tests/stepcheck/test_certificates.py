"""`lockstep run`'s certificate stage (lockstep/stepcheck/certificates.py): a BF16 pair is not
certified unless asked, but one whose loss FAILs with nothing to explain it gets its step-1
certificate after the comparison, and its cause is named. The planted defect: pytorch-fast's SDPA
attention without its causal mask (its training and its capture), at lr 0.1 where gpt2-tiny learns
fast enough for the loss to part by more than BF16's 1e-2 in a few steps."""

from __future__ import annotations

import json

import pytest
import torch.nn.functional as F

from lockstep.cli import main
from lockstep.runners.pytorch_fast import train as fast

pytestmark = pytest.mark.integration


MATRIX = """
[[case]]
name = "fast_bfloat16"
model = "gpt2"
dtype = "bfloat16"
seq_len = 64
micro_batch = 4
total_batch = 256
steps = 5
lr = 0.1
"""


def acausal_attention(q, k, v):
    """The reference kernel's signature (runners/pytorch_fast/train.py), every token seeing every other."""
    B, T, NH, hd = q.shape
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=k.shape[1] != NH)
    return y.transpose(1, 2).reshape(B, T, NH * hd)


def bf16_case(capsys, tmp_path, checkpoint, tokens, *more) -> tuple[int, str, dict]:
    out_dir = tmp_path / "o"
    (tmp_path / "m.toml").write_text(MATRIX)
    rc = main(["run", "--matrix", str(tmp_path / "m.toml"), "--frameworks", "pytorch,pytorch-fast",
               "--llmc", str(checkpoint), "--data", str(tokens), "--device", "cpu", "--out", str(out_dir),
               "--no-report", "--no-history", *more])
    out, err = capsys.readouterr()
    summary = json.loads((out_dir / "summary.json").read_text())
    return rc, out + err, summary["comparisons"][0]["cases"][0]


@pytest.fixture
def planted(monkeypatch):
    monkeypatch.setattr(fast, "sdpa_causal_attention", acausal_attention)


def test_an_unexplained_bf16_fail_gets_its_certificate_and_its_cause(capsys, tmp_path, tiny_checkpoint,
                                                                    tiny_shakespeare_train, planted):
    rc, out, case = bf16_case(capsys, tmp_path, tiny_checkpoint, tiny_shakespeare_train)
    assert rc == 1, out
    cert = case["certificate"]
    assert cert is not None and cert["available"] and not cert["holds"], out
    # the forward parts at the first attention's output: the defect's own module, not a downstream one
    assert "attn" in cert["cause"]["where"], cert["cause"]
    assert case["verdict"] != "FAIL unexplained"
    assert "FAILs with nothing to explain it: certifying its first step now" in out
    assert (tmp_path / "o" / "pytorch-fast" / "fast_bfloat16.certificate.json").is_file()


@pytest.mark.slow  # --no-certify's plumbing is tests/commands/test_run_certify.py's; this repeats the BF16 training
def test_no_certify_asks_for_none(capsys, tmp_path, tiny_checkpoint, tiny_shakespeare_train, planted):
    rc, out, case = bf16_case(capsys, tmp_path, tiny_checkpoint, tiny_shakespeare_train, "--no-certify")
    assert rc == 1 and case["certificate"] is None and case["verdict"] == "FAIL unexplained"
