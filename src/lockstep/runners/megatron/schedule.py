"""megatron-core's own lr schedule (`OptimizerParamScheduler`) configured with the case's.

megatron-core computes its schedule itself, in FP64 Python floats (get_lr), where the contract
(cases/lr_schedule.py) follows InfiniTrain's FP32 port; the worker records the lr each step
trained at as megatron-core held it, and the comparison checks it against the contract's, so a
difference between the two is reported, never hidden here.
"""

from __future__ import annotations

import inspect

from lockstep.cases.spec import CaseSpec
from lockstep.errors import RunError


def lr_bounds(case: CaseSpec) -> tuple[float, float]:
    """The optimizer config's (lr, min_lr): the peak, and the floor of the decay (the peak without one)."""
    schedule = case.lr_schedule
    if schedule is None or schedule.lr_decay_style == "none":
        return case.lr, case.lr
    return case.lr, schedule.min_lr


def scheduler_arguments(case: CaseSpec) -> dict:
    """OptimizerParamScheduler's keyword arguments for the case (the same names in 0.16 and 0.19).
    Style "none", and no schedule, is megatron-core's constant style without warm-up (InfiniTrain
    builds no scheduler for it)."""
    schedule = case.lr_schedule
    steps = max(case.steps, 1)
    common = dict(start_wd=0.0, end_wd=0.0, wd_incr_steps=steps, wd_incr_style="constant")
    if schedule is None or schedule.lr_decay_style == "none":
        return dict(init_lr=case.lr, max_lr=case.lr, min_lr=case.lr, lr_warmup_steps=0, lr_decay_steps=steps,
                    lr_decay_style="constant", **common)
    return dict(init_lr=schedule.lr_warmup_init, max_lr=case.lr, min_lr=schedule.min_lr,
                lr_warmup_steps=schedule.lr_warmup_iters, lr_decay_steps=schedule.decay_iters(case.steps),
                lr_decay_style=schedule.lr_decay_style, **common)


def build_scheduler(optimizer, case: CaseSpec):
    """megatron-core's scheduler for `optimizer`; stepped once after every optimizer step, so step n
    trains at its lr after n - 1 steps (its constructor sets step 1's: the warm-up's initial lr)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    arguments = scheduler_arguments(case)
    accepted = inspect.signature(OptimizerParamScheduler.__init__).parameters
    missing = sorted(set(arguments) - set(accepted))
    if missing:
        raise RunError(f"case {case.name}: this megatron-core's OptimizerParamScheduler takes no "
                       f"{', '.join(missing)}; lockstep's schedule cannot be configured on it")
    return OptimizerParamScheduler(optimizer, **arguments)
