"""`--expect identical` (compare/identity.py): every step's loss bit for bit, IDENTICAL or NOT
IDENTICAL with the first step that differs, the loss threshold's own verdict kept beside it; through
`lockstep compare` on real run records."""

from __future__ import annotations

import json

from lockstep.cli import main
from lockstep.compare.identity import judge_identity
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record

LOSSES = [10.987654321012345, 10.5, 10.25]


def record(losses, framework="infinitrain@base") -> RunRecord:
    return RunRecord(framework=framework, case="gpt2_1", meta={"case_spec": {"name": "gpt2_1"}},
                     steps=[StepRecord(step=i + 1, loss=x, step_ms=10.0, tokens_per_s=100.0)
                            for i, x in enumerate(losses)])


def test_the_same_losses_are_identical_and_one_ulp_is_not():
    assert judge_identity(record(LOSSES), record(LOSSES)).identical
    import math

    nudged = [LOSSES[0], math.nextafter(LOSSES[1], 20.0), LOSSES[2]]
    v = judge_identity(record(LOSSES), record(nudged))
    assert not v.identical and v.first_step == 2 and v.loss_step == 2 and 0 < v.loss_delta < 1e-14
    assert v.sentence().startswith("NOT IDENTICAL from step 2")
    assert "losses only" in v.captures  # no step-1 captures recorded


def run_dirs(tmp_path, test_losses):
    for name, losses in (("base", LOSSES), ("head", test_losses)):
        write_run_record(tmp_path / name / "infinitrain" / "gpt2_1.jsonl", record(losses, "infinitrain"))
    return tmp_path / "base", tmp_path / "head"


def test_compare_expect_identical_exits_by_identity_and_keeps_the_threshold_beside(tmp_path, capsys):
    base, head = run_dirs(tmp_path, LOSSES)
    assert main(["compare", str(base), str(head), "--expect", "identical", "--json", str(tmp_path / "a.json"),
                 "--no-history"]) == 0
    assert "IDENTICAL" in capsys.readouterr().out
    base, head = run_dirs(tmp_path / "2", [LOSSES[0], LOSSES[1] + 1e-9, LOSSES[2]])
    rc = main(["compare", str(base), str(head), "--expect", "identical", "--json", str(tmp_path / "b.json"),
               "--no-history"])
    out = capsys.readouterr().out
    assert rc == 1 and "NOT IDENTICAL" in out
    case = json.loads((tmp_path / "b.json").read_text())["cases"][0]
    assert case["verdict"] == "NOT IDENTICAL" and case["identity"]["first_step"] == 2
    assert case["loss_passed"] is True and case["threshold"] == 1e-5  # within the threshold, still not identical
