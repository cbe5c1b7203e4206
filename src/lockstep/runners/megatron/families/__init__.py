"""megatron-core per model family: what differs between families, and nothing else.

An adapter says how a family's math maps onto megatron-core's switches (TransformerConfig
fields, the local layer spec, GPTModel arguments) and how its LLMC tensors map onto the
parameters of a GPTModel chunk, both ways (`weight_maps`, read by weights.py to load a chunk
and to turn Megatron's parameters or gradients back into canonical LLMC tensors). The rest
of the megatron runner never names a family.
"""

from __future__ import annotations

from lockstep.errors import LockstepError
from lockstep.runners.megatron.families.base import MegatronFamily

# No table of adapters: each family's is `families/<family>.py`'s ADAPTER (or, for a family from
# outside lockstep, its folder's `megatron.py`), found by the runner registry.


def adapter_of(family: str) -> MegatronFamily:
    from lockstep.runners.registry import specs

    try:
        return specs()["megatron"].adapter(family)
    except LockstepError:
        raise LockstepError(f"the megatron runner has no adapter for model family {family!r}") from None


def adapter_for(config) -> MegatronFamily:
    return adapter_of(config.family)
