"""The verdict policy on real-shaped numbers: each class, and a threshold never loosened."""

from __future__ import annotations

import pytest

from lockstep.certify.certificate import Certificate
from lockstep.certify.classify import GRADIENT_ONLY, LOGGING, Finding
from lockstep.compare.policy import (AmplificationEvidence, VerdictClass, class_of, count_classes, judge_pair,
                                     logging_precision_bound, run_passes, wants_amplification_evidence)
from lockstep.compare.verdict import StepDiff
from lockstep.formats.run_record import RunRecord, StepRecord
from lockstep.step_contract import LOGGED_FP32_SEQUENTIAL, LOGGED_FP64_MEAN

THRESHOLD = 1e-5


def diffs(deltas: list[float], base: float = 10.8) -> list[StepDiff]:
    return [StepDiff(s, base, base + d, abs(d), THRESHOLD) for s, d in enumerate(deltas, start=1)]


def holding() -> Certificate:
    return Certificate("gpt2_2", "pytorch", "infinitrain", findings=[Finding(LOGGING, "loss", "logging precision only")])


def naming(line: str = "gradient of ln1b / ln2b / lnfb only") -> Certificate:
    return Certificate("gpt2_1", "pytorch", "infinitrain", findings=[Finding(GRADIENT_ONLY, "ln1b[0..1]", line)])


def test_a_clean_pair_passes_with_or_without_a_certificate():
    assert judge_pair(diffs([6e-7, -4e-6]), THRESHOLD, holding()).verdict is VerdictClass.PASS
    assert judge_pair(diffs([6e-7, -4e-6]), THRESHOLD, None).verdict is VerdictClass.PASS


def test_a_certificate_that_names_a_gradient_fails_a_loss_that_passes():
    """The 5%-wrong LayerNorm-bias build: 6.2e-6 at the contract's lr, within 1e-5, still a defect."""
    j = judge_pair(diffs([4.8e-6, 6.2e-6]), THRESHOLD, naming())
    assert j.verdict is VerdictClass.FAIL and j.cause == "gradient of ln1b / ln2b / lnfb only"
    assert j.notes == ["the loss alone is within the threshold at every step"]


def test_within_logging_precision_needs_the_bound_and_a_holding_certificate():
    """InfiniTrain's llama3_2 on H200: 1.93e-5 at step 1 against an FP32 sum that moves it by 1.70e-5."""
    d = diffs([1.93e-5, -1.1e-5])
    bound = logging_precision_bound(record("pytorch", [10.9, 10.8], fp32=[10.9 + 1.70e-5, 10.8 - 9e-6]),
                                    record("infinitrain", [10.9 + 1.93e-5, 10.8 - 1.1e-5], logged=LOGGED_FP32_SEQUENTIAL),
                                    None)
    assert bound.side == "test" and bound.per_step == pytest.approx({1: 1.70e-5, 2: 9e-6}, rel=1e-6)
    j = judge_pair(d, THRESHOLD, holding(), bound)
    assert j.verdict is VerdictClass.PASS_WITHIN_PRECISION and "1.70e-05" in j.cause
    assert judge_pair(d, THRESHOLD, None, bound).verdict is VerdictClass.FAIL_UNEXPLAINED  # no certificate
    assert judge_pair(d, THRESHOLD, naming(), bound).verdict is VerdictClass.FAIL  # a certificate that differs
    # Beyond threshold + bound at any step: not logging.
    j = judge_pair(diffs([1.93e-5, 3e-5]), THRESHOLD, holding(), bound)
    assert j.verdict is VerdictClass.FAIL_UNEXPLAINED and "logging precision (up to 1.70e-05)" in j.cause


def test_adam_amplification_is_a_failure_with_evidence_else_unexplained():
    d = diffs([2e-8, 4e-6, -1.14e-5, 8e-6])
    assert wants_amplification_evidence(d, THRESHOLD, holding(), "adam")
    assert not wants_amplification_evidence(d, THRESHOLD, holding(), "sgd")
    assert not wants_amplification_evidence(diffs([2e-5, 1e-6]), THRESHOLD, holding(), "adam")  # step 1 differs
    near = AmplificationEvidence(test_vs_fp64=1.3e-5, reference_vs_fp64=9e-6, reference_fp64="e.jsonl")
    j = judge_pair(d, THRESHOLD, holding(), None, near)
    assert j.verdict is VerdictClass.FAIL and j.cause.startswith("Adam amplifies last-bit differences")
    far = AmplificationEvidence(test_vs_fp64=1e-4, reference_vs_fp64=9e-6, reference_fp64="e.jsonl")
    j = judge_pair(d, THRESHOLD, holding(), None, far)
    assert j.verdict is VerdictClass.FAIL_UNEXPLAINED and "more than 3x" in j.cause
    # The certificate's summary is said once, and a bound that does not exist is not a thing tried.
    assert j.cause.startswith("step 1 agrees from inside (") and j.cause.count("agrees from inside") == 1
    assert "not explained by Adam amplification" in j.cause and "(no logging-precision bound applies)" in j.cause
    bare = judge_pair(d, THRESHOLD, holding(), None, None)
    assert bare.verdict is VerdictClass.FAIL_UNEXPLAINED and "nothing measured explains it" in bare.cause
    assert "not explained by no" not in bare.cause


def test_without_any_certificate_a_failing_loss_is_unexplained_and_says_why():
    no_capture = Certificate("c", "pytorch", "x", problem="x recorded no step 1 (it cannot show its step 1 from inside)")
    j = judge_pair(diffs([3e-5]), THRESHOLD, no_capture)
    assert j.verdict is VerdictClass.FAIL_UNEXPLAINED and "it cannot show its step 1 from inside" in j.cause


def record(fw: str, losses: list[float], fp32: list[float] | None = None, logged: str = LOGGED_FP64_MEAN) -> RunRecord:
    steps = [StepRecord(s, loss, loss_fp32_sum=None if fp32 is None else fp32[s - 1]) for s, loss in enumerate(losses, 1)]
    return RunRecord(fw, "c", steps=steps, meta={"logged_loss": logged})


def test_no_bound_where_both_sides_sum_in_fp32_or_the_token_losses_are_unknown():
    it = record("infinitrain", [10.9], logged=LOGGED_FP32_SEQUENTIAL)
    assert logging_precision_bound(record("infinitrain", [10.9], logged=LOGGED_FP32_SEQUENTIAL), it, None) is None
    assert logging_precision_bound(record("pytorch", [10.9]), it, None) is None  # no loss_fp32_sum recorded
    assert logging_precision_bound(record("pytorch", [10.9], fp32=[10.9]), record("megatron", [10.9]), None) is None


def test_summary_entries_and_the_run_rule():
    assert class_of({"verdict": "PASS within logging precision"}) is VerdictClass.PASS_WITHIN_PRECISION
    assert class_of({"verdict": "PASS", "throughput_passed": False}) is VerdictClass.FAIL
    assert class_of({"passed": True}) is VerdictClass.PASS and class_of({"error": "x"}) is VerdictClass.ERROR
    summary = {"comparisons": [{"cases": [{"case": "a", "verdict": "PASS"},
                                          {"case": "b", "verdict": "PASS within logging precision"}],
                                "missing": [], "errors": []}]}
    counts = count_classes(summary)
    assert run_passes(0, counts) and not run_passes(1, counts)
    summary["comparisons"][0]["cases"].append({"case": "c", "verdict": "FAIL unexplained"})
    assert not run_passes(0, count_classes(summary))
    assert not run_passes(0, count_classes({"comparisons": []}))  # nothing compared proves nothing
