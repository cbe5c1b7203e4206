"""LoRA on megatron-core's parallel linear layers: lockstep's own adapter (megatron-bridge's PEFT is
not used), sharded as InfiniTrain shards it (docs/reference/lora.md#under-tensor-parallelism).

`apply_lora` freezes every parameter of a model chunk, then hangs `lora_A` / `lora_B` (FP32) on each
adapted `ColumnParallelLinear` / `RowParallelLinear` (families/lora.py says which, and how they map
to canonical tensors) and wraps that layer's forward: y = base(x) + (alpha / rank) · B (A x).
Their values are loaded with the rest of the chunk (weights.load_chunk) from the case's one LoRA
init (models/lora.py `lora_init_tensors`); megatron's DDP and optimizer then see only them (both
skip parameters that do not require a gradient).

- Column-parallel (linear_qkv, linear_fc1): A `[rank, in]` replicated, B `[out/TP, rank]` this
  rank's rows. `A x` is every rank's same value; its gradient is each rank's rows' share, so it is
  summed over TP (`copy_to_tensor_model_parallel_region`: identity forward, all-reduce backward)
  before it reaches A and x: A's gradient is then whole (and equal) on every TP rank, and the
  branch's input gradient is whole, beside the base's own all-reduced one.
- Row-parallel (linear_proj, linear_fc2): A `[rank, in/TP]` this rank's columns, B `[out, rank]`
  replicated. `A_r x_r` is summed over TP (`reduce_from_tensor_model_parallel_region`) before B
  and the scale: B (Σ_r A_r x_r) = Σ_r B (A_r x_r), InfiniTrain's sum of the branch with the base's
  all-reduce, with r values per token exchanged instead of `out`.
- A gated fc1 (`[gate; up]`) has one adapter per adapted half; the branch is `[gate part; up part]`
  per rank (zeros for a half no target names), as the base's output is.
Sequence parallelism is not implemented (the runner skips such a case).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lockstep.cases.spec import LoraSpec
from lockstep.runners.megatron.families.base import MegatronFamily
from lockstep.runners.megatron.families.lora import LoraSite, lora_sites


def apply_lora(chunk, adapter: MegatronFamily, model, spec: LoraSpec, tp: int) -> int:
    """Freeze the chunk and adapt its targeted linears (values still to be loaded). Returns how
    many linears were adapted."""
    for p in chunk.parameters():
        p.requires_grad_(False)
    sites = lora_sites(adapter, model, spec.target_modules)
    count = 0
    for layer in chunk.decoder.layers:
        for site in sites:
            _adapt(layer.get_submodule(site.module), site, spec, tp)
            count += 1
    return count


def _new_param(shape, device, parallel_dim: int | None) -> torch.nn.Parameter:
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    p = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float32, device=device))
    set_tensor_model_parallel_attributes(p, parallel_dim is not None, parallel_dim if parallel_dim is not None else -1, 1)
    return p


def _adapt(linear, site: LoraSite, spec: LoraSpec, tp: int) -> None:
    from megatron.core.tensor_parallel.mappings import (copy_to_tensor_model_parallel_region,
                                                        reduce_from_tensor_model_parallel_region)

    if getattr(linear, "sequence_parallel", False):
        raise ValueError("lockstep's megatron LoRA adapter does not implement sequence parallelism")
    device = linear.weight.device
    rank, scale = spec.rank, spec.alpha / spec.rank
    base_forward = linear.forward  # the class's forward, bound to this layer
    group = getattr(linear, "tp_group", None)
    if site.parallel == "column":
        if getattr(linear, "gather_output", False):
            raise ValueError("lockstep's megatron LoRA adapter expects column-parallel layers that keep their output split")
        rows = linear.output_size_per_partition // len(site.parts)
        for part in filter(None, site.parts):
            linear.register_parameter("lora_A" + part.suffix, _new_param((rank, linear.input_size), device, None))
            linear.register_parameter("lora_B" + part.suffix, _new_param((rows, rank), device, 0))

        def forward(input_, weight=None, runtime_gather_output=None):
            out, bias = base_forward(input_, weight=weight, runtime_gather_output=runtime_gather_output)
            pieces = []
            for part in site.parts:
                if part is None:
                    pieces.append(out.new_zeros(*out.shape[:-1], rows))
                    continue
                h = F.linear(input_, getattr(linear, "lora_A" + part.suffix))
                if tp > 1:
                    h = copy_to_tensor_model_parallel_region(h, group=group)
                pieces.append(F.linear(h, getattr(linear, "lora_B" + part.suffix)))
            branch = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)
            return out + branch * scale, bias
    else:
        part = site.parts[0]
        linear.register_parameter("lora_A" + part.suffix,
                                  _new_param((rank, linear.input_size_per_partition), device, 1))
        linear.register_parameter("lora_B" + part.suffix, _new_param((linear.output_size, rank), device, None))

        def forward(input_):
            out, bias = base_forward(input_)
            h = F.linear(input_, getattr(linear, "lora_A" + part.suffix))
            if tp > 1:
                h = reduce_from_tensor_model_parallel_region(h, group=group)
            return out + F.linear(h, getattr(linear, "lora_B" + part.suffix)) * scale, bias

    linear.forward = forward
