"""`lockstep run --expect identical`: two builds of one trainer judged bit for bit. Two command-runner
entries of the same trainer are IDENTICAL (exit 0); pytorch-fast against pytorch (the same math,
SDPA's attention kernel instead of the reference's) is NOT IDENTICAL from step 1, its first differing
tensor the first attention's output, while its loss passes the FP32 threshold; named InfiniTrain
builds become frameworks `infinitrain@NAME`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lockstep.cli import main
from lockstep.errors import LockstepError
from lockstep.formats.run_record import read_run_record
from lockstep.runners import framework_names, get_runner
from lockstep.runners.infinitrain.options import parse_builds
from support.recompute_cases import recompute_matrix

TRAINER = Path(__file__).parents[1] / "runners" / "command_trainer" / "train_gpt2.py"
ENTRY = """
[frameworks.{name}]
command = "{{python}} {trainer} --llmc {{llmc}} --tokens {{tokens}} -B {{B}} -T {{T}} --accum {{accum}} --steps {{steps}} --lr {{lr}}"
families = ["gpt2"]
devices = ["cpu"]
dtypes = ["float32"]
"""


def cases_of(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    return {c["test_framework"]: c["cases"][0] for c in summary["comparisons"]}


@pytest.mark.integration
def test_two_builds_of_one_trainer_are_identical(tmp_path, capsys, tiny_checkpoint, training_tokens):
    toml = tmp_path / "t.toml"
    toml.write_text(ENTRY.format(name="toy-base", trainer=TRAINER) + ENTRY.format(name="toy-head", trainer=TRAINER))
    out = tmp_path / "o"
    rc = main(["run", "--frameworks", "toy-base,toy-head", "--command-runner", str(toml), "--cases", "gpt2_1",
               "--steps", "3", "--llmc", str(tiny_checkpoint), "--data", str(training_tokens), "--device", "cpu",
               "--out", str(out), "--no-report", "--no-history", "--expect", "identical"])
    text = capsys.readouterr().out
    case = cases_of(out)["toy-head"]
    assert rc == 0 and case["verdict"] == "IDENTICAL", text
    assert case["identity"]["identical"] and "losses only" in case["identity"]["captures"]
    assert "1 IDENTICAL" in text


@pytest.mark.integration
def test_jobs_runs_the_two_builds_at_once_with_the_same_verdict(tmp_path, capsys, tiny_checkpoint, training_tokens):
    """--jobs 2: the two trainers (processes of their own) run side by side; their records are the
    same bits as one after the other, and the comparison says the tok/s was measured that way."""
    toml = tmp_path / "t.toml"
    toml.write_text(ENTRY.format(name="toy-base", trainer=TRAINER) + ENTRY.format(name="toy-head", trainer=TRAINER))
    out = tmp_path / "o"
    rc = main(["run", "--frameworks", "toy-base,toy-head", "--command-runner", str(toml), "--cases", "gpt2_1",
               "--steps", "3", "--llmc", str(tiny_checkpoint), "--data", str(training_tokens), "--device", "cpu",
               "--out", str(out), "--no-report", "--no-history", "--expect", "identical", "--jobs", "2"])
    text = capsys.readouterr().out
    case = cases_of(out)["toy-head"]
    assert rc == 0 and case["verdict"] == "IDENTICAL", text
    assert "tok/s measured with --jobs 2: runs of separate processes overlapped" in " ".join(case["notes"])
    records = [read_run_record(out / fw / "gpt2_1.jsonl") for fw in ("toy-base", "toy-head")]
    assert all(r.meta["jobs"] == 2 for r in records)
    (base_start, base_end), (head_start, head_end) = ((r.meta["started_at"], r.meta["finished_at"]) for r in records)
    assert head_start < base_end and base_start < head_end  # ISO times of one clock: they overlapped


@pytest.mark.integration
def test_jobs_still_names_a_build_step_ones_gradient_shows(tmp_path, capsys, tiny_checkpoint, training_tokens):
    """--jobs 2 over two builds whose captures recover SGD's gradients: the test build's capture reads
    the baseline's (its recovery lr), so it waits for it; run at once, it once found none, recorded no
    capture, and the planted build was judged IDENTICAL on its losses alone (one step: the loss is
    computed before the update, so only the gradient shows the plant)."""
    from support.fake_framework import LN_BIAS_GRAD_DEFECT, write_fake_build

    good = write_fake_build(tmp_path / "good")
    planted = write_fake_build(tmp_path / "planted", ln_bias_grad_scale=LN_BIAS_GRAD_DEFECT)
    out = tmp_path / "o"
    rc = main(["run", "--frameworks", "infinitrain@good,infinitrain@planted", "--infinitrain-build", f"good={good}",
               "--infinitrain-build", f"planted={planted}", "--cases", "gpt2_1", "--steps", "1", "--llmc",
               str(tiny_checkpoint), "--data", str(training_tokens), "--device", "cpu", "--out", str(out),
               "--no-report", "--no-history", "--expect", "identical", "--jobs", "2"])
    text = capsys.readouterr().out
    case = cases_of(out)["infinitrain@planted"]
    assert rc == 1 and case["verdict"] == "NOT IDENTICAL", text
    identity = case["identity"]
    assert identity["first_step"] == 1 and identity["tensor"]["kind"] == "gradient", identity
    assert identity["tensor"]["name"].startswith("ln1b"), identity
    records = [read_run_record(out / f"infinitrain@{n}" / "gpt2_1.jsonl") for n in ("good", "planted")]
    assert all(r.meta["jobs"] == 2 and r.meta.get("step1_capture") for r in records), [r.meta for r in records]


@pytest.mark.integration
def test_another_kernel_is_not_identical_at_its_module_though_the_loss_passes(tmp_path, capsys, tiny_checkpoint,
                                                                             training_tokens):
    out = tmp_path / "o"
    rc = main(["run", "--frameworks", "pytorch,pytorch-fast", "--cases", "gpt2_1", "--steps", "3", "--llmc",
               str(tiny_checkpoint), "--data", str(training_tokens), "--device", "cpu", "--out", str(out),
               "--no-report", "--no-history", "--expect", "identical"])
    text = capsys.readouterr().out
    case = cases_of(out)["pytorch-fast"]
    assert rc == 1 and case["verdict"] == "NOT IDENTICAL", text
    identity = case["identity"]
    assert identity["first_step"] == 1 and identity["tensor"]["kind"] == "module output"
    assert identity["tensor"]["name"].startswith("attn"), identity
    assert case["loss_passed"] is True  # the threshold's verdict, beside
    assert "NOT IDENTICAL pytorch-fast vs pytorch: gpt2_1 (from step 1" in text


def test_named_infinitrain_builds_are_frameworks_of_their_own(tmp_path):
    options = parse_builds([f"base={tmp_path / 'a'}", f"head={tmp_path / 'b'}"])
    assert options.frameworks() == ["infinitrain@base", "infinitrain@head"]
    names = framework_names({"infinitrain": options})
    assert "infinitrain@base" in names and "infinitrain@head" in names and "infinitrain" not in names
    runner = get_runner("infinitrain@head", {"infinitrain": options})
    assert runner.name == "infinitrain@head" and runner.build_dir == tmp_path / "b"
    assert parse_builds([str(tmp_path / "a"), f"head={tmp_path / 'b'}"]).frameworks() == ["infinitrain",
                                                                                         "infinitrain@head"]
    with pytest.raises(LockstepError, match="2 unnamed builds"):
        parse_builds([str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(LockstepError, match="names the build 'x' twice"):
        parse_builds(["x=/a", "x=/b"])


@pytest.mark.integration
def test_a_recompute_case_is_judged_against_its_twin_on_each_framework(tmp_path, capsys, tiny_checkpoint,
                                                                       training_tokens):
    # The reference keeps every activation (recompute is the same math there), so its twin is
    # IDENTICAL, step 1's captures included; the run adds the twin itself and says so.
    matrix = tmp_path / "m.toml"
    matrix.write_text(recompute_matrix())
    out = tmp_path / "o"
    rc = main(["run", "--matrix", str(matrix), "--frameworks", "pytorch,pytorch-fast", "--llmc",
               str(tiny_checkpoint), "--data", str(training_tokens), "--device", "cpu", "--out", str(out),
               "--no-history"])
    text = capsys.readouterr().out
    assert rc == 0, text
    twins = {t["framework"]: t for t in json.loads((out / "summary.json").read_text())["twins"]}
    assert set(twins) == {"pytorch", "pytorch-fast"}
    for t in twins.values():
        assert (t["case"], t["twin"], t["passed"]) == ("rc_uniform1", "rc_uniform1_no_recompute", True)
        assert t["captures"] == "step 1's module outputs and gradients bit for bit"
    assert "added case rc_uniform1_no_recompute" in text
    assert "recompute pytorch/rc_uniform1 vs rc_uniform1_no_recompute: IDENTICAL" in text
    report = (out / "report.md").read_text()
    assert "## Recompute twins" in report and "| pytorch-fast | rc_uniform1 | rc_uniform1_no_recompute | IDENTICAL" in report
