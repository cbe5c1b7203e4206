"""The contract's learning rate of each step: `lr_at(case, step)`, the one place it is computed.

Megatron's schedule as InfiniTrain ported it (its lr_scheduler.cc, CreateLRScheduler), in FP32
operation by operation as that code does, so lockstep's own trainers use bit-for-bit the lr
InfiniTrain's optimizer holds: step n trains at the lr the scheduler holds after n - 1 steps
(the warm-up's initial lr at step 1). The warm-up is a lambda of the steps taken, s:
`peak * ((init + (peak - init) * (s / W)) / peak)`; at s = W the decay scheduler starts at its
own step t = s - W = 0 (SequentialLR's milestone), so step W + 1 trains at the peak. Linear
decay is torch's LinearLR in its chained form (each step multiplies the previous lr), the other
styles are lambdas of t; see docs/reference/training-contract.md for the formulas.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from lockstep.cases.spec import CaseSpec, LRSchedule

_F = np.float32
_PI = _F(math.pi)  # std::numbers::pi_v<float>


def lr_at(case: CaseSpec, step: int) -> float:
    """The lr step `step` (1-based) of `case` trains at, an FP32 value as a Python float."""
    if not 1 <= step <= case.steps:
        raise ValueError(f"case {case.name}: step {step} is outside 1..{case.steps}")
    return lrs_of(case)[step - 1]


def lrs_of(case: CaseSpec) -> tuple[float, ...]:
    """Every step's lr, step 1 first."""
    return _lrs(case.lr_schedule, case.lr, case.steps)


@lru_cache(maxsize=256)
def _lrs(schedule: LRSchedule | None, lr: float, steps: int) -> tuple[float, ...]:
    if schedule is None or schedule.lr_decay_style == "none":
        # No scheduler (InfiniTrain builds none for "none": no warm-up either): the lr as given, as each
        # framework's optimizer holds it. Rounding it to FP32 here moved every Adam run of the reference
        # by ~1e-8 (torch's Adam divides the lr by the bias correction in double before rounding).
        return (float(lr),) * steps
    peak = _F(lr)
    warmup = schedule.lr_warmup_iters
    out, current = [], peak
    for taken in range(steps):
        if taken < warmup:
            current = _warmup(schedule, peak, taken)
        else:
            current = _decay(schedule, peak, steps, taken - warmup, current)
        out.append(float(current))
    return tuple(out)


def _warmup(schedule: LRSchedule, peak: np.float32, taken: int) -> np.float32:
    init = _F(schedule.lr_warmup_init)
    ratio = _F(taken) / _F(schedule.lr_warmup_iters)
    return peak * ((init + (peak - init) * ratio) / peak)


def _decay(schedule: LRSchedule, peak: np.float32, steps: int, t: int, previous: np.float32) -> np.float32:
    """The decay scheduler's lr at its own step t (0 at the end of the warm-up)."""
    style, floor = schedule.lr_decay_style, _F(schedule.min_lr)
    decay_iters = schedule.decay_iters(steps)
    span = decay_iters - schedule.lr_warmup_iters
    if style == "constant":
        return peak * _F(1.0)
    if style == "linear":
        return _linear(peak, floor / peak, span, t, previous)
    if style == "cosine":
        if t > span:
            return peak * (floor / peak)
        ratio = _F(t) / _F(span)
        coeff = _F(0.5) * (_F(math.cos(float(_PI * ratio))) + _F(1.0))
        return peak * ((floor + coeff * (peak - floor)) / peak)
    if style == "inverse-square-root":
        global_step = t + schedule.lr_warmup_iters
        if global_step > decay_iters:
            return peak * (floor / peak)
        root_warmup = _F(math.sqrt(float(_F(max(schedule.lr_warmup_iters, 1)))))
        root_now = _F(math.sqrt(float(_F(max(global_step, 1)))))
        return peak * (max(floor, peak * root_warmup / root_now) / peak)
    raise ValueError(f"lr_decay_style {style!r} is not a decay style")


def _linear(peak: np.float32, end: np.float32, total: int, t: int, previous: np.float32) -> np.float32:
    """torch's LinearLR from factor 1 to `end` over `total` steps: closed form at t = 0, then chained."""
    start = _F(1.0)
    if t == 0:
        return peak * (start + (end - start) * _F(0) / _F(total))
    if t > total:
        return previous
    if t == total:
        before = start + (end - start) * _F(total - 1) / _F(total)
        return previous * (end / before)
    numerator = end - start
    denominator = start * _F(total) + _F(t - 1) * numerator
    return previous * (_F(1.0) + numerator / denominator)
