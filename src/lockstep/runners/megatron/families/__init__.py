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
from lockstep.runners.megatron.families.gpt2 import GPT2Adapter
from lockstep.runners.megatron.families.llama3 import Llama3Adapter
from lockstep.runners.megatron.families.mixtral import MixtralAdapter
from lockstep.runners.megatron.families.qwen3 import Qwen3Adapter

ADAPTERS: dict[str, MegatronFamily] = {a.family: a for a in (GPT2Adapter(), Llama3Adapter(), Qwen3Adapter(),
                                                              MixtralAdapter())}


def adapter_for(config) -> MegatronFamily:
    try:
        return ADAPTERS[config.family]
    except KeyError:
        raise LockstepError(f"the megatron runner has no adapter for model family {config.family!r}") from None
