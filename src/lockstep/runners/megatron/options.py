"""Whether megatron-core is here, found without importing it (that takes seconds, and prints
warnings): shared by the runner's registration (__init__.py) and runner.py."""

from __future__ import annotations

import importlib.util

INSTALL_HINT = "pip install 'lockstep[megatron]'"


def megatron_core_installed() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):
        return False
