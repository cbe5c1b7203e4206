"""What the `infinitrain` runner is given: its build directory (shared by its registration in
__init__.py and runner.py, neither importing the other)."""

from __future__ import annotations

from dataclasses import dataclass

BUILD_ENV_VAR = "LOCKSTEP_INFINITRAIN_BUILD"
# A file a build script may leave next to the executables naming the source commit, for builds
# made from a copy of the source without its .git (e.g. the CUDA build on a GPU host).
COMMIT_FILE = "INFINITRAIN_COMMIT"


@dataclass(frozen=True)
class InfiniTrainOptions:
    build_dir: str | None = None  # None: LOCKSTEP_INFINITRAIN_BUILD
# The flags of a build with an lr schedule (feat/lr_scheduler's example mains); a case with a
# schedule is skipped on a build without them.
LR_SCHEDULE_FLAGS = ("lr_decay_style", "lr_warmup_iters", "lr_warmup_init", "lr_decay_iters", "min_lr")
# Significant digits of the lr InfiniTrain's step line prints ("lr %.2e"): the comparison checks
# its lr to these.
LOGGED_LR_DIGITS = 3
# The activation-recompute flags (feat/activation_checkpointing's example mains).
RECOMPUTE_FLAGS = ("activation_recompute", "recompute_granularity", "recompute_method", "recompute_num_layers")
