"""Whether torchtitan is here, and how to get it (read by the registration and the runner; no imports)."""

import importlib.util

INSTALL_HINT = "pip install -e '.[torchtitan]'"


def torchtitan_installed() -> bool:
    return importlib.util.find_spec("torchtitan") is not None and importlib.util.find_spec("torchdata") is not None
