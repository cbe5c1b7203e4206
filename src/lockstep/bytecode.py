"""Compiled bytecode for lockstep's processes where the environment forbids writing it.

Container images often set PYTHONDONTWRITEBYTECODE=1 and ship packages without .pyc files: then every
Python process compiles what it imports from source, torch alone 3 s on the lent H100 machine (its
`import torch` took 3.1-3.4 s in each of lockstep's processes: the CLI, each launcher and worker it starts).
Where that variable is set and the user has not chosen PYTHONPYCACHEPREFIX, lockstep keeps the bytecode
in its own cache instead (`<cache>/pycache`, cache = $LOCKSTEP_CACHE or ~/.cache/lockstep): nothing is
written beside the packages' sources, which is what the variable protects, and the second run reads what
the first compiled. The processes lockstep starts inherit the same (their environment names the prefix and
no longer forbids writing). LOCKSTEP_PYCACHE=off leaves the environment as it is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

OFF_ENV = "LOCKSTEP_PYCACHE"


def own_bytecode_cache(environ=os.environ) -> Path | None:
    """Point this process's bytecode at lockstep's cache, and its children's through `environ`, when
    PYTHONDONTWRITEBYTECODE forbids the usual place and no prefix was chosen. The directory, or None
    when nothing was changed."""
    if not environ.get("PYTHONDONTWRITEBYTECODE") or environ.get("PYTHONPYCACHEPREFIX"):
        return None
    if environ.get(OFF_ENV, "").strip().lower() in {"0", "off", "no", "false"}:
        return None
    from lockstep.data.corpus import default_cache_dir

    prefix = default_cache_dir() / "pycache"
    try:
        prefix.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # a cache that cannot be made only costs the compile time it would have saved
    sys.pycache_prefix = str(prefix)
    sys.dont_write_bytecode = False
    environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    del environ["PYTHONDONTWRITEBYTECODE"]
    return prefix
