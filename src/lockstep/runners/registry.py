"""What a framework runner says about itself, so that nothing outside its package names it.

Every runner package (`lockstep/runners/<package>/__init__.py`) defines `RUNNER`, a `RunnerSpec`:
its name, the CLI options it takes (`add_arguments`, read back by `options_from` into its own
options dataclass), whether it can run on this machine (`available`), whether `lockstep run`
uses it when `--frameworks` is not given (`default`), and its `Capabilities` (step-1 capture,
devices, families, parallel layouts, a build directory for `lockstep bisect`). The planner, the
CLI, `diagnose` and `bisect` read these; a run request carries one options object per runner
(`framework_options`, keyed by the spec's name).

A package's `__init__.py` must stay cheap to import (no torch, never megatron-core): the CLI
imports every registered package to build its parser. The runner class itself is named as
"module:Class" and imported only when a run needs it, so `--frameworks pytorch` works without
megatron-core installed.

Per-family code of a runner (megatron-core's layer switches, InfiniTrain's executable) lives in
its package as `<Capabilities.family_adapters>.<family>` (a module per family, found by name,
defining `ADAPTER`); a family it cannot train is listed in `unsupported_families` with the
reason. `family_gaps` checks that every registered family is one or the other
(docs/contributing.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import importlib.util
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

from lockstep.errors import LockstepError

# How a runner's step 1 is seen from inside (the certificate and `lockstep diagnose` read it).
CAPTURE_WHILE_TRAINING = "while training"  # recorded by the run itself
CAPTURE_AFTER_RUN = "after the run"  # a capture of its own after the run (several processes, a saved step)
CAPTURE_NONE = "none"  # it cannot show its step 1: its pairs get no certificate, the loss still compares

ALL_LAYOUTS = ("dp", "tp", "pp", "vpp", "sp", "zero", "ep")

# The one registration: a runner package listed here (lockstep/runners/<package>/) describes itself
# in its __init__.py as RUNNER (docs/contributing.md: adding a runner).
RUNNER_PACKAGES: tuple[str, ...] = (
    "pytorch",
    "pytorch_fast",
    "megatron",
    "megatron_fast",
    "megatron_te",
    "torchtitan",
    "infinitrain",
    "command",
)


@dataclass(frozen=True)
class NoOptions:
    """The options of a runner that takes none."""


@dataclass(frozen=True)
class Capabilities:
    step1_capture: str = CAPTURE_NONE
    devices: tuple[str, ...] = ("cpu", "cuda")
    # The parallel layouts it can run (a case using another is skipped by its skip_reason).
    parallel: tuple[str, ...] = ()
    # A package holding one module per model family it trains, each defining ADAPTER (None: it
    # needs no per-family code, e.g. it trains the family's reference module).
    family_adapters: str | None = None
    # family -> why it cannot train it (said as the cases' skip reason, and checked by family_gaps).
    unsupported_families: Mapping[str, str] = field(default_factory=dict)
    # lockstep's own reference: diagnose's structure, the FP64 evidence, the default baseline.
    reference: bool = False
    # The options field that takes a build directory: `lockstep bisect` hands it each commit's.
    build_option: str | None = None
    commit_file: str | None = None  # a file in that build dir naming the source commit


@dataclass(frozen=True)
class RunnerSpec:
    name: str  # the framework name users type, and `<out>/<name>/`
    runner: str  # "module:Class" of its FrameworkRunner, imported when used
    summary: str
    capabilities: Capabilities = field(default_factory=Capabilities)
    options_type: type = NoOptions
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    options_from: Callable[[argparse.Namespace], Any] | None = None  # default: options_type()
    # None when it can run here, else one sentence saying why not (e.g. what to install).
    available: Callable[[], str | None] = lambda: None
    # Whether `lockstep run` without --frameworks uses it: True, False, or a note saying why not.
    default: Callable[[Any], bool | str] = lambda options: False
    # The framework names it provides (the command runner: one per trainer its TOML names).
    frameworks: Callable[[Any], list[str]] | None = None
    # Make the runner for one of its frameworks (default: the class with the options as keywords).
    make: Callable[[str, Any], Any] | None = None
    # Options completed from what an earlier run recorded (meta of its record), for `diagnose RUN_DIR`.
    from_record: Callable[[Any, dict], Any] | None = None
    # The registered runner this one is a variant of (megatron-fast: megatron): it trains what that
    # one trains, so a family's word about that runner (unsupported_runners, its folder's adapter) holds for it.
    variant_of: str | None = None

    def names(self, options: Any = None) -> list[str]:
        return self.frameworks(self.options(options)) if self.frameworks else [self.name]

    def options(self, options: Any = None) -> Any:
        """Its options object: the defaults for None, built from the fields for a dict."""
        if options is None:
            return self.options_type()
        if isinstance(options, dict):
            return self.options_type(**options)
        return options

    def options_of(self, args: argparse.Namespace) -> Any:
        return self.options_from(args) if self.options_from else self.options_type()

    def runner_class(self):
        module_name, _, cls_name = self.runner.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("lockstep"):
                raise LockstepError(f"framework {self.name!r} is not available in this lockstep build") from None
            reason = self.available()
            raise LockstepError(reason or f"framework {self.name!r} needs the Python package {e.name!r}, "
                                          "which is not installed") from None
        return getattr(module, cls_name)

    def create(self, framework: str, options: Any = None):
        options = self.options(options)
        if self.make is not None:
            return self.make(framework, options)
        kwargs = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options or {})
        return self.runner_class()(**kwargs)

    def adapter(self, family: str):
        """Its per-family adapter (`<family_adapters>.<family>`'s ADAPTER), or a LockstepError saying
        why there is none."""
        caps = self.capabilities
        reason = unsupported_reason(self, family)
        if reason is not None:
            raise LockstepError(f"{self.name} cannot train model family {family!r}: {reason}")
        if caps.family_adapters is None:
            raise LockstepError(f"{self.name} has no per-family adapters")
        module = adapter_module(self, family)
        if module is None:
            raise LockstepError(f"{self.name} has no adapter for model family {family!r} (no module "
                                f"{' or '.join(adapter_modules(self, family))})")
        return importlib.import_module(module).ADAPTER


def adapter_modules(spec: RunnerSpec, family: str) -> list[str]:
    """Where a runner's adapter for the family may be: its own package's `<family>` module, or, for a
    family from outside lockstep, the module named after the runner in the family's folder."""
    from lockstep.models import FAMILY_MODULES

    out = [f"{spec.capabilities.family_adapters}.{family}"]
    if family in FAMILY_MODULES and not FAMILY_MODULES[family].startswith("lockstep."):
        out.append(f"{FAMILY_MODULES[family]}.{spec.variant_of or spec.name}")
    return out


def adapter_module(spec: RunnerSpec, family: str) -> str | None:
    return next((m for m in adapter_modules(spec, family) if module_exists(m)), None)


def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def load_specs(packages: Iterable[str]) -> dict[str, RunnerSpec]:
    """name -> spec of every registered package (`lockstep.runners.<package>`'s RUNNER)."""
    specs: dict[str, RunnerSpec] = {}
    for package in packages:
        spec = importlib.import_module(f"lockstep.runners.{package}").RUNNER
        if spec.name in specs:
            raise LockstepError(f"two runner packages register the framework name {spec.name!r}")
        specs[spec.name] = spec
    return MappingProxyType(specs)


def unsupported_reason(spec: RunnerSpec | str, family: str) -> str | None:
    """Why the runner (a spec, or a registered name) cannot train the family, as the runner or the
    family's folder declares it; None where neither does."""
    from lockstep.models import FAMILIES

    if isinstance(spec, str):
        spec = specs().get(spec)
        if spec is None:
            return None  # e.g. a command runner's trainer: its TOML says what it trains
    if family in spec.capabilities.unsupported_families:
        return str(spec.capabilities.unsupported_families[family])
    fam = FAMILIES.get(family)
    for name in (spec.name, spec.variant_of):
        if fam is not None and name in fam.unsupported_runners:
            return str(fam.unsupported_runners[name])
    return None


def family_gaps(families: Iterable[str], specs: Iterable[RunnerSpec]) -> list[str]:
    """One sentence per (family, runner) where the runner needs a per-family adapter, has none for
    the family, and neither it nor the family's folder says why it cannot train it; empty when
    every family is complete."""
    gaps = []
    for spec in specs:
        caps = spec.capabilities
        for family in families:
            reason = unsupported_reason(spec, family)
            if reason is not None:
                if not reason.strip():
                    gaps.append(f"{spec.name} declares model family {family!r} unsupported without a reason")
                continue
            if caps.family_adapters is None:
                continue
            module = adapter_module(spec, family)
            if module is None:
                gaps.append(f"{spec.name} has no adapter for model family {family!r}: add "
                            f"{' or '.join(adapter_modules(spec, family))} (defining ADAPTER), or say why not in "
                            "the family's unsupported_runners")
            elif not hasattr(importlib.import_module(module), "ADAPTER"):
                gaps.append(f"{module} defines no ADAPTER")
    return gaps


FrameworkOptions = Mapping[str, Any]  # a runner spec's name -> its options object


@functools.cache
def specs() -> Mapping[str, RunnerSpec]:
    """name -> RunnerSpec of every registered runner, in registration order."""
    return load_specs(RUNNER_PACKAGES)


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
    base = framework.partition("@")[0]
    if base != framework and base in all_specs and all_specs[base].frameworks is not None:
        return all_specs[base]  # a named build (`infinitrain@NAME`) its options do not hold yet (a run dir's)
    raise LockstepError(f"unknown framework {framework!r}; known: {', '.join(framework_names(framework_options))} "
                        "(a trainer of a --command-runner TOML file is known once the file is given)")


def framework_names(framework_options: FrameworkOptions | None = None) -> list[str]:
    """Every framework name a run could use with these options."""
    return [n for spec in specs().values() for n in spec.names(options_for(spec, framework_options))]


def get_runner(name: str, framework_options: FrameworkOptions | None = None, **kwargs):
    """The runner (a base.FrameworkRunner) of framework `name` made with its spec's options from
    `framework_options`, or with `kwargs` as the options' fields (`get_runner("infinitrain", build_dir=...)`)."""
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
        options = options_for(spec, framework_options)
        use = spec.default(options)
        if use is True:
            names += spec.names(options)
        elif isinstance(use, str) and notes is not None:
            notes.append(use)
    return names


def reference_framework() -> str:
    """lockstep's own reference trainer (diagnose's structure, the FP64 evidence)."""
    return next(name for name, spec in specs().items() if spec.capabilities.reference)


def built_frameworks() -> dict[str, RunnerSpec]:
    """The runners that run from a build directory (`lockstep bisect` builds each commit into one)."""
    return {name: spec for name, spec in specs().items() if spec.capabilities.build_option}
