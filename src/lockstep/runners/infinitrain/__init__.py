"""The `infinitrain` framework: an external InfiniTrain build's example executables (runner.py),
one small adapter per model family (families/<family>.py).

This file registers it (`RUNNER`) and stays cheap to import: the runner class is imported when used.
"""

import os
from dataclasses import replace

from lockstep.runners.infinitrain.options import (BUILD_ENV_VAR, COMMIT_FILE, InfiniTrainOptions,  # noqa: F401
                                                 parse_builds)
from lockstep.runners.registry import CAPTURE_AFTER_RUN, Capabilities, RunnerSpec


def _add_arguments(parser) -> None:
    parser.add_argument("--infinitrain-build", action="append", metavar="[NAME=]DIR",
                        help=f"InfiniTrain build dir holding gpt2 (or {BUILD_ENV_VAR}); NAME=DIR, repeatable, adds "
                             "the framework infinitrain@NAME for each named build")


def _options_from(args) -> InfiniTrainOptions:
    return parse_builds(getattr(args, "infinitrain_build", None))


def _default(options: InfiniTrainOptions) -> bool:
    return bool(os.environ.get(BUILD_ENV_VAR) or options.builds)


def _make(framework: str, options: InfiniTrainOptions):
    from lockstep.runners.infinitrain.runner import InfiniTrainRunner

    return InfiniTrainRunner(build_dir=options.build_of(framework), name=framework)


def _from_record(options: InfiniTrainOptions, meta: dict) -> InfiniTrainOptions:
    """The build an earlier run used, when none is given now."""
    build = meta.get("infinitrain_build")
    if not build or build == "None":
        return options
    _, _, name = str(meta.get("framework", "")).partition("@")
    if name:
        return options if name in dict(options.builds) else replace(options, builds=(*options.builds, (name, build)))
    return options if options.build_dir else replace(options, build_dir=build)


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
    frameworks=InfiniTrainOptions.frameworks,
    make=_make,
)


def __getattr__(name: str):
    if name == "InfiniTrainRunner":
        from lockstep.runners.infinitrain.runner import InfiniTrainRunner

        return InfiniTrainRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
