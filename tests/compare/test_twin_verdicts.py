"""A recompute case against its twin on the same framework, bit for bit, and the run's verdict."""

from __future__ import annotations

from lockstep.compare.twins import judge_twins
from lockstep.formats.run_record import RunRecord, StepRecord


def record(framework: str, case: str, losses: list[float], status: str = "ok") -> RunRecord:
    return RunRecord(framework, case, [StepRecord(i + 1, x) for i, x in enumerate(losses)], status=status)


def test_each_framework_is_judged_against_its_own_twin():
    records = {("pytorch", "2"): record("pytorch", "2", [11.0, 10.5, 10.25]),
               ("pytorch", "2_rc"): record("pytorch", "2_rc", [11.0, 10.5, 10.25]),
               ("infinitrain", "2"): record("infinitrain", "2", [11.0, 10.5, 10.25]),
               ("infinitrain", "2_rc"): record("infinitrain", "2_rc", [11.0, 10.5, 10.250000000000002]),
               ("megatron", "2"): record("megatron", "2", [11.0]),
               ("megatron", "2_rc"): record("megatron", "2_rc", [11.0], status="failed")}
    entries = {e["framework"]: e for e in judge_twins(records, {"2_rc": "2"})}
    assert set(entries) == {"pytorch", "infinitrain"}  # megatron's recompute run failed: said elsewhere
    assert entries["pytorch"]["passed"] and entries["pytorch"]["sentence"].startswith("IDENTICAL")
    bad = entries["infinitrain"]
    assert not bad["passed"] and bad["twin"] == "2" and bad["loss_step"] == 3
    assert bad["sentence"].startswith("NOT IDENTICAL from step 3") and "(by 1.776e-15)" in bad["sentence"]


def test_a_twin_that_is_not_identical_fails_a_one_framework_run(tmp_path):
    from lockstep.cases.spec import CaseSpec
    from lockstep.execute import CaseOutcome
    from lockstep.run_verdict import run_verdict

    spec = CaseSpec(name="2", model="gpt2-tiny", dtype="float32", micro_batch=4, seq_len=64, total_batch=256,
                    steps=2, lr=1e-4)
    outcomes = [CaseOutcome(spec, "infinitrain", record("infinitrain", "2", [11.0, 10.5])),
                CaseOutcome(spec, "infinitrain", record("infinitrain", "2_rc", [11.0, 10.75]))]
    summary = {"comparisons": [], "twins": judge_twins({(o.framework, o.record.case): o.record for o in outcomes},
                                                       {"2_rc": "2"})}
    verdict = run_verdict(outcomes, summary, ["infinitrain"], tmp_path)
    assert verdict.word == "FAIL" and verdict.exit_code == 1
    assert verdict.lines[1] == ("  recompute infinitrain/2_rc vs 2: NOT IDENTICAL from step 2: losses only: "
                                "infinitrain/2, infinitrain/2_rc recorded no step-1 capture; loss first differs at "
                                "step 2 (by 2.500e-01)")
    assert "its recompute cases compared with their twins without recompute" in verdict.lines[0]
    summary["twins"][0]["passed"] = True  # the same run with an identical twin: compared, and it holds
    assert run_verdict(outcomes, summary, ["infinitrain"], tmp_path).exit_code == 0
