"""`lockstep bisect --expect identical` over the command runner's toy trainer, on a CPU: a tiny git
repository whose trainer logs its loss to 17 significant digits, one commit scaling the loss by
1 + 2e-7 (about 2 FP32 ulps of a loss near 10.8, whatever the data). Its loss stays within FP32's 1e-5
of the good build's, so only identity finds it. (A re-associated attention scale, (q/√hd)·kᵀ for
(q·kᵀ)/√hd, was the first plant: on the offline corpus, with no ../shared, the near-uniform attention
of a fresh model left every loss the same bits, and the test failed there.)"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from support.fake_framework import git
from test_bisect_command_runner import BUILD, TOML, TRAINER
from lockstep.cli import main

pytestmark = pytest.mark.integration  # in CI: bisect's own regressions (the slow lane leaves them in)

EXACT_LOG = ("train loss {total:.6f}", "train loss {total:.17g}")
SCALE = ("(loss / a.accum).backward()", "(loss * (1 + 2e-7) / a.accum).backward()\n            loss = loss * (1 + 2e-7)")


def make_repo(path: Path) -> list[str]:
    """Four commits: the trainer, notes, the re-associated scale (the third), more notes."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    text = TRAINER.read_text()
    assert EXACT_LOG[0] in text and SCALE[0] in text
    text = text.replace(*EXACT_LOG)
    shas = []
    for i, subject in enumerate(["the toy trainer", "notes", "scale the loss", "notes again"]):
        (path / "train_gpt2.py").write_text(text.replace(*SCALE) if i >= 2 else text)
        (path / "NOTES.txt").write_text(f"change {i}\n")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", subject)
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas


def test_bisect_on_identity_names_the_first_commit_that_changes_a_bit(tmp_path, tiny_checkpoint, training_tokens):
    shas = make_repo(tmp_path / "repo")
    (tmp_path / "toy.toml").write_text(TOML)
    out = tmp_path / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["bisect", "--repo", str(tmp_path / "repo"), "--good", shas[0], "--bad", shas[-1],
                     "--build", BUILD, "--frameworks", "toy", "--command-runner", str(tmp_path / "toy.toml"),
                     "--cases", "gpt2_1", "--steps", "3", "--device", "cpu", "--llmc", str(tiny_checkpoint),
                     "--data", str(training_tokens), "--out", str(out), "--expect", "identical"])
    assert code == 0, stdout.getvalue()
    result = json.loads((out / "bisect.json").read_text())
    assert result["first_bad"]["sha"] == shas[2] and result["first_bad"]["subject"] == "scale the loss"
    rows = {row["sha"]: row for row in result["tested"]}
    assert rows[shas[0]]["state"] == "good" and rows[shas[-1]]["verdict"] == "NOT IDENTICAL"
    assert 0 < rows[shas[-1]]["max_abs_diff"] < 1e-5  # within the loss threshold: only identity sees it
    assert not (out / "runs" / shas[0] / "pytorch").exists()  # no baseline framework ran


def test_bisect_on_identity_finds_a_change_only_step_ones_gradients_show(tmp_path, tiny_checkpoint, training_tokens):
    # The fake framework's LayerNorm bias gradients x1.05 from the second commit. One step: the loss is
    # computed before any update, so every logged loss is the same bits; only the step-1 capture each
    # commit records (with no baseline framework beside it) differs. Before it was recorded, a real
    # bisect over InfiniTrain builds judged a planted gradient change IDENTICAL at both endpoints.
    from support.fake_framework import LN_DEFECT_SUBJECT, make_fake_repo

    repo = make_fake_repo(tmp_path / "repo", commits=2, defect_index=1, broken_index=None, defect="ln_bias_grad")
    out = tmp_path / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["bisect", "--repo", str(repo.path), "--good", repo.shas[0], "--bad", repo.shas[-1],
                     "--cases", "gpt2_1", "--steps", "1", "--device", "cpu", "--llmc", str(tiny_checkpoint),
                     "--data", str(training_tokens), "--out", str(out), "--build", repo.build_command,
                     "--frameworks", "infinitrain", "--expect", "identical"])
    assert code == 0, stdout.getvalue()
    result = json.loads((out / "bisect.json").read_text())
    first = result["first_bad"]
    assert (first["sha"], first["subject"], first["verdict"]) == (repo.shas[1], LN_DEFECT_SUBJECT, "NOT IDENTICAL")
    assert first["max_abs_diff"] == 0.0  # the loss is the same bits
    assert "step 1's gradient ln1b[0] (relative 5.00e-02) is the first tensor that differs" in first["cause"], first
    assert first["reason"] == f"gpt2_1 infinitrain vs infinitrain (good commit): NOT IDENTICAL {first['cause']}"
    rows = {row["sha"]: row for row in result["tested"]}
    assert rows[repo.shas[0]]["verdict"] == "IDENTICAL"
    assert (out / "runs" / repo.shas[0] / "step1" / "infinitrain" / "gpt2_1.npz").is_file()
    md = (out / "bisect.md").read_text()
    assert "infinitrain against the good commit's build, bit for bit" in md
    assert f"| NOT IDENTICAL ({first['cause']}) |" in md
