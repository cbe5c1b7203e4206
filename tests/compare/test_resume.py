"""The resume judge's rules on one measured run: gpt2-tiny (seed 42, Tiny Shakespeare, B=4 T=64,
lr 1e-3, 6 steps) trained by the pytorch reference on this workplace's CPU, 2026-12-02. The
resumes that training produces (and their negative controls) are in
tests/runners/test_pytorch_resume.py; here each rule's edge is set by moving those losses."""

from __future__ import annotations

import pytest

from lockstep.compare.resume import (ResumeAlternative, ResumeCause, ResumeVerdictClass, judge_resume)
from lockstep.errors import LockstepError
from lockstep.formats.run_record import RunRecord, StepRecord

MEASURED = [10.843523796647787, 10.836330078542233, 10.830237489193678, 10.831285748630762, 10.837457600980997,
            10.846799951046705]
RESUME_AT = 3


def record(losses, first=1, dtype="float32", name="c", resume_from=None, **meta) -> RunRecord:
    spec = {"dtype": dtype, "model": "gpt2-tiny"}
    if resume_from is not None:
        spec["checkpoint"] = {"resume_from": resume_from}
    return RunRecord(framework="pytorch", case=name, steps=[StepRecord(first + i, v) for i, v in enumerate(losses)],
                     meta={"case_spec": spec, **meta})


FULL = record(MEASURED)


def resumed(losses) -> RunRecord:
    return record(losses, first=RESUME_AT + 1, name="r", resume_from=RESUME_AT)


def test_bitwise_equal_losses_are_resume_exact():
    v = judge_resume(FULL, resumed(MEASURED[RESUME_AT:]))
    assert v.verdict is ResumeVerdictClass.EXACT and v.passes and v.max_abs_diff == 0.0 and v.cause is None
    assert v.sentence() == "resume exact: every loss after step 3 bitwise equal to the uninterrupted run"


def test_within_the_dtype_threshold_says_by_how_much():
    moved = [MEASURED[3], MEASURED[4] + 4e-6, MEASURED[5] - 2e-6]
    v = judge_resume(FULL, resumed(moved))
    assert v.verdict is ResumeVerdictClass.WITHIN_THRESHOLD and v.passes
    assert v.max_abs_diff == pytest.approx(4e-6, rel=1e-3) and v.worst_step == 5 and v.threshold == 1e-5
    assert v.sentence().startswith("resume within threshold: max |dloss| 4e-06 at step 5 <= 1e-05 (default)")
    # BF16's threshold is the policy's 1e-2: 5e-3 passes there, not in FP32.
    far = [MEASURED[3] + 5e-3, *MEASURED[4:]]
    assert judge_resume(FULL, resumed(far)).verdict is ResumeVerdictClass.BROKEN
    bf16 = record(MEASURED, dtype="bfloat16")
    assert judge_resume(bf16, record(far, first=4, dtype="bfloat16", resume_from=3)).verdict \
        is ResumeVerdictClass.WITHIN_THRESHOLD


def test_a_resume_that_trains_from_step_0_is_told_by_the_shifted_uninterrupted_run():
    v = judge_resume(FULL, resumed(MEASURED[:3]))
    assert v.verdict is ResumeVerdictClass.BROKEN and v.cause is ResumeCause.NOT_RESUMED
    assert "bitwise equal to the uninterrupted run from step 1" in v.cause_detail
    other = judge_resume(FULL, resumed(MEASURED[1:4]))  # step 1's state loaded instead of step 3's
    assert other.cause is ResumeCause.OTHER_STEP and "from step 2 (step 1's state)" in other.cause_detail


def test_an_alternative_within_the_threshold_names_the_cause_and_an_exact_one_wins_even_within():
    restarted = [10.83, 10.845, 10.86]  # what a restarted stream trains, say
    alt = ResumeAlternative(ResumeCause.DATA_RESTARTED, "the reference reading from batch 0",
                            record(restarted, first=4))
    near = judge_resume(FULL, resumed([v + 3e-6 for v in restarted]), [alt])
    assert near.verdict is ResumeVerdictClass.BROKEN and near.cause is ResumeCause.DATA_RESTARTED
    assert "within 1e-05 of the reference reading from batch 0" in near.cause_detail
    # An alternative 1e-6 from the uninterrupted run: a resume equal to it bitwise is broken, though within 1e-5.
    subtle = [v + 1e-6 for v in MEASURED[3:]]
    alt = ResumeAlternative(ResumeCause.ADAM_STEP_RESET, "step reset", record(subtle, first=4))
    v = judge_resume(FULL, resumed(subtle), [alt])
    assert v.verdict is ResumeVerdictClass.BROKEN and v.cause is ResumeCause.ADAM_STEP_RESET
    assert v.max_abs_diff < v.threshold
    # A resume within the threshold of both: within threshold, saying it cannot tell them apart.
    v = judge_resume(FULL, resumed([x + 5e-7 for x in MEASURED[3:]]), [alt])
    assert v.verdict is ResumeVerdictClass.WITHIN_THRESHOLD and "cannot be told from step reset" in v.cause_detail


def test_an_alternative_equal_to_the_uninterrupted_run_tells_nothing():
    sgd_fresh = ResumeAlternative(ResumeCause.OPTIMIZER_STATE_LOST, "fresh optimizer (SGD)", record(MEASURED[3:], first=4))
    v = judge_resume(FULL, resumed(MEASURED[3:]), [sgd_fresh])
    assert v.verdict is ResumeVerdictClass.EXACT and v.uninformative == ["fresh optimizer (SGD)"]


def test_a_resume_like_nothing_known_is_broken_with_its_cause_untold():
    v = judge_resume(FULL, resumed([11.5, 11.6, 11.7]))
    assert v.verdict is ResumeVerdictClass.BROKEN and v.cause is ResumeCause.UNTOLD
    assert v.cause_detail.startswith("no candidate within 1e-05; the nearest candidate")
    assert v.to_json()["cause"] == ResumeCause.UNTOLD.value


def test_per_rank_losses_name_the_rank_that_was_not_restored():
    full = record(MEASURED, rank_losses={"4": [10.80, 10.86]})
    broken = record([MEASURED[3] + 0.01, *MEASURED[4:]], first=4, resume_from=3, rank_losses={"4": [10.80, 10.88]})
    v = judge_resume(full, broken)
    assert v.cause is ResumeCause.SHARD_NOT_RESTORED and v.cause_detail.startswith("at step 4 rank(s) 1 differ")


def test_what_cannot_be_judged_is_one_sentence_naming_the_file():
    with pytest.raises(LockstepError, match=r"u.jsonl: has no step 6, which the resumed run trained"):
        judge_resume(RunRecord("pytorch", "c", FULL.steps[:5], FULL.meta, source="u.jsonl"), resumed(MEASURED[3:]))
    failed = RunRecord("pytorch", "r", [], {}, status="failed", error="boom", source="r.jsonl")
    with pytest.raises(LockstepError, match=r"r.jsonl: the resumed run failed \(boom\)"):
        judge_resume(FULL, failed, resume_from=3)
    with pytest.raises(LockstepError, match="no step after the resume point 6"):
        judge_resume(FULL, record(MEASURED), resume_from=6)
