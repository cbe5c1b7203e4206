"""Framework runners, one module each, all behind `base.FrameworkRunner`.

The table maps a framework name to "module:Class"; modules are imported only when used, so
that `lockstep run --frameworks pytorch` works without megatron-core installed.
"""

from __future__ import annotations

import importlib

from lockstep.errors import LockstepError
from lockstep.runners.base import FrameworkRunner

RUNNERS: dict[str, str] = {
    "pytorch": "lockstep.runners.pytorch:PyTorchRunner",
    "pytorch-fast": "lockstep.runners.pytorch_fast:PyTorchFastRunner",
    "megatron": "lockstep.runners.megatron:MegatronRunner",
    "infinitrain": "lockstep.runners.infinitrain:InfiniTrainRunner",
}


def get_runner(name: str, **options) -> FrameworkRunner:
    if name not in RUNNERS:
        raise LockstepError(f"unknown framework {name!r}; known: {', '.join(RUNNERS)}")
    module_name, cls_name = RUNNERS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("lockstep"):
            raise LockstepError(f"framework {name!r} is not available in this lockstep build") from None
        hint = " (pip install 'lockstep[megatron]')" if name == "megatron" else ""
        raise LockstepError(f"framework {name!r} needs the Python package {e.name!r}, which is not installed{hint}") from None
    return getattr(module, cls_name)(**options)
