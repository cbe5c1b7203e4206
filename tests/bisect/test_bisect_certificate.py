"""`lockstep bisect` judges each commit exactly as `lockstep run` does, step-1 certificate included
(issue 31): over a fake framework whose defect is every LayerNorm bias gradient x1.05 -- which the
loss at the contract's lr does not see -- the bad endpoint FAILs on its certificate, naming the
LayerNorm biases, and the bisection finds the commit that introduced it. (Judged by the loss
alone, as bisect did before, both endpoints were good and the bisection could not start.)"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from support.fake_framework import LN_DEFECT_SUBJECT, make_fake_repo
from lockstep.cli import main

pytestmark = pytest.mark.integration  # in CI: bisect's own regressions (the slow lane leaves them in)


def test_a_defect_only_the_certificate_sees_is_found(tmp_path, tiny_checkpoint, training_tokens):
    # good .. bad is two commits, the defect in the first: the endpoints, then the one commit git asks for.
    repo = make_fake_repo(tmp_path / "repo", commits=2, defect_index=1, broken_index=None, defect="ln_bias_grad")
    out = tmp_path / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["bisect", "--repo", str(repo.path), "--good", repo.shas[0], "--bad", repo.shas[-1],
                     "--cases", "gpt2_1", "--steps", "3", "--device", "cpu", "--llmc", str(tiny_checkpoint),
                     "--data", str(training_tokens), "--out", str(out), "--build", repo.build_command,
                     "--no-diagnose"])
    result = json.loads((out / "bisect.json").read_text())
    assert code == 0, stdout.getvalue()
    first = result["first_bad"]
    assert (first["sha"], first["subject"]) == (repo.shas[1], LN_DEFECT_SUBJECT)
    assert first["verdict"] == "FAIL" and first["certificate"] == "differs"
    # The loss alone passes (|Δloss| within FP32's 1e-5): the certificate decided, and its cause names
    # the LayerNorm bias gradients and nothing else.
    assert first["max_abs_diff"] < 1e-5
    named = {n for n in ("ln1b", "ln2b", "lnfb", "ln1w", "qkvw", "fcw", "wte") if n in first["cause"]}
    assert named == {"ln1b", "ln2b", "lnfb"}, first["cause"]
    rows = {row["sha"]: row for row in result["tested"]}
    good = rows[repo.shas[0]]
    assert (good["state"], good["verdict"], good["certificate"]) == ("good", "PASS", "agrees")
    assert rows[repo.shas[-1]]["state"] == "bad"
    assert set(rows) == set(repo.shas)  # both endpoints and the commit between them
    assert [rows[sha]["state"] for sha in repo.shas] == ["good", "bad", "bad"]
    # The table and bisect.md say that the verdict includes the certificate.
    text = stdout.getvalue()
    assert "step-1 certificate differs" in text and "judged as `lockstep run` judges it" in text
    assert "step-1 certificate differs" in (out / "bisect.md").read_text()
