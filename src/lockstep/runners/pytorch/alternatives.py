"""The resume judge's alternatives (compare/resume.py), trained by the reference: the resumed
case's step-N checkpoint loaded the way each broken resume would load it, and trained to the end.

- data stream restarted: the stream read from batch 0 (step 1's window) after the load;
- data stream shifted: read from step N's window again (one step behind);
- optimizer state lost: a fresh Adam on the loaded weights; and Adam's moments zeroed, its step kept;
- Adam step count reset: the moments kept, the step count 0 (the next update bias-corrected as step 1).
SGD without momentum has no optimizer state, so a GPT-2 case trains only the data alternatives.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from lockstep.cases.spec import CaseSpec
from lockstep.compare.resume import ResumeAlternative, ResumeCause
from lockstep.errors import LockstepError
from lockstep.runners.base import RunInputs
from lockstep.runners.pytorch.checkpoint import CheckpointPlan, plan_for


def what_ifs(case: CaseSpec, adam: bool) -> list[tuple[str, ResumeCause, str, dict]]:
    """(label, cause, sentence, ResumePlan.what_if arguments) of every alternative of `case`."""
    n = case.checkpoint.resume_from
    out = [("data-restarted", ResumeCause.DATA_RESTARTED,
            f"the reference resumed from step {n}'s checkpoint reading the data from batch 0", {"data_step": 0})]
    if n > 1:
        out.append(("data-behind", ResumeCause.DATA_SHIFTED,
                    f"the reference resumed from step {n}'s checkpoint reading step {n}'s batch again (one step behind)",
                    {"data_step": n - 1}))
    if adam:
        out += [("fresh-adam", ResumeCause.OPTIMIZER_STATE_LOST,
                 f"the reference's step-{n} weights with a fresh Adam", {"optimizer": "fresh"}),
                ("moments-zeroed", ResumeCause.OPTIMIZER_STATE_LOST,
                 f"the reference resumed from step {n} with Adam's moments zeroed (step count kept)",
                 {"optimizer": "moments_zeroed"}),
                ("step-reset", ResumeCause.ADAM_STEP_RESET,
                 f"the reference resumed from step {n} with Adam's step count reset to 0 (moments kept)",
                 {"optimizer": "step_reset"})]
    return out


def train_alternatives(runner, case: CaseSpec, inputs: RunInputs, checkpoints_log: Path,
                       out_dir: Path) -> list[ResumeAlternative]:
    """Train every alternative of the resumed `case` from the checkpoint its plan names (relative
    to `checkpoints_log`, the resumed run's log path), each recorded under `out_dir` as
    `<case>.what-if-<label>`."""
    if case.checkpoint is None or case.checkpoint.resume_from is None:
        raise LockstepError(f"case {case.name} resumes from no step: it has no resume alternatives")
    resume = plan_for(case, checkpoints_log).resume
    out = []
    for label, cause, what, how in what_ifs(case, inputs.family.optimizer.kind == "adam"):
        alt_case = dataclasses.replace(case, name=f"{case.name}.what-if-{label}")
        alt_inputs = dataclasses.replace(inputs, capture=None, save_final_params=False,
                                         extra={**inputs.extra, "pytorch_checkpoints": CheckpointPlan(
                                             resume=resume.what_if(**how))})
        record = runner.run(alt_case, alt_inputs, out_dir)
        if not record.ok:
            raise LockstepError(f"{record.source}: the resume alternative '{what}' failed: {record.error}")
        out.append(ResumeAlternative(cause, what, record))
    return out
