"""The `pytorch-fast` framework: the reference model as a performance-minded PyTorch user trains
it (torch.compile, SDPA attention, a fused optimizer): a throughput anchor, never the baseline.

This file registers it (`RUNNER`) and stays cheap to import: the runner class is imported when used.
"""

from dataclasses import dataclass

from lockstep.runners.registry import CAPTURE_AFTER_RUN, Capabilities, RunnerSpec


@dataclass(frozen=True)
class FastOptions:
    compile_model: bool = True  # torch.compile the model (tests turn it off: compiling takes a minute on a CPU)


RUNNER = RunnerSpec(
    name="pytorch-fast",
    runner="lockstep.runners.pytorch_fast.runner:PyTorchFastRunner",
    summary="the reference model with torch.compile, SDPA and a fused optimizer (a throughput anchor)",
    # Its compiled training loop has no hooks: step 1 is captured eagerly after the run.
    capabilities=Capabilities(step1_capture=CAPTURE_AFTER_RUN, parallel=()),
    options_type=FastOptions,
)


def __getattr__(name: str):
    if name == "PyTorchFastRunner":
        from lockstep.runners.pytorch_fast.runner import PyTorchFastRunner

        return PyTorchFastRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
