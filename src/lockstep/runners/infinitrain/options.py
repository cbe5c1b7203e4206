"""What the `infinitrain` runner is given: its build directory (shared by its registration in
__init__.py and runner.py, neither importing the other)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from lockstep.errors import LockstepError

BUILD_ENV_VAR = "LOCKSTEP_INFINITRAIN_BUILD"
# A file a build script may leave next to the executables naming the source commit, for builds
# made from a copy of the source without its .git (e.g. the CUDA build on a GPU host).
COMMIT_FILE = "INFINITRAIN_COMMIT"


# `--infinitrain-build NAME=DIR`: one framework per named build, `infinitrain@NAME` (two builds of
# one framework judged against each other, `--expect identical`); a bare DIR stays `infinitrain`.
NAMED_SEPARATOR = "@"
BUILD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class InfiniTrainOptions:
    build_dir: str | None = None  # None: LOCKSTEP_INFINITRAIN_BUILD
    builds: tuple[tuple[str, str], ...] = ()  # (NAME, DIR) of each named build

    def frameworks(self) -> list[str]:
        """`infinitrain` (the bare build, or none named) and `infinitrain@NAME` for each named build."""
        named = [f"infinitrain{NAMED_SEPARATOR}{name}" for name, _ in self.builds]
        return (["infinitrain"] if self.build_dir or not named else []) + named

    def build_of(self, framework: str) -> str | None:
        """The build directory of one of its frameworks."""
        _, _, name = framework.partition(NAMED_SEPARATOR)
        return dict(self.builds)[name] if name else self.build_dir


def parse_builds(values: list[str] | None) -> InfiniTrainOptions:
    """`--infinitrain-build` values (DIR, or NAME=DIR, repeatable) as options; LockstepError on a
    second bare DIR or a name given twice."""
    bare: list[str] = []
    named: dict[str, str] = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if sep and BUILD_NAME.fullmatch(name) and not os.path.exists(value):
            if name in named:
                raise LockstepError(f"--infinitrain-build names the build {name!r} twice")
            named[name] = path
        else:
            bare.append(value)
    if len(bare) > 1:
        raise LockstepError(f"--infinitrain-build is given {len(bare)} unnamed builds ({', '.join(bare)}): name "
                            "each one NAME=DIR to run several builds (frameworks infinitrain@NAME)")
    return InfiniTrainOptions(build_dir=bare[0] if bare else None, builds=tuple(named.items()))
# The flags of a build with an lr schedule (feat/lr_scheduler's example mains); a case with a
# schedule is skipped on a build without them.
LR_SCHEDULE_FLAGS = ("lr_decay_style", "lr_warmup_iters", "lr_warmup_init", "lr_decay_iters", "min_lr")
# Significant digits of the lr InfiniTrain's step line prints ("lr %.2e"): the comparison checks
# its lr to these.
LOGGED_LR_DIGITS = 3
# The activation-recompute flags (feat/activation_checkpointing's example mains).
RECOMPUTE_FLAGS = ("activation_recompute", "recompute_granularity", "recompute_method", "recompute_num_layers")
