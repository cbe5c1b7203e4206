"""`lockstep bisect --expect identical` over the command runner's toy trainer, on a CPU: a tiny git
repository whose trainer logs its loss to 17 significant digits, one commit re-associating the
attention scale ((q/√hd)·kᵀ instead of (q·kᵀ)/√hd: the same math, other bits). Its loss stays within
FP32's 1e-5 of the good build's, so only identity finds it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from support.fake_framework import git
from test_bisect_command_runner import BUILD, TOML, TRAINER
from lockstep.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.integration]

EXACT_LOG = ("train loss {total:.6f}", "train loss {total:.17g}")
SCALE = ("att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)", "att = (q / math.sqrt(hd)) @ k.transpose(-1, -2)")


def make_repo(path: Path) -> list[str]:
    """Four commits: the trainer, notes, the re-associated scale (the third), more notes."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    text = TRAINER.read_text()
    assert EXACT_LOG[0] in text and SCALE[0] in text
    text = text.replace(*EXACT_LOG)
    shas = []
    for i, subject in enumerate(["the toy trainer", "notes", "scale q first", "notes again"]):
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
    assert result["first_bad"]["sha"] == shas[2] and result["first_bad"]["subject"] == "scale q first"
    rows = {row["sha"]: row for row in result["tested"]}
    assert rows[shas[0]]["state"] == "good" and rows[shas[-1]]["verdict"] == "NOT IDENTICAL"
    assert 0 < rows[shas[-1]]["max_abs_diff"] < 1e-5  # within the loss threshold: only identity sees it
    assert not (out / "runs" / shas[0] / "pytorch").exists()  # no baseline framework ran
