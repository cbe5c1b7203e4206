"""A worker plugin (LOCKSTEP_TEST_PLUGINS) that says, in the rank's log, each time megatron-core
replays a checkpointed forward in the backward: evidence that a recompute case did recompute
(a bitwise-equal twin alone would also pass if the flags were ignored)."""

from __future__ import annotations

MARKER = "lockstep-test: recompute replayed a forward"


def count_replays() -> None:
    from megatron.core.tensor_parallel import random as mpu_random

    backward = mpu_random.CheckpointFunction.backward

    def replaying_backward(ctx, *args):
        print(MARKER, flush=True)
        return backward(ctx, *args)

    mpu_random.CheckpointFunction.backward = staticmethod(replaying_backward)
