"""Worker plugins (LOCKSTEP_TEST_PLUGINS) that break megatron-core's forked checkpoint writer the way
a bare install does: psutil missing (the writer reads its memory through it first thing), or the
writer process dying before it reports."""

from __future__ import annotations

import os


def no_psutil() -> None:
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    filesystem_async.HAVE_PSUTIL = False


def writer_dies() -> None:
    """The forked writer's first call (its memory reading) ends it with status 3, reporting nothing."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    filesystem_async._process_memory = lambda: os._exit(3)
