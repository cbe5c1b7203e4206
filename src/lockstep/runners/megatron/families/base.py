"""The adapter interface, and the rules every family shares (vocabulary rows, layout checks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from lockstep.cases.spec import CaseSpec, LoraSpec


def identity(a: np.ndarray) -> np.ndarray:
    return a


# The layout maps run on numpy arrays (loading weights) and on torch tensors (reading gradients
# back on the device, for a capture); these few helpers are the only calls that differ.
def concat(parts: list, axis: int = 0):
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts, axis=axis)
    import torch

    return torch.cat(parts, dim=axis)


def stack(parts: list):
    if isinstance(parts[0], np.ndarray):
        return np.stack(parts)
    import torch

    return torch.stack(parts)


def contiguous(a):
    return np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a.contiguous()


@dataclass(frozen=True)
class TensorMap:
    """One Megatron parameter of a chunk and the canonical LLMC tensor it holds.

    `canonical` is a canonical name (`qkvw[3]`), a row of one (`qknormw[3][0]`), or for "glu_rows"
    the pair (gate, up) that fc1 stacks. `to_megatron` turns the canonical tensor into Megatron's
    layout over all TP ranks and `from_megatron` undoes it; `tp_split` says how Megatron shards
    that layout: "rows" (column-parallel), "columns" (row-parallel), "glu_rows" (fc1 = [gate; up],
    each rank holding its rows of both halves) or None (replicated). `copy` marks a second home of
    a tensor (GPT-2's tied output weight on the last stage): loaded, but not read back.
    """

    megatron: str
    canonical: str | tuple[str, str]
    tp_split: str | None = None
    to_megatron: Callable[[np.ndarray], np.ndarray] = identity
    from_megatron: Callable[[np.ndarray], np.ndarray] = identity
    copy: bool = False


@dataclass(frozen=True)
class ChunkShard:
    """Which part of the model one Megatron model chunk on one rank holds."""

    rank: int  # global rank, for messages
    tp_rank: int
    tp_size: int
    pre_process: bool  # holds the embeddings (first pipeline stage / first virtual chunk)
    post_process: bool  # holds the final norm and the output layer
    layers: tuple[int, ...]  # the global 0-based layer of each local layer, in local order
    vocab_rows: int  # Megatron's vocabulary over all TP ranks (Vm)
    ep_rank: int = 0  # expert-parallel rank: which experts a MoE layer holds
    ep_size: int = 1
    lora: LoraSpec | None = None  # a LoRA case's adapters are parameters of the chunk too (families/lora.py)


def fit_rows(a: np.ndarray, rows: int) -> np.ndarray:
    """The first `rows` rows of `a`, zero-padded when `a` has fewer."""
    if rows <= a.shape[0]:
        return a[:rows]
    out = np.zeros((rows, *a.shape[1:]), dtype=np.float32) if isinstance(a, np.ndarray) else a.new_zeros((rows, *a.shape[1:]))
    out[: a.shape[0]] = a
    return out


def qkv_per_group(qkv: np.ndarray, num_heads: int, num_groups: int) -> np.ndarray:
    """LLMC `[Q of all heads; K of all kv heads; V]` rows -> Megatron's per query group rows
    `[q of the group's heads, k, v]` for each group (for GPT-2, groups = heads: `[q0 k0 v0; ...]`)."""
    rest = qkv.shape[1:]
    hd = qkv.shape[0] // (num_heads + 2 * num_groups)
    per = num_heads // num_groups
    q = qkv[: num_heads * hd].reshape(num_groups, per * hd, *rest)
    k = qkv[num_heads * hd : (num_heads + num_groups) * hd].reshape(num_groups, hd, *rest)
    v = qkv[(num_heads + num_groups) * hd :].reshape(num_groups, hd, *rest)
    return contiguous(concat([q, k, v], axis=1)).reshape(qkv.shape)


def qkv_from_groups(grouped: np.ndarray, num_heads: int, num_groups: int) -> np.ndarray:
    """The inverse of `qkv_per_group`."""
    rest = grouped.shape[1:]
    hd = grouped.shape[0] // (num_heads + 2 * num_groups)
    per = num_heads // num_groups
    g = grouped.reshape(num_groups, (per + 2) * hd, *rest)
    q, k, v = g[:, : per * hd], g[:, per * hd : (per + 1) * hd], g[:, (per + 1) * hd :]
    return contiguous(concat([contiguous(q).reshape(-1, *rest), contiguous(k).reshape(-1, *rest),
                              contiguous(v).reshape(-1, *rest)]))


class MegatronFamily:
    """What a family adapter provides; the shared defaults live here."""

    family: str
    moe = False  # its layers are mixtures of experts (expert parallelism applies)
    sequence_parallel_norms = False  # its norms train under SP without Apex / Transformer Engine

    def config_overrides(self, model) -> dict:
        """TransformerConfig fields of the family's math (shape fields are set by model.py)."""
        raise NotImplementedError

    def layer_spec(self, model):
        """The local (non-Transformer-Engine) layer spec."""
        raise NotImplementedError

    def fused_activation_overrides(self, model) -> dict:
        """TransformerConfig fields that hand the MLP's bias+activation to megatron-core's fused
        function (megatron-fast, fast.py), or {} where megatron-core has none for the family."""
        return {}

    def block_spec(self, config, layer_spec, vp_stage: int | None):
        """What GPTModel builds its decoder from: the layer spec itself, or a block spec made of it."""
        return layer_spec

    def mlp_maps(self, prefix: str, layer: int, model, shard: "ChunkShard") -> list["TensorMap"]:
        """The MLP's parameters of one layer (dense families: in their weight_maps)."""
        raise NotImplementedError

    def is_expert(self, canonical: str) -> bool:
        """Whether a canonical tensor belongs to an expert (held by its expert-parallel rank only)."""
        return False

    def gpt_model_kwargs(self, model) -> dict:
        """GPTModel arguments: positions, rotary base, tied or untied output layer."""
        raise NotImplementedError

    def weight_maps(self, model, shard: ChunkShard) -> list[TensorMap]:
        """Every parameter of the chunk and its canonical tensor, in both directions."""
        raise NotImplementedError

    def vocab_rows(self, model, tp: int) -> int:
        """Rows of Megatron's word embedding and output layer: V, or V rounded up to a multiple of TP."""
        return -(-model.vocab_size // tp) * tp

    def ffn_hidden(self, model) -> int:
        return model.ffn_hidden

    def layout_problem(self, case: CaseSpec, model) -> str | None:
        """Why megatron-core cannot split this model the way the case asks, or None."""
        if case.ep > 1 and not self.moe:
            return f"expert parallelism (EP={case.ep}) needs a mixture-of-experts model"
        if model.num_heads % case.tp:
            return f"TP={case.tp} does not divide the model's {model.num_heads} attention heads"
        if model.num_kv_heads % case.tp:
            return f"TP={case.tp} does not divide the model's {model.num_kv_heads} kv heads (query groups)"
        if self.ffn_hidden(model) % case.tp:
            return f"TP={case.tp} does not divide the MLP width {self.ffn_hidden(model)}"
        chunks = case.pp * case.vpp
        if case.pp_layout is not None:
            # An explicit layout may split unevenly; it must hold exactly the model's layers.
            from lockstep.cases.pipeline_layout import parse_pipeline_layout

            stages = parse_pipeline_layout(case.pp_layout, where=f"case {case.name}")
            held = sum(s.layers for s in stages)
            if len(stages) != chunks:
                return f"pp_layout {case.pp_layout} has {len(stages)} stage(s), PP x VPP is {chunks}"
            if held != model.num_layers:
                return f"pp_layout {case.pp_layout} holds {held} layers, the model has {model.num_layers}"
        elif model.num_layers % chunks:
            what = f"PP={case.pp}" + (f" x VPP={case.vpp}" if case.vpp > 1 else "")
            return f"{what} does not divide the model's {model.num_layers} layers evenly"
        if case.vpp > 1 and case.pp == 1:
            return "virtual pipeline stages (VPP > 1) need PP > 1"
        if case.vpp > 1 and case.accum % case.pp:
            return (f"Megatron's interleaved schedule needs the micro batches per step ({case.accum}) "
                    f"to be a multiple of PP={case.pp}")
        if case.sp and case.seq_len % case.tp:
            return f"sequence parallel needs the sequence length {case.seq_len} divisible by TP={case.tp}"
        return None
