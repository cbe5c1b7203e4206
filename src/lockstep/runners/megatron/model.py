"""megatron-core objects for a case: TransformerConfig, GPTModel chunks, DDP, optimizer.

Everything megatron-core is asked to do is chosen here, explicitly, so that the contract of
the training contract (docs/reference/training-contract.md) is visible in one place:
- The family's math comes from its adapter (families/: norms, activation, biases, positions,
  RoPE pairing, QK-norm, tied or untied output). What every family shares is set here: softmax
  in FP32 scaled by 1/sqrt(hd) (no query-key layer scaling), no dropout, no fused kernels
  (masked softmax, bias+dropout+add, RoPE fusion, gradient accumulation into main_grad) -- the
  local (non-Transformer-Engine) layer spec. megatron-fast sets its own fields over these
  (fast.py: SDPA core attention, megatron-core's fused bias+activation, bias+dropout+add and
  cross entropy, CUDA graphs).
- Precision: FP32 parameters. BF16 cases set megatron's own `enable_autocast` (the pipeline
  schedules wrap each micro batch's forward in `torch.autocast("cuda", bf16)`), with FP32
  parameters, gradients and optimizer. `native_bf16` is the diagnostic alternative: megatron's
  `--bf16` (bf16 parameters in a Float16Module, FP32 main parameters in the optimizer).
- Pipeline p2p: `pipeline_p2p`, Megatron-LM's choice on every device (never batched with VPP:
  megatron-core's batched exchange swaps activations and gradients there at PP=2).
- Training: megatron's DistributedDataParallel (gradients averaged over DP in an FP32
  buffer), `get_megatron_optimizer` with the family's contract optimizer (plain SGD, or Adam
  with the contract's betas and eps; no weight decay, no clipping), and an
  OptimizerParamScheduler whose constant style keeps lr = case.lr as Megatron-LM would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lockstep.cases.spec import CaseSpec
from lockstep.models.family import OptimizerSpec
from lockstep.runners.megatron.families.base import MegatronFamily
from lockstep.runners.megatron.parallel import ParallelLayout, chunk_stages


@dataclass(frozen=True)
class Precision:
    """How a case's dtype maps onto megatron-core's switches."""

    params_dtype: torch.dtype
    autocast_bf16: bool  # the contract's BF16: autocast forward, FP32 parameters
    native_bf16: bool  # the diagnostic mode: bf16 parameters (Float16Module)

    @classmethod
    def for_case(cls, case: CaseSpec, native_bf16: bool) -> "Precision":
        if not case.is_bf16:
            return cls(torch.float32, autocast_bf16=False, native_bf16=False)
        if native_bf16:
            return cls(torch.bfloat16, autocast_bf16=False, native_bf16=True)
        return cls(torch.float32, autocast_bf16=True, native_bf16=False)

    @property
    def label(self) -> str:
        if self.native_bf16:
            return "bf16 native (megatron --bf16: bf16 params, fp32 main params) [diagnostic]"
        if self.autocast_bf16:
            return "bf16 autocast (fp32 params and optimizer)"
        return "fp32 (TF32 off)"


@dataclass(frozen=True)
class PipelineP2P:
    """How pipeline stages exchange activations and gradients (megatron-core's p2p switches)."""

    batch: bool  # batch_p2p_comm: one batch_isend_irecv per exchange
    overlap: bool  # overlap_p2p_comm: unbatched isend/irecv, waited on later (interleaved schedule only)


def pipeline_p2p(case: CaseSpec) -> PipelineP2P:
    """Megatron-LM's choice (`batch_p2p_comm = not overlap_p2p_comm`, overlap on when interleaving),
    on every device, so that the CPU suite runs the exchanges a GPU runs.

    Never batched with VPP: megatron-core's `_batched_p2p_ops` posts [send_prev, recv_prev,
    send_next, recv_next] in one batch, and with a pipeline group of two ranks prev == next, so
    the interleaved schedule's two-way exchanges (`send_forward_backward_recv_forward_backward`)
    pair rank 0's [gradient, activation] with rank 1's [activation, gradient] buffers: they swap,
    silently (equal shapes), from the first steady-state micro batch on (accum >= 2 x PP). The
    unbatched path orders its posts by even/odd rank and is exact. Upstream: Megatron-LM issues
    #750 and #1450, PR #5271; present in megatron-core 0.16.1 and 0.19.2
    (docs/results/2026-12-01-vpp/ reproduces it without lockstep). Without VPP no exchange sends
    two messages to one peer, and batching is what Megatron-LM does there too."""
    if case.vpp > 1:
        return PipelineP2P(batch=False, overlap=True)
    return PipelineP2P(batch=True, overlap=False)


def recompute_overrides(case: CaseSpec) -> dict:
    """The case's activation recompute as TransformerConfig's fields ("none" is its None)."""
    if not case.activation_recompute or case.recompute_granularity == "none":
        return {}
    selective = case.recompute_granularity == "selective"
    return {"recompute_granularity": case.recompute_granularity,
            "recompute_method": None if case.recompute_method == "none" else case.recompute_method,
            "recompute_num_layers": None if selective else case.recompute_num_layers}


def transformer_config(case: CaseSpec, model, adapter: MegatronFamily, precision: Precision, on_cpu: bool,
                       overrides: dict | None = None):
    """The case's TransformerConfig; `overrides` are megatron-fast's fields (fast.config_overrides),
    set over the unfused defaults below."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(**{**config_fields(case, model, adapter, precision, on_cpu), **(overrides or {})})


def config_fields(case: CaseSpec, model, adapter: MegatronFamily, precision: Precision, on_cpu: bool) -> dict:
    p2p = pipeline_p2p(case)
    return dict(
        # shape
        num_layers=model.num_layers,
        hidden_size=model.channels,
        num_attention_heads=model.num_heads,
        kv_channels=model.head_dim,
        ffn_hidden_size=adapter.ffn_hidden(model),
        # parallelism
        tensor_model_parallel_size=case.tp,
        pipeline_model_parallel_size=case.pp,
        virtual_pipeline_model_parallel_size=case.vpp if case.vpp > 1 else None,
        # An uneven split (e.g. "Et*5|t*5|t*4L"); megatron-core places the layers and numbers
        # them globally, so chunk_layers() reads each chunk's global layers back as for an even split.
        pipeline_model_parallel_layout=case.pp_layout,
        # MoE: the experts over EP ranks; megatron marks expert parameters `allreduce=False` from
        # this (their gradients then reduce over the expert-data-parallel ranks only)
        expert_model_parallel_size=case.ep,
        sequence_parallel=case.sp,
        **recompute_overrides(case),
        # the family's math (norm, activation, biases, RoPE pairing, QK-norm)
        **adapter.config_overrides(model),
        attention_softmax_in_fp32=True,
        apply_query_key_layer_scaling=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # no fused kernels: the unfused ops are the ones every framework shares
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        # precision
        params_dtype=precision.params_dtype,
        bf16=precision.native_bf16,
        pipeline_dtype=precision.params_dtype,  # stage outputs: FP32 residual stream unless native bf16
        enable_autocast=precision.autocast_bf16,
        autocast_dtype=torch.bfloat16 if precision.autocast_bf16 else None,
        # initialisation: every value is loaded from the LLMC file, so megatron's random init is skipped
        perform_initialization=False,
        use_cpu_initialization=on_cpu,
        # pipeline p2p: the same on every device (the CPU shims answer the batched path's CUDA sync)
        batch_p2p_comm=p2p.batch,
        overlap_p2p_comm=p2p.overlap,
    )


def build_model_chunks(config, model, adapter: MegatronFamily, layout: ParallelLayout, vocab_rows: int,
                       layer_spec=None) -> list:
    """One GPTModel per virtual pipeline chunk of this rank (one chunk without VPP), built from the
    family's local layer spec or `layer_spec` (megatron-fast's, fast.layer_spec)."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    layer_spec = layer_spec if layer_spec is not None else adapter.layer_spec(model)
    chunks = []
    for chunk in range(layout.vpp):
        pre_process, post_process = chunk_stages(layout, chunk)
        kwargs = dict(
            config=config,
            transformer_layer_spec=adapter.block_spec(config, layer_spec, chunk if layout.vpp > 1 else None),
            vocab_size=vocab_rows,
            max_sequence_length=model.max_seq_len,
            pre_process=pre_process,
            post_process=post_process,
            parallel_output=True,  # logits stay split over TP ranks; the loss is vocab-parallel
            **adapter.gpt_model_kwargs(model),
        )
        if layout.vpp > 1:
            kwargs["vp_stage"] = chunk
        chunks.append(GPTModel(**kwargs))
    return chunks


def chunk_layers(chunk) -> tuple[int, ...]:
    """Global 0-based layer of each local layer; megatron-core numbers them from 1 with the stage offset."""
    return tuple(int(layer.layer_number) - 1 for layer in chunk.decoder.layers)


def wrap_for_training(config, chunks: list, precision: Precision, zero: int = 0) -> list:
    """Float16Module (native bf16 only), then megatron's DDP around every chunk."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.module import Float16Module

    if precision.native_bf16:
        chunks = [Float16Module(config, c) for c in chunks]
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,  # accumulate and all-reduce gradients in FP32 (Megatron-LM's usual choice)
        overlap_grad_reduce=False,
        # ZeRO-1: megatron's distributed optimizer (gradients reduce-scattered, each DP rank
        # updating its shard of the FP32 parameters, then all-gathered).
        use_distributed_optimizer=zero >= 1,
        check_for_nan_in_grad=False,
    )
    # As Megatron-LM's get_model: only the first chunk gets buckets of its own.
    return [DistributedDataParallel(config=config, ddp_config=ddp_config, module=c, disable_bucketing=i > 0)
            for i, c in enumerate(chunks)]


def build_optimizer(case: CaseSpec, chunks: list, precision: Precision, spec: OptimizerSpec):
    """megatron's optimizer (the family's contract optimizer) and its lr scheduler (schedule.py)."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from lockstep.runners.megatron.schedule import build_scheduler, lr_bounds

    opt_config = OptimizerConfig(
        optimizer=spec.kind,  # "sgd" | "adam" (megatron's Adam is AdamW: decoupled decay, here 0)
        lr=lr_bounds(case)[0],
        min_lr=lr_bounds(case)[1],  # the param groups' max_lr / min_lr the scheduler reads
        weight_decay=spec.weight_decay,
        sgd_momentum=0.0,
        adam_beta1=spec.beta1,
        adam_beta2=spec.beta2,
        adam_eps=spec.eps,
        clip_grad=0.0,
        bf16=precision.native_bf16,
        params_dtype=precision.params_dtype,
        use_distributed_optimizer=case.zero >= 1,
    )
    optimizer = get_megatron_optimizer(opt_config, chunks)
    return optimizer, build_scheduler(optimizer, case)
