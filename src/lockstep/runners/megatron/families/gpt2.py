"""GPT-2 on megatron-core: LayerNorm, tanh GELU, biases, learned positions, tied output.

    LLMC                 Megatron parameter                                TP split
    wte[:Vm]             embedding.word_embeddings.weight  (first stage)   rows (vocab)
    wte[:Vm]             output_layer.weight  (last stage, only if PP>1)   rows (vocab)
    wpe                  embedding.position_embeddings.weight              replicated
    ln1w/ln1b[l]         decoder.layers.i.input_layernorm.weight/bias      replicated
    qkvw/qkvb[l]         decoder.layers.i.self_attention.linear_qkv.*      rows, after regrouping per head
    attprojw[l]          decoder.layers.i.self_attention.linear_proj.weight columns (row-parallel)
    attprojb[l]          decoder.layers.i.self_attention.linear_proj.bias   replicated
    ln2w/ln2b[l]         decoder.layers.i.pre_mlp_layernorm.weight/bias    replicated
    fcw/fcb[l]           decoder.layers.i.mlp.linear_fc1.weight/bias       rows (column-parallel)
    fcprojw[l]           decoder.layers.i.mlp.linear_fc2.weight            columns (row-parallel)
    fcprojb[l]           decoder.layers.i.mlp.linear_fc2.bias              replicated
    lnfw/lnfb            decoder.final_layernorm.weight/bias  (last stage) replicated

- `linear_qkv` rows are grouped per head, `[h0: q,k,v; h1: q,k,v; ...]`, while LLMC stores
  `[Q of all heads; K; V]`. Column-parallel TP then gives rank r the contiguous heads
  r*NH/TP .. (r+1)*NH/TP-1, whose attention outputs meet exactly the columns r*C/TP.. of the
  row-parallel `linear_proj`. Row-parallel layers add their bias once after the all-reduce, so
  that bias is whole on every TP rank; column-parallel biases are split with their rows.
- Tied embeddings: with PP=1 the output layer reads the embedding; with PP>1 the last stage
  keeps a copy, `output_layer.weight`, which Megatron keeps equal by all-reducing the two
  gradients. We load wte into both, so the copy equals wte from step 1.
- Megatron's vocab Vm is V at TP=1 (no logit needs masking) and LLMC's padded Vp with TP>1
  (50304 = 2^7 * 393, divisible by every usual TP), or Vp rounded up to a multiple of TP;
  logits V.. are masked to -inf in the loss.
"""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F

from lockstep.runners.megatron.families.base import (ChunkShard, MegatronFamily, TensorMap, fit_rows, qkv_from_groups,
                                                     qkv_per_group)


def gelu_tanh(x):
    """GPT-2's GELU (tanh approximation), the same op the reference trainer calls."""
    return F.gelu(x, approximate="tanh")


class GPT2Adapter(MegatronFamily):
    family = "gpt2"

    def config_overrides(self, model) -> dict:
        return dict(normalization="LayerNorm", layernorm_epsilon=1e-5, activation_func=gelu_tanh, add_bias_linear=True,
                    bias_activation_fusion=False)

    def layer_spec(self, model):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        return get_gpt_layer_local_spec()

    def fused_activation_overrides(self, model) -> dict:
        # megatron-core fuses bias+GELU only for activation_func F.gelu, and its fused bias_gelu is
        # the tanh approximation (x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 x^2))), with a
        # hand-written backward): GPT-2's GELU, although the unfused F.gelu would be the erf form.
        return dict(activation_func=F.gelu, bias_activation_fusion=True)

    def gpt_model_kwargs(self, model) -> dict:
        return dict(share_embeddings_and_output_weights=True, position_embedding_type="learned_absolute")

    def vocab_rows(self, model, tp: int) -> int:
        if tp == 1:
            return model.vocab_size
        return -(-model.padded_vocab_size // tp) * tp

    def weight_maps(self, model, shard: ChunkShard) -> list[TensorMap]:
        to_vocab = partial(fit_rows, rows=shard.vocab_rows)
        from_vocab = partial(fit_rows, rows=model.padded_vocab_size)
        per_head = partial(qkv_per_group, num_heads=model.num_heads, num_groups=model.num_heads)
        from_heads = partial(qkv_from_groups, num_heads=model.num_heads, num_groups=model.num_heads)
        maps = []
        if shard.pre_process:
            maps += [TensorMap("embedding.word_embeddings.weight", "wte", "rows", to_vocab, from_vocab),
                     TensorMap("embedding.position_embeddings.weight", "wpe")]
        if shard.post_process and not shard.pre_process:
            maps.append(TensorMap("output_layer.weight", "wte", "rows", to_vocab, from_vocab, copy=True))
        for local, layer in enumerate(shard.layers):
            p, at = f"decoder.layers.{local}.", f"[{layer}]"
            maps += [
                TensorMap(p + "input_layernorm.weight", "ln1w" + at),
                TensorMap(p + "input_layernorm.bias", "ln1b" + at),
                TensorMap(p + "self_attention.linear_qkv.weight", "qkvw" + at, "rows", per_head, from_heads),
                TensorMap(p + "self_attention.linear_qkv.bias", "qkvb" + at, "rows", per_head, from_heads),
                TensorMap(p + "self_attention.linear_proj.weight", "attprojw" + at, "columns"),
                TensorMap(p + "self_attention.linear_proj.bias", "attprojb" + at),
                TensorMap(p + "pre_mlp_layernorm.weight", "ln2w" + at),
                TensorMap(p + "pre_mlp_layernorm.bias", "ln2b" + at),
                TensorMap(p + "mlp.linear_fc1.weight", "fcw" + at, "rows"),
                TensorMap(p + "mlp.linear_fc1.bias", "fcb" + at, "rows"),
                TensorMap(p + "mlp.linear_fc2.weight", "fcprojw" + at, "columns"),
                TensorMap(p + "mlp.linear_fc2.bias", "fcprojb" + at),
            ]
        if shard.post_process:
            maps += [TensorMap("decoder.final_layernorm.weight", "lnfw"),
                     TensorMap("decoder.final_layernorm.bias", "lnfb")]
        return maps


ADAPTER = GPT2Adapter()
