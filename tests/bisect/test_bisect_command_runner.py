"""`lockstep bisect` over the command runner's toy trainer, on a CPU: a tiny git repository whose
commits change tests/runners/command_trainer/train_gpt2.py, one of them planting GELU's cubic
constant x10; the "build" copies the trainer into the commit's build directory and the TOML's
{build} runs it from there. docs/contributing.md shows the same demo by hand."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from support.fake_framework import git
from lockstep.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.integration]

TRAINER = Path(__file__).parents[1] / "runners" / "command_trainer" / "train_gpt2.py"
GOOD_GELU = "else 0.044715  #"
BAD_GELU = "else 0.44715  #"
TOML = """[frameworks.toy]
command = "{python} {build}/train_gpt2.py --llmc {llmc} --tokens {tokens} -B {B} -T {T} --accum {accum} --steps {steps} --lr {lr}"
families = ["gpt2"]
devices = ["cpu"]
dtypes = ["float32"]
"""
BUILD = 'cp train_gpt2.py "$LOCKSTEP_BISECT_BUILD"/'


def make_toy_repo(path: Path) -> list[str]:
    """Five commits: the trainer, two unrelated changes, the GELU defect (the fourth), one more change."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    text = TRAINER.read_text()
    assert GOOD_GELU in text
    shas = []
    for i, subject in enumerate(["the toy trainer", "notes", "more notes", "tidy GELU", "notes again"]):
        (path / "train_gpt2.py").write_text(text.replace(GOOD_GELU, BAD_GELU) if i >= 3 else text)
        (path / "NOTES.txt").write_text(f"change {i}\n")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", subject)
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas


def test_bisect_names_the_commit_that_planted_the_defect(tmp_path, tiny_checkpoint, training_tokens):
    shas = make_toy_repo(tmp_path / "repo")
    toml = tmp_path / "toy.toml"
    toml.write_text(TOML)
    out = tmp_path / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["bisect", "--repo", str(tmp_path / "repo"), "--good", shas[0], "--bad", shas[-1],
                     "--build", BUILD, "--frameworks", "pytorch,toy", "--command-runner", str(toml),
                     "--cases", "gpt2_1", "--steps", "3", "--device", "cpu", "--llmc", str(tiny_checkpoint),
                     "--data", str(training_tokens), "--out", str(out), "--no-diagnose"])
    assert code == 0, stdout.getvalue()
    result = json.loads((out / "bisect.json").read_text())
    assert result["first_bad"]["sha"] == shas[3] and result["first_bad"]["subject"] == "tidy GELU"
    rows = {row["sha"]: row for row in result["tested"]}
    assert rows[shas[0]]["state"] == "good" and rows[shas[-1]]["state"] == "bad"
    assert rows[shas[-1]]["max_abs_diff"] > 1e-4
    # Each commit's trainer ran from its own build directory.
    for sha, row in rows.items():
        record = json.loads((out / "runs" / sha / "toy" / "gpt2_1.jsonl").read_text().splitlines()[0])
        assert f"builds/{sha}/train_gpt2.py" in json.dumps(record), sha
