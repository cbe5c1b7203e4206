"""Where a LoRA case's adapters sit on megatron-core's layers, and how they map to canonical tensors.

lockstep's own adapter (runners/megatron/lora.py) hangs `lora_A` / `lora_B` on the parallel linear
layer it adapts, sharded as InfiniTrain shards it (docs/reference/lora.md#under-tensor-parallelism):

    canonical (models/lora.py)     Megatron parameter (decoder.layers.i. ...)      TP split
    lora_A.qkvw[l]                 self_attention.linear_qkv.lora_A                replicated
    lora_B.qkvw[l]                 self_attention.linear_qkv.lora_B                rows, regrouped like qkvw
    lora_A.attprojw[l]             self_attention.linear_proj.lora_A               columns (row-parallel)
    lora_B.attprojw[l]             self_attention.linear_proj.lora_B               replicated
    lora_A/B.fcw[l]                mlp.linear_fc1.lora_A/B (GLU: lora_A_up/_B_up)  A replicated, B rows
    lora_A/B.fcw2[l] (gate)        mlp.linear_fc1.lora_A_gate/lora_B_gate (GLU)    A replicated, B rows
    lora_A.fcprojw[l]              mlp.linear_fc2.lora_A                           columns
    lora_B.fcprojw[l]              mlp.linear_fc2.lora_B                           replicated

- B of `linear_qkv` has one row per output row of the fused QKV weight, so its rows are permuted
  exactly as qkvw's are (LLMC `[Q; K; V]` -> Megatron's per-query-group `[q, k, v]`, families/base.py
  `qkv_per_group`) before the rows are split over TP ranks; A (one, shared by Q, K and V) is not.
- A gated MLP's `linear_fc1` is InfiniTrain's two linears c_fc2 (gate) and c_fc (up) stacked
  `[gate; up]`: each adapted half has an adapter of its own (two A's), and each TP rank's output is
  `[its gate rows; its up rows]`, so each B is split by rows on its own like the half it adapts.

Numpy only, like the rest of the forward map (weights.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from lockstep.cases.lora_targets import BASE_WEIGHT, adapted_linears
from lockstep.runners.megatron.families.base import ChunkShard, MegatronFamily, TensorMap, qkv_from_groups, qkv_per_group

# InfiniTrain's block linear -> (the Megatron module under decoder.layers.i., its TP kind)
MEGATRON_MODULE = {"attn.c_attn": ("self_attention.linear_qkv", "column"),
                   "attn.c_proj": ("self_attention.linear_proj", "row"),
                   "mlp.c_fc": ("mlp.linear_fc1", "column"), "mlp.c_fc2": ("mlp.linear_fc1", "column"),
                   "mlp.c_proj": ("mlp.linear_fc2", "row")}


@dataclass(frozen=True)
class LoraPart:
    """One adapter on a Megatron linear: its parameters' suffix ("" or "_gate"/"_up") and the
    canonical weight it adapts (qkvw, fcw2, ...)."""

    suffix: str
    base: str


@dataclass(frozen=True)
class LoraSite:
    """An adapted Megatron linear of every layer: the module, its TP kind, and its adapters in
    output order (a gated fc1: (gate, up), None for a half no target names)."""

    module: str
    parallel: str  # "column" | "row"
    parts: tuple[LoraPart | None, ...]


def is_gated(adapter: MegatronFamily, model) -> bool:
    return bool(adapter.config_overrides(model).get("gated_linear_unit", False))


def lora_sites(adapter: MegatronFamily, model, targets) -> list[LoraSite]:
    """The Megatron linears a case's targets adapt in each layer, in the layer's module order."""
    adapted = adapted_linears(adapter.family, tuple(targets))
    sites = []
    for linear in ("attn.c_attn", "attn.c_proj"):
        if linear in adapted:
            module, kind = MEGATRON_MODULE[linear]
            sites.append(LoraSite(module, kind, (LoraPart("", BASE_WEIGHT[linear]),)))
    if is_gated(adapter, model):
        gate = LoraPart("_gate", "fcw2") if "mlp.c_fc2" in adapted else None
        up = LoraPart("_up", "fcw") if "mlp.c_fc" in adapted else None
        if gate or up:
            sites.append(LoraSite("mlp.linear_fc1", "column", (gate, up)))
    elif "mlp.c_fc" in adapted:
        sites.append(LoraSite("mlp.linear_fc1", "column", (LoraPart("", "fcw"),)))
    if "mlp.c_proj" in adapted:
        sites.append(LoraSite("mlp.linear_fc2", "row", (LoraPart("", "fcprojw"),)))
    return sites


def lora_maps(adapter: MegatronFamily, model, shard: ChunkShard) -> list[TensorMap]:
    """The TensorMaps of every adapter of the chunk (none without `shard.lora`)."""
    if shard.lora is None:
        return []
    grouped = partial(qkv_per_group, num_heads=model.num_heads, num_groups=model.num_kv_heads)
    ungrouped = partial(qkv_from_groups, num_heads=model.num_heads, num_groups=model.num_kv_heads)
    sites = lora_sites(adapter, model, shard.lora.target_modules)
    maps = []
    for local, layer in enumerate(shard.layers):
        for site in sites:
            p = f"decoder.layers.{local}.{site.module}."
            for part in filter(None, site.parts):
                a, b = f"lora_A.{part.base}[{layer}]", f"lora_B.{part.base}[{layer}]"
                if site.parallel == "row":
                    maps += [TensorMap(p + "lora_A" + part.suffix, a, "columns"), TensorMap(p + "lora_B" + part.suffix, b)]
                elif part.base == "qkvw":
                    maps += [TensorMap(p + "lora_A", a), TensorMap(p + "lora_B", b, "rows", grouped, ungrouped)]
                else:
                    maps += [TensorMap(p + "lora_A" + part.suffix, a), TensorMap(p + "lora_B" + part.suffix, b, "rows")]
    return maps
