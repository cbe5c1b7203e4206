"""`lockstep run` of a saving case and the case that resumes it: summary.json's "resumes" holds
the resume judge's verdict (compare/resume.py), and a broken resume fails the run naming its
cause (a planted data-stream restart, tests/support/defects.py), with the reference's
alternatives trained under evidence/resume/ only then."""

from __future__ import annotations

import json

import pytest

from lockstep.cli import main
from support import defects
from support.resume_case import RESUME_MATRIX as MATRIX

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)



def run(tmp_path, capsys, tiny_checkpoint, training_tokens, name):
    matrix = tmp_path / "resume.toml"
    matrix.write_text(MATRIX)
    out = tmp_path / name
    rc = main(["run", "--matrix", str(matrix), "--frameworks", "pytorch", "--device", "cpu", "--llmc",
               str(tiny_checkpoint), "--data", str(training_tokens), "--out", str(out), "--no-report"])
    text = capsys.readouterr().out
    return rc, " ".join(text.split()), json.loads((out / "summary.json").read_text()), out


def test_a_run_judges_its_resume_and_a_broken_one_fails_the_run(tmp_path, capsys, tiny_checkpoint, training_tokens,
                                                                  monkeypatch):
    rc, text, summary, out = run(tmp_path, capsys, tiny_checkpoint, training_tokens, "good")
    assert rc == 0, text
    [entry] = summary["resumes"]
    assert (entry["framework"], entry["case"], entry["resume_case"]) == ("pytorch", "resumed", "saving")
    assert entry["verdict"] == "resume exact" and entry["passed"] and entry["max_abs_diff"] == 0.0
    assert not (out / "evidence" / "resume").exists()  # an exact resume needs no alternatives
    # said on the terminal too, not only in summary.json
    assert "resume pytorch/resumed (from saving): resume exact: every loss after step" in text

    defects.inject("resume_data_restarted", monkeypatch)
    rc, text, summary, out = run(tmp_path, capsys, tiny_checkpoint, training_tokens, "broken")
    assert rc == 1, text
    [entry] = summary["resumes"]
    assert entry["verdict"] == "resume broken" and entry["cause"] == "data stream restarted at batch 0"
    assert "resume pytorch/resumed (from saving): resume broken (data stream restarted at batch 0)" in text
    assert (out / "evidence" / "resume" / "pytorch" / "resumed.what-if-data-restarted.jsonl").is_file()


def test_the_baseline_keeps_its_resume_pair_where_no_other_framework_runs_it(tmp_path, tiny_checkpoint):
    from lockstep.plan import RunRequest, plan_run

    matrix = tmp_path / "resume.toml"
    matrix.write_text(MATRIX)
    plan = plan_run(RunRequest(matrix=str(matrix), frameworks=["pytorch", "pytorch-fast"], device="cpu",
                               llmc=str(tiny_checkpoint), out=str(tmp_path / "o")), make_files=False)
    assert plan.skips == {
        ("saving", "pytorch-fast"): "checkpoint (save/resume) cases are not supported by pytorch-fast yet",
        ("resumed", "pytorch-fast"): "checkpoint (save/resume) cases are not supported by pytorch-fast yet"}


def test_megatron_plans_the_resume_pair_beside_the_reference(tmp_path, tiny_checkpoint):
    """megatron saves and resumes (runners/megatron/checkpoint.py): neither case is skipped, and the
    saving case comes first, so its step folders exist when the resume starts."""
    pytest.importorskip("megatron.core")
    from lockstep.plan import RunRequest, plan_run

    matrix = tmp_path / "resume.toml"
    matrix.write_text(MATRIX)
    plan = plan_run(RunRequest(matrix=str(matrix), frameworks=["pytorch", "megatron"], device="cpu",
                               llmc=str(tiny_checkpoint), out=str(tmp_path / "o")), make_files=False)
    assert plan.skips == {}
    assert [c.name for c in plan.cases] == ["saving", "resumed"]


@pytest.mark.slow
def test_a_resumed_case_is_certified_at_its_first_step_after_the_resume_point(tmp_path, capsys, tiny_checkpoint,
                                                                             training_tokens):
    """The step a resumed run computes first (resume_from + 1 = 3 here), recorded by both frameworks
    from the reference's state after step 2, is what its certificate certifies and names; the saving
    case's certificate is of step 1 (the negative control: the step is read, not assumed)."""
    pytest.importorskip("megatron.core")
    from lockstep.certify.certificate import certificate_path, read_certificate
    from lockstep.formats.step_capture import StepCapture

    matrix = tmp_path / "resume.toml"
    matrix.write_text(MATRIX.replace("lr = 0.1", "lr = 1e-3"))  # megatron trains it too: a stable lr
    out = tmp_path / "o"
    rc = main(["run", "--matrix", str(matrix), "--frameworks", "pytorch,megatron", "--device", "cpu", "--llmc",
               str(tiny_checkpoint), "--data", str(training_tokens), "--out", str(out), "--no-report"])
    text = " ".join(capsys.readouterr().out.split())
    assert rc == 0, text
    resumed = read_certificate(certificate_path(out / "megatron", "resumed"))
    saving = read_certificate(certificate_path(out / "megatron", "saving"))
    assert resumed.available and resumed.holds, resumed.summary_line()
    assert resumed.step == 3 and resumed.summary_line().startswith("step 3 agrees from inside")
    assert "step-3 certificate megatron vs pytorch on resumed: step 3 agrees from inside" in text
    assert saving.step == 1 and saving.summary_line().startswith("step 1 agrees from inside")
    for framework in ("pytorch", "megatron"):
        capture = StepCapture.load(out / "step1" / framework / "resumed.npz")
        assert capture.meta["request"]["start_step"] == 2, framework  # from the state after step 2
        assert capture.meta["request"]["start_state"].endswith("saving.checkpoints/step_000002")
