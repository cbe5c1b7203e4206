"""The `infinitrain` framework: an external InfiniTrain build's example executables (runner.py),
one small adapter per model family (families/<family>.py).

This file registers it (`RUNNER`) and stays cheap to import: the runner class is imported when used.
"""

import os

from lockstep.runners.infinitrain.options import BUILD_ENV_VAR, COMMIT_FILE, InfiniTrainOptions  # noqa: F401
from lockstep.runners.registry import CAPTURE_AFTER_RUN, Capabilities, RunnerSpec


def _add_arguments(parser) -> None:
    parser.add_argument("--infinitrain-build", help=f"InfiniTrain build dir holding gpt2 (or {BUILD_ENV_VAR})")


def _options_from(args) -> InfiniTrainOptions:
    return InfiniTrainOptions(build_dir=getattr(args, "infinitrain_build", None))


def _default(options: InfiniTrainOptions) -> bool:
    return bool(os.environ.get(BUILD_ENV_VAR))


def _from_record(options: InfiniTrainOptions, meta: dict) -> InfiniTrainOptions:
    """The build an earlier run used, when none is given now."""
    build = meta.get("infinitrain_build")
    if options.build_dir or not build or build == "None":
        return options
    return InfiniTrainOptions(build_dir=build)


RUNNER = RunnerSpec(
    name="infinitrain",
    runner="lockstep.runners.infinitrain.runner:InfiniTrainRunner",
    summary="an InfiniTrain build's example executables (gpt2, llama3, qwen3, tiny_mixtral), as subprocesses",
    # Step 1 from one process's saved weights and module dumps, after the run (capture.py); parallel
    # runs put every thread on a CUDA device.
    capabilities=Capabilities(step1_capture=CAPTURE_AFTER_RUN, parallel=("dp", "tp", "sp", "pp", "vpp", "zero"),
                              family_adapters="lockstep.runners.infinitrain.families",
                              build_option="build_dir", commit_file=COMMIT_FILE),
    options_type=InfiniTrainOptions,
    add_arguments=_add_arguments,
    options_from=_options_from,
    default=_default,
    from_record=_from_record,
)


def __getattr__(name: str):
    if name == "InfiniTrainRunner":
        from lockstep.runners.infinitrain.runner import InfiniTrainRunner

        return InfiniTrainRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
