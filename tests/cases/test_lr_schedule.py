"""The contract's lr per step against values worked by hand from InfiniTrain's formulas."""

import math

import numpy as np
import pytest

from lockstep.cases.lr_schedule import lr_at, lrs_of
from lockstep.cases.spec import CaseSpec, LRSchedule
from lockstep.errors import CaseError


def case(style="constant", warmup=2, init=0.0, decay_iters=0, min_lr=0.0, lr=1.0, steps=8):
    return CaseSpec(name="c", model="gpt2-tiny", dtype="float32", micro_batch=1, seq_len=8, total_batch=8,
                    steps=steps, lr=lr, lr_schedule=LRSchedule(style, warmup, init, decay_iters, min_lr)).check()


def test_no_schedule_is_the_lr_as_given():
    # Not rounded to FP32: the reference's Adam trained every no-schedule case at 1e-4 itself before
    # schedules came, and a rounded lr moved its losses by ~1e-8 (diagnose --at-step's numbers changed).
    c = CaseSpec(name="c", model="gpt2-tiny", dtype="float32", micro_batch=1, seq_len=8, total_batch=8, steps=3,
                 lr=1e-4)
    assert lrs_of(c) == (1e-4,) * 3 and lrs_of(c)[0] != float(np.float32(1e-4))


def test_none_ignores_the_warmup_as_infinitrain_builds_no_scheduler():
    assert lrs_of(case("none", warmup=2, steps=3, lr=0.5)) == (0.5, 0.5, 0.5)


def test_warmup_from_zero_starts_at_zero_and_reaches_the_peak_at_step_w_plus_1():
    assert lrs_of(case("constant", warmup=2)) == (0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    assert lrs_of(case("constant", warmup=4, init=0.5, steps=6)) == (0.5, 0.625, 0.75, 0.875, 1.0, 1.0)


def test_linear_decays_to_min_lr_at_decay_iters_then_stays():
    # span = 6 - 2 = 4 steps after the warm-up: 1, 0.75, 0.5, 0.25, 0 (t = 0..4), then 0.
    got = lrs_of(case("linear", warmup=2, decay_iters=6, steps=8))
    assert got[:2] == (0.0, 0.5)
    assert got[2:] == pytest.approx((1.0, 0.75, 0.5, 0.25, 0.0, 0.0), abs=1e-7)


def test_cosine_hand_values():
    got = lrs_of(case("cosine", warmup=2, min_lr=0.1, steps=6))
    span = 4
    want = [0.1 + 0.5 * (math.cos(math.pi * t / span) + 1) * 0.9 for t in range(4)]
    assert got[:2] == (0.0, 0.5)
    assert got[2:] == pytest.approx(want, rel=1e-6)
    assert got[2] == 1.0  # cos(0): the peak exactly


def test_inverse_square_root_counts_the_global_step():
    got = lrs_of(case("inverse-square-root", warmup=2, min_lr=0.0, steps=6))
    # the step after the warm-up is global step W (= 2): sqrt(2)/sqrt(2) = 1, then sqrt(2/3), sqrt(2/4) ...
    assert got == pytest.approx((0.0, 0.5, 1.0, math.sqrt(2 / 3), math.sqrt(2 / 4), math.sqrt(2 / 5)), rel=1e-6)
    floored = lrs_of(case("inverse-square-root", warmup=2, min_lr=0.75, steps=6))
    assert floored[3:] == pytest.approx((0.8164966, 0.75, 0.75), rel=1e-6)


def test_values_are_fp32_operation_by_operation():
    # 1e-3 * ((0 + 1e-3 * 0.5) / 1e-3) in FP32 -- not the FP64 value 5e-4.
    p = np.float32(1e-3)
    want = float(p * ((np.float32(0) + p * np.float32(0.5)) / p))
    assert lr_at(case("constant", lr=1e-3), 2) == want
    assert lr_at(case("constant", lr=1e-3), 3) == float(p)


def test_schedule_checks_name_the_problem():
    with pytest.raises(CaseError, match="lr_warmup_iters 8 must be below lr_decay_iters 8"):
        case("linear", warmup=8)
    with pytest.raises(CaseError, match="lr_decay_style 'step'"):
        case("step")
    with pytest.raises(CaseError, match="min_lr 2.0 is above the peak"):
        case("cosine", min_lr=2.0)


def test_round_trip_through_dict():
    c = case("cosine", warmup=2, init=0.25, decay_iters=6, min_lr=0.1)
    assert CaseSpec.from_dict(c.to_dict()) == c
    with pytest.raises(CaseError, match="lr_schedule: unknown field"):
        CaseSpec.from_dict({**c.to_dict(), "lr_schedule": {"style": "cosine"}})


def test_a_toml_matrix_carries_the_schedule_as_a_sub_table():
    from lockstep.cases.matrix import parse_matrix

    text = """
[defaults]
model = "gpt2-tiny"
dtype = "float32"
seq_len = 8
steps = 6
lr = 1e-4
micro_batch = 1
total_batch = 8

[[case]]
name = "warm"
[case.lr_schedule]
lr_decay_style = "linear"
lr_warmup_iters = 2
min_lr = 1e-5

[[case]]
name = "flat"
"""
    warm, flat = parse_matrix(text, source="m.toml")
    assert warm.lr_schedule == LRSchedule("linear", 2, 0.0, 0, 1e-5)
    assert flat.lr_schedule is None
    assert lr_at(warm, 1) == 0.0
    with pytest.raises(CaseError, match="m.toml: case bad: lr_schedule.lr_warmup_iters = 'x'"):
        parse_matrix(text.replace('name = "flat"', 'name = "bad"\nlr_schedule = {lr_warmup_iters = "x"}'),
                     source="m.toml")


def test_a_cases_first_steps_train_at_its_own_lrs():
    """The state diagnose --at-step starts from, a resume, a drift: the first n steps of a case whose
    decay runs over "the run's steps" keep that run's horizon (a 3-step warm-up then cut to 2 steps
    was an invalid schedule, and a cut cosine would have decayed faster)."""
    full = case("cosine", warmup=3, min_lr=0.1, steps=8)
    for n in (1, 2, 5):
        cut = full.first_steps(n, name=f"c_to_step{n}").check()
        assert lrs_of(cut) == lrs_of(full)[:n] and cut.steps == n
    assert full.first_steps(2).lr_schedule.lr_decay_iters == 8
    pinned = case("linear", warmup=2, decay_iters=6, min_lr=0.1, steps=8)
    assert pinned.first_steps(3).lr_schedule == pinned.lr_schedule
