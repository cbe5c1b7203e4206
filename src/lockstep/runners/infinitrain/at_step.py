"""`lockstep diagnose --at-step N` on InfiniTrain: the reference's state after step N written as
InfiniTrain's own step folder, which its `--load` resumes from (docs/reference/checkpoints.md).

The folder is what a one-rank `--save` would have left after step N: `model.ckpt` (the family
adapter's `native_state` of the reference's weights: every name InfiniTrain's state dict has, as
its LoadStateDict fails on a missing one), `optimizer.ckpt` for Adam (the reference's moments as
`adam.m.<i>` / `adam.v.<i>` in InfiniTrain's own parameter order, and `adam.t` = N; none for SGD,
which has no state) and `trainer_state.json` with global_step N, the loader position after N steps
(consumed_batches: N·accum batches of the launch's micro batch) and the shape its executable checks
a folder against (its default config, the adapter's `resume_shape`). The capture then launches a
resume of it for step N+1 at the recovery lr, as it launches step 1 (capture.py).

InfiniTrain's parameter order is learnt from a step it saved: one probe step from the case's init,
whose first moments pair with the parameters they moved (capture.pair_moments). Step N+1's gradient
is then (m' - beta1·m)/(1 - beta1) of the moment it saved and the one loaded, and the update it
applied, (w_N - w_N+1)/lr, is compared with the reference's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from lockstep.cases.spec import CaseSpec, CheckpointSpec
from lockstep.errors import RunError
from lockstep.formats.infinitrain_checkpoint import write_checkpoint_folder


def at_step_problem(case: CaseSpec, inputs) -> str | None:
    """Why this runner cannot start the case from the reference's state (None: it can)."""
    from lockstep.runners.infinitrain.families import adapter_for

    if inputs.family.optimizer.kind not in ("sgd", "adam"):
        return f"InfiniTrain starts from the reference's state for SGD and Adam families, not {inputs.family.optimizer.kind}"
    if case.lora is not None:
        return ("InfiniTrain cannot start a LoRA case from the reference's state: the reference's state is read as "
                "the base weights, not the adapters")
    adapter = adapter_for(inputs.model.family)
    if not adapter.resume_shape:
        return f"lockstep does not know the shape InfiniTrain's {adapter.executable} checks a --load folder against"
    return None


def resumed(case: CaseSpec, start_step: int) -> CaseSpec:
    """The launch as a resume after `start_step` that trains the one step after it."""
    return case.first_steps(start_step + 1, checkpoint=CheckpointSpec(resume_from=start_step))


def consumed_batches(case: CaseSpec, steps: int, tokens_per_step: int) -> int:
    """InfiniTrain's loader index (one rank) after `steps` steps of `tokens_per_step` tokens, in
    batches of the launch's micro batch (a capture's dump launch reads smaller ones)."""
    batch = case.micro_batch * case.seq_len
    if (steps * tokens_per_step) % batch:
        raise RunError(f"{steps} steps of {tokens_per_step} tokens are no whole number of {case.name}'s "
                       f"{case.micro_batch}x{case.seq_len}-token batches")
    return steps * tokens_per_step // batch


def adam_state(order: list[str], exp_avg: dict, exp_avg_sq: dict, adam_step: int) -> dict[str, np.ndarray]:
    """The reference's Adam state (canonical names) as InfiniTrain's optimizer.ckpt holds it: `order[i]`'s
    moments as adam.m.<i> / adam.v.<i>, and the step count as a 0-d INT64 adam.t (optimizer.cc StateDict)."""
    missing = [n for n in order if n not in exp_avg]
    if missing:
        raise RunError(f"the reference's state has no Adam moments for {', '.join(missing[:3])}")
    out = {}
    for i, name in enumerate(order):
        out[f"adam.m.{i}"] = np.asarray(exp_avg[name], np.float32)
        out[f"adam.v.{i}"] = np.asarray(exp_avg_sq[name], np.float32)
    out["adam.t"] = np.array(adam_step, dtype=np.int64)
    return out


def write_reference_state(weights: dict, start_step: int, case: CaseSpec, inputs, run_dir: Path,
                          tokens_per_step: int, optimizer: dict[str, np.ndarray] | None = None) -> Path:
    """`weights` (canonical, the reference's after `start_step` steps of `tokens_per_step` tokens)
    as the step folder the resumed launch `case` loads (checkpoints.py names it), with `optimizer`
    (`adam_state`) as its optimizer.ckpt when given; its path."""
    from lockstep.runners.infinitrain.checkpoints import checkpoints_for
    from lockstep.runners.infinitrain.families import adapter_for

    adapter = adapter_for(inputs.model.family)
    plan = checkpoints_for(case, Path(run_dir).resolve())
    if plan is None or plan.resume_folder is None:
        raise RunError(f"case {case.name} resumes from no step folder")
    trainer_state = {**dict(adapter.resume_shape), "global_step": start_step,
                     "consumed_batches": consumed_batches(case, start_step, tokens_per_step), "last_lr": float(case.lr),
                     "ddp_size": 1, "tp_size": 1, "sp_size": 1, "pp_size": 1}
    return write_checkpoint_folder(plan.resume_folder.parent, start_step, adapter.native_state(weights, inputs.model),
                                   trainer_state, optimizer=optimizer)
