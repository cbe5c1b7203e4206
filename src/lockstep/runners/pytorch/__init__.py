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


def __getattr__(name: str):
    if name == "PyTorchRunner":
        from lockstep.runners.pytorch.runner import PyTorchRunner

        return PyTorchRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
