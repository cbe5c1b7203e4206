"""Llama 3 on megatron-core: torch RMSNorm, SwiGLU, GQA, interleaved RoPE, no biases, untied output.

    LLMC                   Megatron parameter                                 TP split
    wte                    embedding.word_embeddings.weight  (first stage)    rows (vocab)
    ln1w[l]                decoder.layers.i.input_layernorm.weight            replicated
    qkvw[l]                decoder.layers.i.self_attention.linear_qkv.weight  rows, regrouped per query group
    attprojw[l]            decoder.layers.i.self_attention.linear_proj.weight columns
    ln2w[l]                decoder.layers.i.pre_mlp_layernorm.weight          replicated
    fcw2[l] ; fcw[l]       decoder.layers.i.mlp.linear_fc1.weight = [gate; up] each rank: [its gate rows; its up rows]
    fcprojw[l]             decoder.layers.i.mlp.linear_fc2.weight             columns
    lnfw                   decoder.final_layernorm.weight  (last stage)       replicated
    lm_head                output_layer.weight  (last stage)                  rows (vocab)

- `linear_qkv` rows are grouped per query group, `[q of the group's NH/kv heads, k, v]` for each
  kv group, while LLMC stores `[Q; K; V]` (docs/reference/formats.md#llama-3-magic-20240803-version-3);
  TP gives each rank whole groups.
- Megatron's gated linear unit applies the activation to the first half of fc1's output and
  multiplies by the second (`silu(x[0]) * x[1]`), so fc1 = [gate; up] (LLMC c_fc2 is the gate).
  Column-parallel TP splits fc1's output per rank, so each rank holds its slice of both halves.
- `rotary_interleaved=True`: Megatron then rotates dims (2i, 2i+1) as Meta's code, llm.c and
  InfiniTrain's llama3 do; the default (False) would pair i with i+hd/2 (Qwen3's pairing).
"""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F

from lockstep.runners.megatron.families.base import (ChunkShard, MegatronFamily, TensorMap, qkv_from_groups,
                                                     qkv_per_group)


class Llama3Adapter(MegatronFamily):
    family = "llama3"
    rotary_interleaved = True
    qk_layernorm = False

    def config_overrides(self, model) -> dict:
        return dict(normalization="RMSNorm", layernorm_epsilon=model.norm_eps, activation_func=F.silu,
                    gated_linear_unit=True, add_bias_linear=False, add_qkv_bias=False,
                    num_query_groups=model.num_kv_heads, rotary_interleaved=self.rotary_interleaved,
                    qk_layernorm=self.qk_layernorm, bias_activation_fusion=False)

    def layer_spec(self, model):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        return get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=self.qk_layernorm)

    def fused_activation_overrides(self, model) -> dict:
        # SwiGLU of fc1's [gate; up] without a bias: megatron-core's fused swiglu (MoE experts too).
        return dict(bias_activation_fusion=True)

    def gpt_model_kwargs(self, model) -> dict:
        theta = model.rope_theta
        return dict(share_embeddings_and_output_weights=False, position_embedding_type="rope", rotary_percent=1.0,
                    rotary_base=int(theta) if float(theta).is_integer() else theta, rope_scaling=False)

    def weight_maps(self, model, shard: ChunkShard) -> list[TensorMap]:
        grouped = partial(qkv_per_group, num_heads=model.num_heads, num_groups=model.num_kv_heads)
        ungrouped = partial(qkv_from_groups, num_heads=model.num_heads, num_groups=model.num_kv_heads)
        maps = []
        if shard.pre_process:
            maps.append(TensorMap("embedding.word_embeddings.weight", "wte", "rows"))
        for local, layer in enumerate(shard.layers):
            p, at = f"decoder.layers.{local}.", f"[{layer}]"
            maps += [TensorMap(p + "input_layernorm.weight", "ln1w" + at)]
            maps += self.attention_maps(p, at)
            maps += [
                TensorMap(p + "self_attention.linear_qkv.weight", "qkvw" + at, "rows", grouped, ungrouped),
                TensorMap(p + "self_attention.linear_proj.weight", "attprojw" + at, "columns"),
                TensorMap(p + "pre_mlp_layernorm.weight", "ln2w" + at),
            ]
            maps += self.mlp_maps(p, layer, model, shard)
        if shard.post_process:
            maps += [TensorMap("decoder.final_layernorm.weight", "lnfw"),
                     TensorMap("output_layer.weight", "lm_head", "rows")]
        return maps

    def mlp_maps(self, prefix: str, layer: int, model, shard: ChunkShard) -> list[TensorMap]:
        at = f"[{layer}]"
        # fc1 holds two canonical tensors: [gate; up]; the "glu" split keeps them apart per rank.
        return [TensorMap(prefix + "mlp.linear_fc1.weight", ("fcw2" + at, "fcw" + at), "glu_rows"),
                TensorMap(prefix + "mlp.linear_fc2.weight", "fcprojw" + at, "columns")]

    def attention_maps(self, prefix: str, at: str) -> list[TensorMap]:
        """Per-layer attention parameters besides qkv and proj (Qwen3's QK-norm)."""
        return []


ADAPTER = Llama3Adapter()
