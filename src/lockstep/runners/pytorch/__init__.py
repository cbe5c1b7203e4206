"""The `pytorch` framework: lockstep's own reference trainer (runner.py drives train.py).

This file registers it (`RUNNER`) and stays cheap to import: the runner class is imported when used.
"""

from lockstep.runners.registry import CAPTURE_WHILE_TRAINING, Capabilities, RunnerSpec

RUNNER = RunnerSpec(
    name="pytorch",
    runner="lockstep.runners.pytorch.runner:PyTorchRunner",
    summary="lockstep's reference trainer: each family's plain-PyTorch reference module",
    # One process records step 1 as it trains; several DP ranks capture it after the run.
    capabilities=Capabilities(step1_capture=CAPTURE_WHILE_TRAINING, parallel=("dp", "zero"), reference=True),
    default=lambda options: True,
)


# The reference's public surface, besides its declared services (runners/reference.py): the
# contract's step and the step capture, for trainers built on the reference's math (pytorch-fast).
# Nothing outside this package imports its modules; these names are the way in.
PUBLIC = {
    "PyTorchRunner": "lockstep.runners.pytorch.runner",
    "MicroBatch": "lockstep.runners.pytorch.step",
    "contract_step": "lockstep.runners.pytorch.step",
    "token_losses": "lockstep.runners.pytorch.step",
    "set_lr": "lockstep.runners.pytorch.step",
    "capture_case": "lockstep.runners.pytorch.train",
}


def __getattr__(name: str):
    if name in PUBLIC:  # imported when used: this file stays cheap (no torch)
        import importlib

        return getattr(importlib.import_module(PUBLIC[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
