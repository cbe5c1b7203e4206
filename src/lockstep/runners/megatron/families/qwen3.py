"""Qwen3 on megatron-core: Llama 3's mapping plus QK-norm, with half-split RoPE.

    qknormw[l][0]   decoder.layers.i.self_attention.q_layernorm.weight   replicated
    qknormw[l][1]   decoder.layers.i.self_attention.k_layernorm.weight   replicated

- `qk_layernorm=True` puts a torch RMSNorm over head_dim on q and on k after the qkv split and
  before RoPE, as Qwen3 does. `rotary_interleaved=False` pairs dims i and i + hd/2 (HF's
  `rotate_half`). Everything else is Llama 3's mapping (llama3.py).
"""

from __future__ import annotations

from lockstep.runners.megatron.families.base import TensorMap
from lockstep.runners.megatron.families.llama3 import Llama3Adapter


class Qwen3Adapter(Llama3Adapter):
    family = "qwen3"
    rotary_interleaved = False
    qk_layernorm = True

    def attention_maps(self, prefix: str, at: str) -> list[TensorMap]:
        return [TensorMap(prefix + "self_attention.q_layernorm.weight", f"qknormw{at}[0]"),
                TensorMap(prefix + "self_attention.k_layernorm.weight", f"qknormw{at}[1]")]


ADAPTER = Qwen3Adapter()
