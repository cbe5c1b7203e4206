"""Framework runners, one package each, all behind `base.FrameworkRunner`.

`registry.RUNNER_PACKAGES` is the one registration: a package listed there describes itself in
its `__init__.py` (`RUNNER`, a registry.RunnerSpec: name, CLI options, availability,
capabilities) and everything else -- the CLI's flags, the planner, `diagnose`, `bisect` -- reads
that through the functions below. Runner classes are imported only when used, so `lockstep run
--frameworks pytorch` works without megatron-core installed (docs/contributing.md: adding a runner).
"""

from __future__ import annotations

from lockstep.runners.registry import (RUNNER_PACKAGES, FrameworkOptions, add_runner_arguments,  # noqa: F401
                                       built_frameworks, default_frameworks, framework_names, framework_options_from,
                                       get_runner, options_for, reference_framework, spec_for, specs)


def __getattr__(name: str):
    if name == "RUNNERS":  # the registered framework names (older callers read this)
        return tuple(specs())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
