"""`lockstep diagnose --at-step N` on InfiniTrain: the reference's state after step N written as
InfiniTrain's own step folder, which its `--load` resumes from (docs/reference/checkpoints.md).

The folder is what a one-rank `--save` would have left after step N: `model.ckpt` (the family
adapter's `native_state` of the reference's weights: every name InfiniTrain's state dict has, as
its LoadStateDict fails on a missing one), no `optimizer.ckpt` for SGD (it has no state, and gpt2
resumes with load_optimizer_state = false), and `trainer_state.json` with global_step N, the
loader position after N steps (consumed_batches: N·accum batches of the launch's micro batch)
and the shape its executable checks a folder against (its default config, the adapter's
`resume_shape`). The capture then launches a resume of it for step N+1 at the recovery lr, as it
launches step 1 (capture.py), so the gradient of step N+1 is recovered the same way.

Adam families are not started from a state yet: a folder for --load needs the reference's moments as
adam.m.<i> / adam.v.<i> in InfiniTrain's own parameter order, which lockstep learns only from a step
InfiniTrain saved (the step-1 capture pairs them, capture.moment_gradients), not before a launch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from lockstep.cases.spec import CaseSpec, CheckpointSpec
from lockstep.errors import RunError
from lockstep.formats.infinitrain_checkpoint import write_checkpoint_folder


def at_step_problem(case: CaseSpec, inputs) -> str | None:
    """Why this runner cannot start the case from the reference's state (None: it can)."""
    from lockstep.runners.infinitrain.families import adapter_for

    if inputs.family.optimizer.kind != "sgd":
        return ("InfiniTrain starts from the reference's state only for an SGD family: a --load folder of an Adam "
                "family needs the reference's moments in InfiniTrain's own parameter order (optimizer.ckpt's "
                "adam.m.<i>), which lockstep learns only from a step InfiniTrain saved")
    if case.lora is not None:
        return ("InfiniTrain cannot start a LoRA case from the reference's state: the reference's state is read as "
                "the base weights, not the adapters")
    adapter = adapter_for(inputs.model.family)
    if not adapter.resume_shape:
        return f"lockstep does not know the shape InfiniTrain's {adapter.executable} checks a --load folder against"
    return None


def resumed(case: CaseSpec, start_step: int) -> CaseSpec:
    """The launch as a resume after `start_step` that trains the one step after it."""
    return dataclasses.replace(case.with_overrides(steps=start_step + 1),
                               checkpoint=CheckpointSpec(resume_from=start_step))


def consumed_batches(case: CaseSpec, steps: int, tokens_per_step: int) -> int:
    """InfiniTrain's loader index (one rank) after `steps` steps of `tokens_per_step` tokens, in
    batches of the launch's micro batch (a capture's dump launch reads smaller ones)."""
    batch = case.micro_batch * case.seq_len
    if (steps * tokens_per_step) % batch:
        raise RunError(f"{steps} steps of {tokens_per_step} tokens are no whole number of {case.name}'s "
                       f"{case.micro_batch}x{case.seq_len}-token batches")
    return steps * tokens_per_step // batch


def write_reference_state(weights: dict, start_step: int, case: CaseSpec, inputs, run_dir: Path,
                          tokens_per_step: int) -> Path:
    """`weights` (canonical, the reference's after `start_step` steps of `tokens_per_step` tokens)
    as the step folder the resumed launch `case` loads (checkpoints.py names it); its path."""
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
                                   trainer_state)
