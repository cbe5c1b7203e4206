"""The reference's saved training state under canonical (LLMC) names: what another framework's
runner writes into its own checkpoint format to start from it (`lockstep diagnose --at-step N`;
docs/reference/checkpoints.md).

The DCP folder holds the module's parameters under their module names and torch.optim's state
per parameter; here it is loaded into the reference module and its optimizer exactly as a resume
loads it, and read back through `llmc_parameters()`, so that every tensor comes out under its
LLMC name whatever the family's module layout (an InfiniTrain `adam.m.<i>` or a megatron
ShardedTensor is then a matter of that runner's weight map).
"""

from __future__ import annotations

import torch

from lockstep.capture.state import CanonicalState
from lockstep.cases.spec import CaseSpec
from lockstep.models import family as model_family
from lockstep.models import load_checkpoint
from lockstep.runners.pytorch import checkpoint as saved_state


def read_canonical_state(folder: str, step: int, case: CaseSpec, llmc_checkpoint: str) -> CanonicalState:
    """The reference's DCP folder `folder` (saved after `step` steps of `case`, whose model is the
    LLMC file `llmc_checkpoint`'s shape) as canonical tensors."""
    from lockstep.runners.pytorch.train import build_optimizer, import_optimizer_machinery, one_process_meant

    ckpt = load_checkpoint(llmc_checkpoint)
    family = model_family(ckpt.family)
    model = family.reference_class().from_llmc(ckpt.tensors, ckpt.config)
    import_optimizer_machinery()
    optimizer = build_optimizer(case.optimizer_of(family.optimizer), model.parameters(), case.lr)
    with one_process_meant():
        saved_state.load_training_state(saved_state.ResumePlan(str(folder), step), model, optimizer)
    params = model.llmc_parameters()
    state = CanonicalState(step, {n: p.detach().float().numpy().copy() for n, p in params.items()})
    counts = set()
    for name, p in params.items():
        s = optimizer.state.get(p, {})
        if "exp_avg" in s:
            state.exp_avg[name] = s["exp_avg"].detach().float().numpy().copy()
            state.exp_avg_sq[name] = s["exp_avg_sq"].detach().float().numpy().copy()
        if "step" in s:
            counts.add(int(torch.as_tensor(s["step"]).item()))
    if len(counts) > 1:
        raise ValueError(f"{folder}: Adam's step count differs between parameters ({sorted(counts)})")
    state.adam_step = counts.pop() if counts else None
    return state
