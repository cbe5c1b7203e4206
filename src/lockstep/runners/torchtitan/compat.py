"""What lockstep does before torchtitan is imported, so that its Trainer runs in a CPU-only
process and without its optional logging packages. torchtitan itself is not changed.

- The device: torchtitan picks its device type once, when `torchtitan.tools.utils` is imported
  (`torch._utils._get_available_device_type() or "cuda"`), and every module imports that name
  (`device_type`, `device_module`) from there. Without an accelerator it falls back to "cuda",
  and `torch.cuda.set_device` fails at the Trainer's first line. `prepare(device="cpu")` imports
  `torchtitan.tools.utils` while torch answers "cpu", with a device module that has what
  torchtitan calls of one (`CpuDeviceModule`: torch.cpu plus the memory and name queries it lacks,
  answered as torch answers them for a CPU: nothing counted). torch itself is left as it was.
- Optional packages imported at module level: `torchtitan.components.metrics` imports
  `torch.utils.tensorboard` (the `tensorboard` package) and the Trainer's validator imports
  torchtitan's Hugging Face dataset loaders (the `datasets` package), even when neither
  TensorBoard logging nor an HF dataset is asked for (lockstep asks for neither: it hands the
  Trainer its own data loader). Where a package is missing, a stand-in module is registered whose
  every use says which package to install; an installed one is used as it is.
"""

from __future__ import annotations

import platform
import sys
import types
from collections import namedtuple

import torch

Properties = namedtuple("Properties", "total_memory name")


class CpuDeviceModule:
    """torch.cpu with the queries torchtitan makes of a device module (names, memory stats)."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    @staticmethod
    def set_device(device) -> None:  # one CPU device: nothing to select
        pass

    @staticmethod
    def current_device() -> int:  # an index, as CUDA's (torch.cpu answers "cpu"; barrier(device_ids=) needs ints)
        return 0

    @staticmethod
    def get_device_name(device=None) -> str:
        return platform.processor() or platform.machine() or "cpu"

    @staticmethod
    def get_device_properties(device=None):
        return Properties(total_memory=1, name="cpu")  # torchtitan divides by it; no capacity is reported

    @staticmethod
    def memory_stats(device=None) -> dict:
        return {}  # torch's allocator counts nothing on a CPU (torchtitan reports -1 for each figure)

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass


def prepare(device: str) -> None:
    """Make torchtitan importable and runnable in this process for `device` ("cpu" | "cuda");
    call before anything imports torchtitan (afterwards its device choice is already made)."""
    _stand_ins()
    _set_timeout()
    _mesh_dims()
    if device != "cpu" or "torchtitan.tools.utils" in sys.modules:
        return
    import torch._utils as tu

    saved = tu._get_available_device_type, tu._get_device_module
    tu._get_available_device_type = lambda: "cpu"
    tu._get_device_module = lambda device_type=None: CpuDeviceModule() if device_type in (None, "cpu") else saved[1](device_type)
    try:
        import torchtitan.tools.utils  # noqa: F401  (fixes device_type = "cpu" for every torchtitan module)
    finally:
        tu._get_available_device_type, tu._get_device_module = saved


def _mesh_dims() -> None:
    """torchtitan 0.3.0 imports `torch.distributed.fsdp.DataParallelMeshDims` (torch 2.12 on) at
    import time; it is used only on its full-DTensor SPMD paths, which lockstep does not take
    (`partial_dtensor`). On an older torch a class that refuses to be made stands in for it."""
    import torch
    import torch.distributed.fsdp as fsdp

    if hasattr(fsdp, "DataParallelMeshDims"):
        return

    class DataParallelMeshDims:
        def __init__(self, *args, **kwargs):
            raise RuntimeError(f"torchtitan's full-DTensor SPMD path needs a torch newer than {torch.__version__}")

    fsdp.DataParallelMeshDims = DataParallelMeshDims


def _set_timeout() -> None:
    """torchtitan shortens its process groups' timeouts after step 1 with
    `torch.distributed.set_timeout`, which not every torch build has (this machine's 2.13 CPU
    wheel has only the private `_set_pg_timeout`): the same call under the public name."""
    import torch.distributed as dist

    if hasattr(dist, "set_timeout") or not dist.is_available():
        return
    from torch.distributed.distributed_c10d import _set_pg_timeout

    dist.set_timeout = _set_pg_timeout


def _missing(package: str):
    def use(*args, **kwargs):
        raise RuntimeError(f"this torchtitan feature needs the {package} package, which is not installed")
    return use


# module -> (the package it needs, the names torchtitan imports from it)
STAND_INS = {
    "torch.utils.tensorboard": ("tensorboard", ("SummaryWriter",)),
    "datasets": ("datasets", ("Dataset", "load_dataset")),
    "datasets.distributed": ("datasets", ("split_dataset_by_node",)),
}


def _stand_ins() -> None:
    import importlib.util

    missing = {package for package, _ in STAND_INS.values()
               if package not in sys.modules and importlib.util.find_spec(package) is None}
    for name, (package, names) in STAND_INS.items():
        if package not in missing or name in sys.modules:
            continue
        module = types.ModuleType(name)
        for attr in names:
            setattr(module, attr, _missing(package))
        sys.modules[name] = module
