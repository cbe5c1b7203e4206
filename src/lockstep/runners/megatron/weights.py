"""Canonical LLMC tensors <-> the parameters of one megatron-core GPTModel chunk on one rank.

The family adapters (families/) declare, per parameter, which canonical tensor it holds, how
Megatron's layout differs (`to_megatron` / `from_megatron`) and how tensor parallelism shards
it. This module applies those declarations: forward to load a chunk (`chunk_tensors`,
`load_chunk`), backward to read a chunk's weights or gradients back under canonical names
(`canonical_from_chunk`). The forward direction is numpy only (tested without megatron-core);
`load_chunk` validates every name and shape and names the tensor and rank that disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from lockstep.errors import LockstepError
from lockstep.runners.megatron.families.base import ChunkShard, MegatronFamily, TensorMap, concat, identity, stack

def chunk_maps(adapter: MegatronFamily, model, shard: ChunkShard) -> list[TensorMap]:
    """Every parameter of the chunk: the family's, then a LoRA case's adapters (families/lora.py)."""
    from lockstep.runners.megatron.families.lora import lora_maps

    return adapter.weight_maps(model, shard) + lora_maps(adapter, model, shard)


_ROW_OF = re.compile(r"^(.*\])\[(\d+)\]$")  # "qknormw[3][1]" -> ("qknormw[3]", 1)


@dataclass(frozen=True)
class MappedTensor:
    value: np.ndarray
    source: str  # where it came from, e.g. "LLMC qkvw[1], TP rows 2/2"


def resolve(canonical: dict[str, np.ndarray], name: str) -> np.ndarray:
    if name in canonical:
        return canonical[name]
    row = _ROW_OF.match(name)
    if row and row.group(1) in canonical:
        return canonical[row.group(1)][int(row.group(2))]
    raise LockstepError(f"the checkpoint has no tensor {name}")


def tp_part(arr: np.ndarray, axis: int, shard: ChunkShard, what: str) -> tuple[np.ndarray, str]:
    if shard.tp_size == 1:
        return arr, ""
    n = arr.shape[axis]
    if n % shard.tp_size:
        raise LockstepError(f"rank {shard.rank}: {what} has {n} {'rows' if axis == 0 else 'columns'}, "
                            f"which TP={shard.tp_size} cannot split evenly")
    size = n // shard.tp_size
    index = [slice(None)] * arr.ndim
    index[axis] = slice(shard.tp_rank * size, (shard.tp_rank + 1) * size)
    return arr[tuple(index)], f", TP {'rows' if axis == 0 else 'columns'} {shard.tp_rank + 1}/{shard.tp_size}"


def _layer_of(name: str) -> int | None:
    m = re.search(r"\[(\d+)\]", name)
    return int(m.group(1)) if m else None


def chunk_tensors(canonical: dict[str, np.ndarray], model, shard: ChunkShard,
                  adapter: MegatronFamily) -> dict[str, MappedTensor]:
    """The value (canonical layout -> Megatron layout, TP-sharded) of every parameter of the chunk."""
    out: dict[str, MappedTensor] = {}
    for m in chunk_maps(adapter, model, shard):
        names = m.canonical if isinstance(m.canonical, tuple) else (m.canonical,)
        for name in names:
            layer = _layer_of(name)
            if layer is not None and layer >= model.num_layers:
                raise LockstepError(f"rank {shard.rank}: {m.megatron} is layer {layer}, "
                                    f"but the checkpoint has only {model.num_layers} layer(s)")
        if m.tp_split == "glu_rows":
            parts = [tp_part(resolve(canonical, n), 0, shard, n) for n in names]
            value = np.concatenate([p for p, _ in parts], axis=0)
            source = f"LLMC [{'; '.join(names)}] (gated linear unit: [gate; up]){parts[0][1]}"
        else:
            value = m.to_megatron(resolve(canonical, names[0]))
            how = ""
            if m.tp_split in ("rows", "columns"):
                value, how = tp_part(value, 0 if m.tp_split == "rows" else 1, shard, names[0])
            moved = ", in Megatron's layout" if m.to_megatron is not identity else ""
            source = f"LLMC {names[0]}{moved}{how}" + (" (a second copy: tied output weight)" if m.copy else "")
        out[m.megatron] = MappedTensor(value, source)
    return out


def canonical_from_chunk(params: dict, model, shard: ChunkShard, adapter: MegatronFamily,
                         gather_tp: Callable) -> dict:
    """Megatron parameters (or gradients) of one chunk -> canonical tensors, un-sharded: numpy
    arrays, or torch tensors on their device (a capture's gradients never leave the GPU whole).

    `gather_tp(local)` returns the pieces of every TP rank in rank order (`[local]` at TP=1);
    with TP > 1 every TP rank must call this with the same chunk, as it is a collective.
    """
    out: dict[str, np.ndarray] = {}
    rows: dict[str, dict[int, np.ndarray]] = {}
    for m in chunk_maps(adapter, model, shard):
        if m.copy:
            continue
        pieces = gather_tp(params[m.megatron])
        if m.tp_split == "glu_rows":
            halves = [(p[: p.shape[0] // 2], p[p.shape[0] // 2:]) for p in pieces]
            gate, up = m.canonical
            out[gate] = concat([h[0] for h in halves], axis=0)
            out[up] = concat([h[1] for h in halves], axis=0)
            continue
        if m.tp_split == "rows":
            full = concat(pieces, axis=0)
        elif m.tp_split == "columns":
            full = concat(pieces, axis=1)
        else:
            full = pieces[0]
        value = m.from_megatron(full)
        row = _ROW_OF.match(m.canonical)
        if row and m.canonical not in out:
            rows.setdefault(row.group(1), {})[int(row.group(2))] = value
        else:
            out[m.canonical] = value
    for name, by_index in rows.items():
        out[name] = stack([by_index[i] for i in sorted(by_index)])
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
                            f"(this megatron-core builds a different layout than lockstep maps)")
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


def first_copies(tensors: dict, layout, adapter: MegatronFamily) -> dict:
    """Of one rank's canonical tensors, those it reads back for the whole model: DP rank 0 / TP rank 0
    holds the first copy of the replicated ones, and each expert-parallel rank's first copy (expert
    DP rank 0, TP rank 0) that of its experts."""
    dense = layout.dp_rank == 0 and layout.tp_rank == 0
    return {n: t for n, t in tensors.items() if (layout.holds_first_expert_copy if adapter.is_expert(n) else dense)}
