"""Golden values from two repeats; a run within tolerance passes, a run with one step moved
fails naming that step (also as JUnit)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from lockstep.cli import main
from lockstep.errors import FormatError
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record
from lockstep.golden import GOLDEN_K, check_run_dir, read_golden, record_golden

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

LOSSES = [10.98, 10.71, 10.52, 10.40, 10.31]
# Repeat 2 differs from repeat 1 at step 3 by 4e-6: a non-deterministic reference.
REPEAT2 = [10.98, 10.71, 10.52 + 4e-6, 10.40, 10.31]


def write(path, fw, case, losses, dtype="float32", meta=None):
    write_run_record(path, RunRecord(framework=fw, case=case, meta={"case_spec": {"dtype": dtype}, **(meta or {})},
                                     steps=[StepRecord(step=i + 1, loss=v, tokens_per_s=100.0)
                                            for i, v in enumerate(losses)]))


@pytest.fixture
def reference_run(tmp_path):
    """One `lockstep run --repeat 2` of pytorch: repeat 1 in place, repeat 2 under repeats/2."""
    run = tmp_path / "ref"
    write(run / "pytorch" / "gpt2_1.jsonl", "pytorch", "gpt2_1", LOSSES)
    write(run / "repeats" / "2" / "pytorch" / "gpt2_1.jsonl", "pytorch", "gpt2_1", REPEAT2)
    write(run / "pytorch" / "gpt2_1_bfloat16.jsonl", "pytorch", "gpt2_1_bfloat16", LOSSES, "bfloat16")
    write(run / "repeats" / "2" / "pytorch" / "gpt2_1_bfloat16.jsonl", "pytorch", "gpt2_1_bfloat16", LOSSES, "bfloat16")
    (run / "run.json").write_text(json.dumps({"baseline": "pytorch"}))
    return run


def test_record_mean_spread_and_tolerance(reference_run):
    golden = record_golden([reference_run])
    assert golden["framework"] == "pytorch" and golden["k"] == GOLDEN_K == 3.0
    steps = golden["cases"]["gpt2_1"]["steps"]
    assert [s["n"] for s in steps] == [2] * 5
    assert steps[2]["mean"] == pytest.approx(10.52 + 2e-6, abs=1e-12)
    assert steps[2]["spread"] == pytest.approx(4e-6, rel=1e-6)
    assert steps[2]["tolerance"] == pytest.approx(1.2e-5, rel=1e-6)  # 3 x 4e-6 beats the FP32 floor 1e-5
    assert steps[0]["spread"] == 0.0 and steps[0]["tolerance"] == 1e-5  # identical repeats: the dtype threshold
    assert golden["cases"]["gpt2_1_bfloat16"]["steps"][0]["tolerance"] == 1e-2


def test_check_passes_within_tolerance_and_names_the_moved_step(tmp_path, reference_run, capsys):
    gold = tmp_path / "golden.json"
    assert main(["golden", "record", str(reference_run), "--out", str(gold)]) == 0
    capsys.readouterr()

    ok_run = tmp_path / "ok"
    # 1.1e-5 off at step 3: outside the FP32 threshold, inside the tolerance the spread gives.
    write(ok_run / "infinitrain" / "gpt2_1.jsonl", "infinitrain", "gpt2_1",
          [v + (1.1e-5 if i == 2 else 5e-6) for i, v in enumerate(LOSSES)])
    assert main(["golden", "check", str(ok_run), "--golden", str(gold)]) == 0
    assert "PASS" in capsys.readouterr().out

    bad_run = tmp_path / "bad"
    write(bad_run / "infinitrain" / "gpt2_1.jsonl", "infinitrain", "gpt2_1",
          [v + (3e-5 if i == 3 else 0.0) for i, v in enumerate(LOSSES)])
    write(bad_run / "infinitrain" / "gpt2_1_bfloat16.jsonl", "infinitrain", "gpt2_1_bfloat16",
          [v + 1e-3 for v in LOSSES], "bfloat16")
    (bad_run / "run.json").write_text(json.dumps({"skipped": [
        {"case": "gpt2_1_bfloat16", "framework": "megatron", "reason": "needs CUDA"}]}))
    junit = tmp_path / "golden.xml"
    rc = main(["golden", "check", str(bad_run), "--golden", str(gold), "--junit", str(junit)])
    out = capsys.readouterr().out
    assert rc == 1 and "step 4: loss 10.4000300 is 3.000e-05 from the golden mean 10.4000000" in out

    verdicts = {(v.framework, v.case): v for v in check_run_dir(read_golden(gold), bad_run)}
    assert verdicts[("infinitrain", "gpt2_1")].first_bad_step == 4
    assert verdicts[("infinitrain", "gpt2_1_bfloat16")].outcome == "passed"
    assert verdicts[("megatron", "gpt2_1_bfloat16")].outcome == "skipped"

    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("3", "1", "0", "1")
    failure = root.find(".//testcase[@name='gpt2_1']/failure")
    assert failure is not None and "step 4" in failure.get("message")


def test_bad_golden_file_is_one_sentence(tmp_path):
    bad = tmp_path / "golden.json"
    bad.write_text('{"cases": {}}')
    with pytest.raises(FormatError, match="not a lockstep golden file"):
        read_golden(bad)
