"""`lockstep run` end to end on CPU, and the inputs it must refuse before anything runs."""

from __future__ import annotations

import json

import pytest

from lockstep.cli import main
from lockstep.formats.run_record import read_run_record
from lockstep.formats.tokens import write_token_stream

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)


def run_cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(["run", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_writes_the_layout_and_compares(capsys, tmp_path, tiny_checkpoint, training_tokens):
    """pytorch and megatron on gpt2_1 (gpt2_3 is DP=8: skipped), then the comparison's verdicts."""
    pytest.importorskip("megatron.core")
    out_dir = tmp_path / "out"
    rc, out, err = run_cli(capsys, "--frameworks", "pytorch,megatron", "--cases", "gpt2_1,gpt2_3", "--steps", "3",
                           "--llmc", str(tiny_checkpoint), "--data", str(training_tokens),
                           "--device", "cpu", "--out", str(out_dir))
    assert rc == 0, err
    assert "gpt2_3" in out and "skipped" in out  # DP=8 on a 2-core machine: listed, not dropped
    for fw in ("pytorch", "megatron"):
        rec = read_run_record(out_dir / fw / "gpt2_1.jsonl")
        assert rec.ok and [s.step for s in rec.steps] == [1, 2, 3], fw
    assert (out_dir / "pytorch" / "gpt2_1.log").read_text().count("train loss") == 3
    manifest = json.loads((out_dir / "run.json").read_text())
    assert {(s["case"], s["framework"]) for s in manifest["skipped"]} == {("gpt2_3", "pytorch"), ("gpt2_3", "megatron")}
    assert all("needs 8 devices" in s["reason"] for s in manifest["skipped"])
    # The comparison: megatron against the pytorch baseline, gpt2_1 judged step by step.
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["passed"] is True and summary["baseline"] == "pytorch"
    [comparison] = summary["comparisons"]
    assert comparison["test_framework"] == "megatron" and comparison["counts"]["passed"] == 1
    [verdict] = comparison["cases"]
    assert verdict["case"] == "gpt2_1" and verdict["passed"] is True and verdict["steps"] == 3
    assert verdict["threshold"] == 1e-5 and len(verdict["abs_diffs"]) == 3 and verdict["max_abs_diff"] < 1e-6
    pt, mg = (read_run_record(out_dir / fw / "gpt2_1.jsonl").losses() for fw in ("pytorch", "megatron"))
    assert verdict["abs_diffs"] == pytest.approx([abs(a - b) for a, b in zip(pt, mg)], abs=1e-12)
    assert [s["case"] for s in comparison["skipped"]] == ["gpt2_3"]
    assert (out_dir / "report.html").is_file()


def test_impossible_batch_split_is_refused_before_running(capsys, tmp_path, tiny_checkpoint, tiny_shakespeare_train):
    matrix = tmp_path / "bad.toml"
    matrix.write_text('[[case]]\nname = "odd"\nmodel = "gpt2"\ndtype = "float32"\nmicro_batch = 3\nseq_len = 64\n'
                      'total_batch = 256\nsteps = 2\nlr = 1e-4\n')
    rc, out, err = run_cli(capsys, "--matrix", str(matrix), "--llmc", str(tiny_checkpoint),
                           "--data", str(tiny_shakespeare_train), "--out", str(tmp_path / "o"))
    assert rc == 1 and "Traceback" not in err
    assert "case odd: impossible batch split: tokens/step 256 is not divisible by B*T*DP = 3*64*1 = 192" in err
    assert not (tmp_path / "o").exists()


def test_too_few_tokens_is_refused_naming_the_numbers(capsys, tmp_path, tiny_checkpoint):
    small = tmp_path / "small.bin"
    write_token_stream(small, list(range(1000)))
    rc, out, err = run_cli(capsys, "--cases", "gpt2_1", "--frameworks", "pytorch", "--llmc", str(tiny_checkpoint),
                           "--data", str(small), "--out", str(tmp_path / "o"))
    assert rc == 1 and "case gpt2_1: needs 2561 tokens (10 steps x 256 tokens/step + 1) but the token file holds 1000" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,message", [
    (["--cases", "nope"], "no case named nope in matrix gpt2"),
    (["--frameworks", "tensorflow"], "unknown framework 'tensorflow'"),
    (["--matrix", "missing.toml"], "missing.toml: no such matrix"),
])
def test_bad_requests_fail_with_one_sentence(capsys, tmp_path, tiny_checkpoint, tiny_shakespeare_train, args, message):
    rc, out, err = run_cli(capsys, *args, "--llmc", str(tiny_checkpoint), "--data", str(tiny_shakespeare_train),
                           "--out", str(tmp_path / "o"))
    assert rc == 1 and message in err and "Traceback" not in err


def test_truncated_checkpoint_is_refused(capsys, tmp_path, tiny_checkpoint, tiny_shakespeare_train):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(tiny_checkpoint.read_bytes()[:4096])
    rc, out, err = run_cli(capsys, "--llmc", str(bad), "--data", str(tiny_shakespeare_train), "--out", str(tmp_path / "o"))
    assert rc == 1 and str(bad) in err and "truncated" in err and "Traceback" not in err


def test_out_dir_with_foreign_files_is_refused(capsys, tmp_path, tiny_checkpoint, tiny_shakespeare_train):
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    (out_dir / "thesis.tex").write_text("keep me")
    rc, out, err = run_cli(capsys, "--frameworks", "pytorch", "--llmc", str(tiny_checkpoint),
                           "--data", str(tiny_shakespeare_train), "--out", str(out_dir))
    assert rc == 1 and "was not written by lockstep run" in err
    assert (out_dir / "thesis.tex").read_text() == "keep me"
