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
