"""A test-only hook into torchrun workers: `LOCKSTEP_TEST_PLUGINS=module:function[,module:function]`.

The suite's negative controls inject a known defect (a frozen parameter group, a shifted data
order, a broken tie, ...) and assert that a comparison catches it. A defect in a worker process
must be injected inside that process, so every worker entry point calls `apply_test_plugins()`
first; each named function is imported and called once, and may patch what it likes in that
process. Unset (always, outside the tests), this does nothing.
"""

from __future__ import annotations

import importlib
import os

ENV_VAR = "LOCKSTEP_TEST_PLUGINS"


def apply_test_plugins() -> list[str]:
    """Call every `module:function` named in LOCKSTEP_TEST_PLUGINS; returns what it called."""
    called = []
    for spec in filter(None, (s.strip() for s in os.environ.get(ENV_VAR, "").split(","))):
        module, _, attr = spec.partition(":")
        getattr(importlib.import_module(module), attr or "apply")()
        called.append(spec)
    return called
