"""Mixtral on megatron-core: Llama 3's attention and a MoELayer (TopKRouter, allgather token
dispatcher, SequentialMLP experts) in every layer (docs/reference/mixtral.md).

    LLMC                       Megatron parameter                                         split
    routerw[l]                 decoder.layers.i.mlp.router.weight                          replicated
    expert{e}.fcw2[l] ;        decoder.layers.i.mlp.experts.local_experts.j.linear_fc1     [gate; up], each expert-TP
      expert{e}.fcw[l]           .weight                                                   rank its rows of both
    expert{e}.fcprojw[l]       decoder.layers.i.mlp.experts.local_experts.j.linear_fc2     columns
                                 .weight
    (everything else: Llama 3's mapping, llama3.py)

- Expert parallelism: EP rank r holds experts r*E/EP .. (r+1)*E/EP-1 as local experts 0..E/EP-1
  (megatron-core's `local_expert_indices`). The expert tensor-parallel size is megatron-core's
  default, the TP size, so an expert's matrices split over the TP ranks as a dense MLP's do.
- The router is configured to route as the contract says: top-k on the logits, softmax over the
  k chosen (`moe_router_pre_softmax=False`, score function softmax, no scaling factor), no
  capacity (nothing dropped or padded), load-balancing loss coefficient 0 (`_apply_aux_loss`
  returns at once), no z-loss, no input jitter, no expert bias; sequential experts (no grouped
  GEMM), no fused permute or router kernels.
- megatron-core 0.16.1 without Transformer Engine binds no `te_general_gemm` in moe_utils, which
  the router's gating reads (a NameError on its first forward, on any device); 0.19 binds it to
  None. `layer_spec` binds it to None where it is missing, which is the path 0.19 takes.
- BF16 autocast: the router's gating is a custom autograd function whose backward runs outside
  autocast and multiplies the BF16 output gradient by the FP32 weight (a dtype error, so every
  BF16 MoE case failed). `layer_spec` makes its backward run under the forward's autocast state,
  as the backward of an autocast linear computes in BF16 (`autocast_aware_router_gating`).
- Norms: torch's RMSNorm, as the Llama 3 adapter's local spec builds it, but allowed under
  sequence parallelism, with its weight marked `sequence_parallel` so that finalize_model_grads
  sums its gradient over the TP ranks (what Transformer Engine's and Apex's norms do). megatron-core
  refuses MoE with TP > 1 in training without sequence parallelism (MoELayer.forward), and its own
  torch norm refuses sequence parallelism (torch_norm.py), so without this a TP=2 MoE could not
  train without Transformer Engine or Apex. The arithmetic is torch.nn.RMSNorm's, on every device.
"""

from __future__ import annotations

import re

import torch

from lockstep.cases.spec import CaseSpec
from lockstep.models.mixtral.config import expert_tensor
from lockstep.runners.megatron.families.base import ChunkShard, TensorMap
from lockstep.runners.megatron.families.llama3 import Llama3Adapter

_EXPERT = re.compile(r"^expert\d+\.")


class SequenceParallelRMSNorm:
    """torch.nn.RMSNorm built from a TransformerConfig, as megatron-core's WrappedTorchNorm builds it,
    without its refusal of sequence parallelism: under SP the weight is marked `sequence_parallel`
    (finalize_model_grads then sums its gradient over the TP ranks, each of which saw only its part of
    the sequence)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_unused):
        norm = torch.nn.RMSNorm(normalized_shape=hidden_size, eps=eps)
        setattr(norm.weight, "sequence_parallel", bool(config.sequence_parallel))
        return norm


class MixtralAdapter(Llama3Adapter):
    family = "mixtral"
    moe = True
    sequence_parallel_norms = True  # SequenceParallelRMSNorm

    def config_overrides(self, model) -> dict:
        return super().config_overrides(model) | dict(
            num_moe_experts=model.num_experts,
            moe_router_topk=model.router_topk,
            moe_ffn_hidden_size=model.moe_ffn_hidden_size,
            moe_router_pre_softmax=False,  # top-k on the logits, then softmax over the k chosen
            moe_router_score_function="softmax",
            moe_router_topk_scaling_factor=None,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=0.0,  # the contract's coefficient (models/mixtral/model.py AUX_LOSS_COEFF)
            moe_z_loss_coeff=None,
            moe_input_jitter_eps=None,
            moe_router_enable_expert_bias=False,
            moe_expert_capacity_factor=None,  # no capacity: every token reaches its k experts
            moe_pad_expert_input_to_capacity=False,
            moe_token_dispatcher_type="allgather",  # InfiniTrain's only dispatcher
            moe_grouped_gemm=False,  # SequentialMLP: one expert after the other, as InfiniTrain's experts.cc
            moe_permute_fusion=False,
            moe_router_fusion=False,
            moe_shared_expert_intermediate_size=None,
        )

    def layer_spec(self, model):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.moe import moe_utils

        if not getattr(moe_utils, "HAVE_TE", False) and not hasattr(moe_utils, "te_general_gemm"):
            moe_utils.te_general_gemm = None  # the router's plain torch.mm path, as megatron-core 0.19 has it
        autocast_aware_router_gating(moe_utils.RouterGatingLinearFunction)

        spec = get_gpt_layer_local_spec(num_experts=model.num_experts, moe_grouped_gemm=False,
                                        normalization="RMSNorm", qk_layernorm=False)
        layer = spec.submodules
        layer.input_layernorm = SequenceParallelRMSNorm
        layer.pre_mlp_layernorm = SequenceParallelRMSNorm
        return spec

    def block_spec(self, config, layer_spec, vp_stage: int | None):
        """The chunk's layers with the final norm the layers use too (a bare layer spec would get
        megatron-core's WrappedTorchNorm there, which refuses sequence parallelism)."""
        from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

        return TransformerBlockSubmodules(layer_specs=[layer_spec] * get_num_layers_to_build(config, vp_stage=vp_stage),
                                          layer_norm=SequenceParallelRMSNorm)

    def ffn_hidden(self, model) -> int:
        return model.moe_ffn_hidden_size

    def mlp_maps(self, prefix: str, layer: int, model, shard: ChunkShard) -> list[TensorMap]:
        at = f"[{layer}]"
        maps = [TensorMap(prefix + "mlp.router.weight", "routerw" + at)]
        local = model.num_experts // shard.ep_size
        for j in range(local):
            e = shard.ep_rank * local + j
            p = f"{prefix}mlp.experts.local_experts.{j}."
            maps += [TensorMap(p + "linear_fc1.weight", (expert_tensor(e, "fcw2", layer), expert_tensor(e, "fcw", layer)),
                               "glu_rows"),
                     TensorMap(p + "linear_fc2.weight", expert_tensor(e, "fcprojw", layer), "columns")]
        return maps

    def is_expert(self, canonical: str) -> bool:
        return bool(_EXPERT.match(canonical))

    def layout_problem(self, case: CaseSpec, model) -> str | None:
        if case.ep > 1 and model.num_experts % case.ep:
            return f"EP={case.ep} does not divide the model's {model.num_experts} experts"
        if case.tp > 1 and not case.sp:
            # MoELayer.forward refuses to train so (a performance guard, in 0.16 and 0.19 alike).
            return "megatron-core's MoE layer trains with TP > 1 only with sequence parallelism (sp = true)"
        return super().layout_problem(case, model)


ADAPTER = MixtralAdapter()


def autocast_aware_router_gating(function) -> None:
    """Make megatron-core's RouterGatingLinearFunction run its backward under the autocast state
    its forward saw (what torch.amp.custom_fwd/custom_bwd do, for every device type): without it
    the backward's torch.mm meets a BF16 gradient and the FP32 weight. Idempotent."""
    import contextlib

    if getattr(function, "_lockstep_autocast_aware", False):
        return
    forward, backward = function.forward, function.backward

    def forward_noting_autocast(ctx, *args):
        ctx.lockstep_autocast = [(device, torch.get_autocast_dtype(device)) for device in ("cuda", "cpu")
                                 if torch.is_autocast_enabled(device)]
        return forward(ctx, *args)

    def backward_under_autocast(ctx, *grads):
        with contextlib.ExitStack() as stack:
            for device, dtype in ctx.lockstep_autocast:
                stack.enter_context(torch.autocast(device, dtype=dtype))
            return backward(ctx, *grads)

    function.forward = staticmethod(forward_noting_autocast)
    function.backward = staticmethod(backward_under_autocast)
    function._lockstep_autocast_aware = True
