"""The one judge of `lockstep bisect`: a run's summary.json -> good, bad or skip."""

from __future__ import annotations

import json

from lockstep.bisect.judge import BAD, GOOD, SKIP, judge_run


def case(name="gpt2_1", passed=True, diff=2.8e-7, **extra) -> dict:
    return {"case": name, "dtype": "float32", "passed": passed, "max_abs_diff": diff, "max_diff_step": 3,
            "threshold": 1e-5, "error": None, **extra}


def write_summary(run_dir, cases, missing=(), errors=(), top_errors=()) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    comp = {"baseline_framework": "pytorch", "test_framework": "infinitrain", "passed": None, "cases": cases,
            "missing": list(missing), "errors": list(errors), "skipped": []}
    (run_dir / "summary.json").write_text(json.dumps({"comparisons": [comp], "errors": list(top_errors)}))


def test_every_pair_passing_is_good_and_shows_the_weakest_pass(tmp_path):
    write_summary(tmp_path, [case(), case("gpt2_2", diff=9.1e-6, verdict="PASS within logging precision",
                                           cause="FP32 loss-sum rounding")])
    j = judge_run(tmp_path)
    assert (j.state, j.verdict, j.cause, j.max_abs_diff) == (GOOD, "PASS within logging precision",
                                                             "FP32 loss-sum rounding", 9.1e-6)


def test_a_failing_pair_is_bad_naming_the_worst_case_and_the_certificates_cause(tmp_path):
    write_summary(tmp_path, [case(), case("gpt2_2", passed=False, diff=3.2e-5, verdict="FAIL", cause="gradient of fcb"),
                             case("gpt2_3", passed=False, diff=2.2e-4, verdict="FAIL unexplained")])
    j = judge_run(tmp_path)
    assert (j.state, j.verdict, j.failing_case, j.max_abs_diff) == (BAD, "FAIL unexplained", "gpt2_3", 2.2e-4)
    assert (j.baseline, j.test) == ("pytorch", "infinitrain")
    assert j.reason == ("gpt2_3 infinitrain vs pytorch: FAIL unexplained, max |Δloss| 2.200e-04 at step 3, "
                        "threshold 1e-05 (1 more failing)")


def test_without_the_verdict_field_passed_decides_alone(tmp_path):
    write_summary(tmp_path, [case(passed=False, diff=2.9e-4)])
    assert (judge_run(tmp_path).state, judge_run(tmp_path).verdict) == (BAD, "FAIL")


def test_a_crashed_run_is_bad_before_any_loss_difference(tmp_path):
    crashed = case("gpt2_2", passed=False, diff=None, error="infinitrain/gpt2_2.jsonl: run failed: exited with status 139")
    write_summary(tmp_path, [case(passed=False, diff=5e-4), crashed])
    j = judge_run(tmp_path)
    assert (j.state, j.verdict, j.failing_case) == (BAD, "ERROR", "gpt2_2")
    assert "exited with status 139" in j.reason


def test_a_missing_case_is_bad(tmp_path):
    write_summary(tmp_path, [case()], missing=[{"case": "gpt2_2", "message": "gpt2_2 is missing from infinitrain"}])
    j = judge_run(tmp_path)
    assert (j.state, j.verdict, j.failing_case, j.reason) == (BAD, "ERROR", "gpt2_2", "gpt2_2 is missing from infinitrain")


def test_nothing_compared_or_no_summary_cannot_be_judged(tmp_path):
    write_summary(tmp_path / "skipped", [])
    assert judge_run(tmp_path / "skipped").state == SKIP
    j = judge_run(tmp_path / "never-ran")
    assert (j.state, j.verdict) == (SKIP, "NO SUMMARY") and "did not reach its comparison" in j.reason


def test_a_pair_only_its_certificate_fails_is_bad_and_says_so(tmp_path):
    """The loss agrees (2.8e-7 within FP32's 1e-5) but the step-1 certificate differs: bad, and the
    sentence says the certificate decided; the same pair with an agreeing certificate is good."""
    differs = {"available": True, "holds": False}
    write_summary(tmp_path, [case(passed=False, verdict="FAIL", certificate=differs, cause="gradient of ln1b only")])
    j = judge_run(tmp_path)
    assert (j.state, j.verdict, j.certificate, j.cause) == (BAD, "FAIL", "differs", "gradient of ln1b only")
    assert j.reason == ("gpt2_1 infinitrain vs pytorch: FAIL, the step-1 certificate differs while the loss agrees "
                        "(max |Δloss| 2.800e-07 at step 3, threshold 1e-05)")
    write_summary(tmp_path, [case(certificate={"available": True, "holds": True})])
    assert (judge_run(tmp_path).state, judge_run(tmp_path).certificate) == (GOOD, "agrees")
    write_summary(tmp_path, [case(certificate={"available": False, "problem": "no capture"})])
    assert judge_run(tmp_path).certificate == "not made"
