"""Framework runners, one package each, all behind `base.FrameworkRunner`.

`RUNNER_PACKAGES` is the one registration: a package listed here describes itself in its
`__init__.py` (`RUNNER`, a registry.RunnerSpec: name, CLI options, availability, capabilities)
and everything else -- the CLI's flags, the planner, `diagnose`, `bisect` -- reads that. Runner
classes are imported only when used, so `lockstep run --frameworks pytorch` works without
megatron-core installed (docs/contributing.md: adding a runner).
"""

from __future__ import annotations

import argparse
import functools
from typing import Any, Mapping

from lockstep.errors import LockstepError
from lockstep.runners.base import FrameworkRunner
from lockstep.runners.registry import RunnerSpec

RUNNER_PACKAGES: tuple[str, ...] = (
    "pytorch",
    "pytorch_fast",
    "megatron",
    "infinitrain",
    "command",
)

FrameworkOptions = Mapping[str, Any]  # a runner spec's name -> its options object


@functools.cache
def specs() -> Mapping[str, RunnerSpec]:
    """name -> RunnerSpec of every registered runner, in registration order."""
    from lockstep.runners.registry import load_specs

    return load_specs(RUNNER_PACKAGES)


def __getattr__(name: str):
    if name == "RUNNERS":  # the registered framework names (older callers read this)
        return tuple(specs())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def options_for(spec: RunnerSpec, framework_options: FrameworkOptions | None) -> Any:
    return spec.options((framework_options or {}).get(spec.name))


def spec_for(framework: str, framework_options: FrameworkOptions | None = None) -> RunnerSpec:
    """The spec providing `framework` (a registered name, or one a runner's options add, such as a
    command runner's trainer)."""
    all_specs = specs()
    if framework in all_specs and all_specs[framework].frameworks is None:
        return all_specs[framework]
    for spec in all_specs.values():
        if spec.frameworks is not None and framework in spec.names(options_for(spec, framework_options)):
            return spec
    raise LockstepError(f"unknown framework {framework!r}; known: {', '.join(framework_names(framework_options))} "
                        "(a trainer of a --command-runner TOML file is known once the file is given)")


def framework_names(framework_options: FrameworkOptions | None = None) -> list[str]:
    """Every framework name a run could use with these options."""
    return [n for spec in specs().values() for n in spec.names(options_for(spec, framework_options))]


def get_runner(name: str, framework_options: FrameworkOptions | None = None, **kwargs) -> FrameworkRunner:
    """The runner of framework `name` made with its spec's options from `framework_options`, or
    with `kwargs` as the options' fields (`get_runner("infinitrain", build_dir=...)`)."""
    spec = spec_for(name, framework_options)
    options = spec.options_type(**kwargs) if kwargs else options_for(spec, framework_options)
    return spec.create(name, options)


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """Every registered runner's own flags (e.g. --infinitrain-build, --megatron-native-bf16)."""
    for spec in specs().values():
        spec.add_arguments(parser)


def framework_options_from(args: argparse.Namespace) -> dict[str, Any]:
    """Each registered runner's options, read from parsed arguments (its own flags)."""
    return {name: spec.options_of(args) for name, spec in specs().items()}


def default_frameworks(framework_options: FrameworkOptions | None = None,
                       notes: list[str] | None = None) -> list[str]:
    """What `lockstep run` runs without --frameworks: each runner that says so (the reference
    first), and a note for each that would have been used but cannot be here."""
    names = []
    for spec in sorted(specs().values(), key=lambda s: not s.capabilities.reference):
        use = spec.default(options_for(spec, framework_options))
        if use is True:
            names.append(spec.name)
        elif isinstance(use, str) and notes is not None:
            notes.append(use)
    return names


def reference_framework() -> str:
    """lockstep's own reference trainer (diagnose's structure, the FP64 evidence)."""
    return next(name for name, spec in specs().items() if spec.capabilities.reference)


def built_frameworks() -> dict[str, RunnerSpec]:
    """The runners that run from a build directory (`lockstep bisect` builds each commit into one)."""
    return {name: spec for name, spec in specs().items() if spec.capabilities.build_option}
