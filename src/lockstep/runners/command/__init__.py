"""The `command` framework: any trainer, joined by a TOML entry and no Python (trainer.py, runner.py).

`--command-runner FILE` (repeatable) names TOML files whose `[frameworks.NAME]` tables each add
a framework NAME, used like any other: `--frameworks pytorch,NAME`. docs/reference/command-runner.md.

This file registers it (`RUNNER`) and stays cheap to import: the runner class is imported when used.
"""

from dataclasses import dataclass

from lockstep.runners.registry import CAPTURE_NONE, ALL_LAYOUTS, Capabilities, RunnerSpec


@dataclass(frozen=True)
class CommandOptions:
    files: tuple[str, ...] = ()  # the --command-runner TOML files
    trainers: tuple = ()  # their TrainerSpecs, in file order
    # What a template's {build} names (--command-build; `lockstep bisect` sets each commit's build
    # directory here); None: the TOML file's directory.
    build_dir: str | None = None


def command_options(files, build_dir: str | None = None) -> CommandOptions:
    """The trainers of the TOML files (FormatError naming a bad file or a name given twice)."""
    from lockstep.errors import LockstepError
    from lockstep.runners.registry import specs
    from lockstep.runners.command.trainer import load_trainers

    trainers, seen = [], {}
    for f in files or ():
        for t in load_trainers(f):
            if t.name in specs():
                raise LockstepError(f"{f}: [frameworks.{t.name}] takes the name of a registered framework; "
                                    "name the trainer otherwise")
            if t.name in seen:
                raise LockstepError(f"{f}: framework {t.name!r} is also named in {seen[t.name]}")
            seen[t.name] = f
            trainers.append(t)
    return CommandOptions(files=tuple(str(f) for f in files or ()), trainers=tuple(trainers), build_dir=build_dir)


def _add_arguments(parser) -> None:
    parser.add_argument("--command-runner", action="append", metavar="TOML", default=None,
                        help="a TOML file whose [frameworks.NAME] tables add trainers run as commands "
                             "(then --frameworks pytorch,NAME); repeatable (docs/reference/command-runner.md)")
    parser.add_argument("--command-build", metavar="DIR", default=None,
                        help="the directory a command runner template's {build} names (default: the TOML file's "
                             "directory; lockstep bisect sets each commit's build directory)")


def _options_from(args) -> CommandOptions:
    return command_options(getattr(args, "command_runner", None), getattr(args, "command_build", None))


def _frameworks(options: CommandOptions) -> list[str]:
    return [t.name for t in options.trainers]


def _make(framework: str, options: CommandOptions):
    from lockstep.errors import LockstepError
    from lockstep.runners.command.runner import CommandRunner

    for t in options.trainers:
        if t.name == framework:
            return CommandRunner(t, build_dir=options.build_dir)
    raise LockstepError(f"no --command-runner file names a trainer {framework!r}")


RUNNER = RunnerSpec(
    name="command",
    runner="lockstep.runners.command.runner:CommandRunner",
    summary="any trainer as a command line from a TOML entry, its log read by lockstep's parsers",
    # What each trainer runs (families, devices, layouts) its TOML entry says; the runner itself has no limits.
    capabilities=Capabilities(step1_capture=CAPTURE_NONE, parallel=ALL_LAYOUTS, build_option="build_dir"),
    options_type=CommandOptions,
    add_arguments=_add_arguments,
    options_from=_options_from,
    frameworks=_frameworks,
    make=_make,
)
