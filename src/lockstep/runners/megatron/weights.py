"""LLMC GPT-2 tensors -> the parameters of one megatron-core GPTModel chunk on one rank.

The mapping (local, non-Transformer-Engine layer spec; names as megatron-core 0.16-0.19 use):

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

Megatron quirks this follows:
- `linear_qkv` rows are grouped per head, `[h0: q,k,v; h1: q,k,v; ...]`, while LLMC stores
  `[Q of all heads; K; V]`: `view(3, NH, hd, C).permute(1, 0, 2, 3)` (SPEC section 2). Column-
  parallel TP then gives rank r the contiguous heads r*NH/TP .. (r+1)*NH/TP-1, whose attention
  outputs meet exactly the columns r*C/TP.. of the row-parallel `linear_proj`.
- Row-parallel layers add their bias once after the all-reduce, so the bias is whole on every
  TP rank; column-parallel biases are split with their rows.
- Tied embeddings: with PP=1 the output layer has no weight of its own (it reads the embedding);
  with PP>1 the last stage keeps a copy, `output_layer.weight`, that Megatron all-reduces from
  the first stage when the model is built and keeps equal by all-reducing the two gradients.
  We load wte into both, so the copy equals wte from step 1 whatever the build left in it.
- Megatron's vocab Vm is V at TP=1 and the padded Vp with TP>1 (`job.megatron_vocab_size`);
  rows past the checkpoint's Vp (only when TP does not divide Vp) are zeros.

`megatron_chunk_tensors` is numpy only (tested without megatron-core); `load_chunk` validates
every name and shape and names the tensor and rank that disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lockstep.errors import LockstepError
from lockstep.models.configs import GPT2Config


@dataclass(frozen=True)
class ChunkShard:
    """Which part of the model one Megatron model chunk on one rank holds."""

    rank: int  # global rank, for messages
    tp_rank: int
    tp_size: int
    pre_process: bool  # holds the embeddings (first pipeline stage / first virtual chunk)
    post_process: bool  # holds the final LayerNorm and the output layer
    layers: tuple[int, ...]  # the global 0-based layer of each local layer, in local order
    vocab_rows: int  # Megatron's vocabulary over all TP ranks (Vm)

    @property
    def holds_output_copy(self) -> bool:
        """A last chunk without the embedding keeps its own copy of the tied output weight (PP > 1)."""
        return self.post_process and not self.pre_process


@dataclass(frozen=True)
class MappedTensor:
    value: np.ndarray
    source: str  # where it came from, e.g. "LLMC qkvw[layer 1], regrouped per head, TP rows 2/2"


def _tp_split(arr: np.ndarray, axis: int, shard: ChunkShard, what: str) -> tuple[np.ndarray, str]:
    if shard.tp_size == 1:
        return arr, ""
    n = arr.shape[axis]
    if n % shard.tp_size:
        raise LockstepError(f"rank {shard.rank}: {what} has {n} {'rows' if axis == 0 else 'columns'}, "
                            f"which TP={shard.tp_size} cannot split evenly")
    size = n // shard.tp_size
    index = [slice(None)] * arr.ndim
    index[axis] = slice(shard.tp_rank * size, (shard.tp_rank + 1) * size)
    kind = "rows" if axis == 0 else "columns"
    return arr[tuple(index)], f", TP {kind} {shard.tp_rank + 1}/{shard.tp_size}"


def qkv_rows_per_head(qkv: np.ndarray, num_heads: int) -> np.ndarray:
    """LLMC `[Q; K; V]` rows (3C, ...) -> Megatron's per-head `[q0 k0 v0; q1 k1 v1; ...]` rows."""
    three_c = qkv.shape[0]
    head_dim = three_c // (3 * num_heads)
    rest = qkv.shape[1:]
    grouped = qkv.reshape(3, num_heads, head_dim, *rest)
    order = (1, 0, 2, *range(3, grouped.ndim))
    return np.ascontiguousarray(grouped.transpose(order)).reshape(three_c, *rest)


def vocab_rows(wte: np.ndarray, rows: int) -> np.ndarray:
    """wte's first `rows` rows, zero-padded when Megatron's vocab is larger than the file's Vp."""
    if rows <= wte.shape[0]:
        return wte[:rows]
    out = np.zeros((rows, wte.shape[1]), dtype=np.float32)
    out[: wte.shape[0]] = wte
    return out


def megatron_chunk_tensors(tensors: dict[str, np.ndarray], ckpt_config: GPT2Config,
                           shard: ChunkShard) -> dict[str, MappedTensor]:
    """The values (LLMC layout -> Megatron layout, TP-sharded) of every parameter of the chunk."""
    out: dict[str, MappedTensor] = {}

    def put(name: str, value: np.ndarray, source: str) -> None:
        out[name] = MappedTensor(value, source)

    if shard.pre_process or shard.holds_output_copy:
        wte = vocab_rows(tensors["wte"], shard.vocab_rows)
        wte_shard, how = _tp_split(wte, 0, shard, "wte")
        source = f"LLMC wte rows 0..{shard.vocab_rows - 1}{how}"
        if shard.pre_process:
            put("embedding.word_embeddings.weight", wte_shard, source)
        if shard.holds_output_copy:
            put("output_layer.weight", wte_shard, source + " (tied output weight of the last stage)")
    if shard.pre_process:
        put("embedding.position_embeddings.weight", tensors["wpe"], "LLMC wpe")

    num_layers = tensors["qkvw"].shape[0]
    for local, layer in enumerate(shard.layers):
        prefix = f"decoder.layers.{local}."
        if layer >= num_layers:
            raise LockstepError(f"rank {shard.rank}: {prefix.rstrip('.')} is layer {layer}, "
                                f"but the checkpoint has only {num_layers} layer(s)")
        at = f"[layer {layer}]"
        put(prefix + "input_layernorm.weight", tensors["ln1w"][layer], f"LLMC ln1w{at}")
        put(prefix + "input_layernorm.bias", tensors["ln1b"][layer], f"LLMC ln1b{at}")
        qkvw, how = _tp_split(qkv_rows_per_head(tensors["qkvw"][layer], ckpt_config.num_heads), 0, shard, f"qkvw{at}")
        put(prefix + "self_attention.linear_qkv.weight", qkvw, f"LLMC qkvw{at}, regrouped per head{how}")
        qkvb, how = _tp_split(qkv_rows_per_head(tensors["qkvb"][layer], ckpt_config.num_heads), 0, shard, f"qkvb{at}")
        put(prefix + "self_attention.linear_qkv.bias", qkvb, f"LLMC qkvb{at}, regrouped per head{how}")
        projw, how = _tp_split(tensors["attprojw"][layer], 1, shard, f"attprojw{at}")
        put(prefix + "self_attention.linear_proj.weight", projw, f"LLMC attprojw{at}{how}")
        put(prefix + "self_attention.linear_proj.bias", tensors["attprojb"][layer], f"LLMC attprojb{at}")
        put(prefix + "pre_mlp_layernorm.weight", tensors["ln2w"][layer], f"LLMC ln2w{at}")
        put(prefix + "pre_mlp_layernorm.bias", tensors["ln2b"][layer], f"LLMC ln2b{at}")
        fcw, how = _tp_split(tensors["fcw"][layer], 0, shard, f"fcw{at}")
        put(prefix + "mlp.linear_fc1.weight", fcw, f"LLMC fcw{at}{how}")
        fcb, how = _tp_split(tensors["fcb"][layer], 0, shard, f"fcb{at}")
        put(prefix + "mlp.linear_fc1.bias", fcb, f"LLMC fcb{at}{how}")
        fc2w, how = _tp_split(tensors["fcprojw"][layer], 1, shard, f"fcprojw{at}")
        put(prefix + "mlp.linear_fc2.weight", fc2w, f"LLMC fcprojw{at}{how}")
        put(prefix + "mlp.linear_fc2.bias", tensors["fcprojb"][layer], f"LLMC fcprojb{at}")

    if shard.post_process:
        put("decoder.final_layernorm.weight", tensors["lnfw"], "LLMC lnfw")
        put("decoder.final_layernorm.bias", tensors["lnfb"], "LLMC lnfb")
    return out


@torch.no_grad()
def load_chunk(module: torch.nn.Module, mapped: dict[str, MappedTensor], rank: int) -> int:
    """Copy `mapped` into the chunk's parameters after checking that names and shapes agree.

    Returns the number of values loaded. Raises LockstepError naming the first tensor and the
    rank that disagree, before anything is copied.
    """
    params = dict(module.named_parameters())
    missing = [n for n in params if n not in mapped]
    if missing:
        raise LockstepError(f"rank {rank}: megatron-core parameter {missing[0]} has no LLMC counterpart "
                            f"(this megatron-core builds a different GPT layout than lockstep maps)")
    extra = [n for n in mapped if n not in params]
    if extra:
        raise LockstepError(f"rank {rank}: {mapped[extra[0]].source} maps to {extra[0]}, "
                            f"which this megatron-core model chunk does not have")
    for name, param in params.items():
        got = tuple(mapped[name].value.shape)
        if got != tuple(param.shape):
            raise LockstepError(f"rank {rank}: tensor {name} ({mapped[name].source}) has shape {got} "
                                f"but megatron-core's model needs {tuple(param.shape)}")
    total = 0
    for name, param in params.items():
        value = torch.from_numpy(np.ascontiguousarray(mapped[name].value, dtype=np.float32))
        param.data.copy_(value.to(param.device))
        total += value.numel()
    return total
