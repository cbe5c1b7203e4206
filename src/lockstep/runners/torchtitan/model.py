"""torchtitan's own model classes (Llama3Model, Qwen3Model) configured from lockstep's LLMC shape,
and its optimizer container configured as the contract's Adam.

The configs are built with torchtitan's public config helpers (`make_gqa_config`,
`make_ffn_config`), not its registry's named flavors, because lockstep's shape comes from the
checkpoint header. Two choices matter for agreement:

- `fuse_qkv=False`: torchtitan's fused wqkv orders its rows per kv group ([q heads, k, v] for
  each kv head), not LLMC's [Q; K; V]; the separate wq/wk/wv map to LLMC's rows by a split.
- the FFN's hidden size is lockstep's (`ffn_hidden`, its llround rule) handed over as the final
  size: torchtitan's `compute_ffn_hidden_dim` truncates the multiplier's product instead of
  rounding it, which differs for some shapes.

RoPE: Llama 3 uses `ComplexRoPE` (interleaved pairs, Meta's layout, LLMC's too) with
`scaling="none"`; Qwen3 uses `CosSinRoPE` (HF rotate_half, half-split pairs, LLMC's Qwen3 layout
too): no permutation of q/k rows is needed in either family.
Attention is torchtitan's FlexAttention with its causal mask on CUDA (of the backends its
config helper offers language models, flex and varlen; varlen is flash attention's, CUDA only).
On a CPU, where FlexAttention has no backward ("FlexAttention does not support backward on CPU"),
it is torchtitan's own ScaledDotProductAttention module with is_causal (the Trainer builds no
mask for it, and lockstep's positions are one causal document per row, so the math is the same).
The same module on CUDA where torch's FlexAttention is older than torchtitan 0.3.0's call to it
(`create_block_mask(..., separate_full_blocks=)`, torch 2.12 on): the device's torch 2.11 has not.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from lockstep.errors import LockstepError

RMS_INIT = {"weight": nn.init.ones_}
LINEAR_INIT = {"weight": partial(nn.init.normal_, std=0.02)}  # replaced at once by the LLMC weights


def attention_config(device: str):
    """torchtitan's inner attention for `device` (see the module docstring)."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import get_attention_config

    if device == "cpu" or not flex_attention_current():
        return ScaledDotProductAttention.Config()
    return get_attention_config("flex")


def flex_attention_current() -> bool:
    """Whether torch's FlexAttention takes what torchtitan 0.3.0 passes it."""
    import inspect

    from torch.nn.attention.flex_attention import create_block_mask

    return "separate_full_blocks" in inspect.signature(create_block_mask).parameters


def build_model(family: str, cfg, device: str = "cpu") -> nn.Module:
    """torchtitan's model of `family` with the shape of lockstep's config `cfg`, on the CPU."""
    model = model_config(family, cfg, device).build()
    model.init_states(buffer_device=torch.device("cpu"))
    return model


def model_config(family: str, cfg, device: str):
    """torchtitan's model config (Llama3Model.Config / Qwen3Model.Config) of `family` with the
    shape of lockstep's config `cfg`: what the Trainer's model spec holds."""
    from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config

    if family == "llama3":
        from torchtitan.models.llama3.model import Llama3Model as Model, Llama3TransformerBlock as Block
        rope = ComplexRoPE.Config(dim=cfg.head_dim, max_seq_len=cfg.max_seq_len, theta=cfg.rope_theta, scaling="none")
        hidden, qk_norm = cfg.ffn_hidden, None
    elif family == "qwen3":
        from torchtitan.models.qwen3.model import Qwen3Model as Model, Qwen3TransformerBlock as Block
        rope = CosSinRoPE.Config(dim=cfg.head_dim, max_seq_len=cfg.max_seq_len, theta=cfg.rope_theta)
        hidden = cfg.intermediate_size
        qk_norm = RMSNorm.Config(normalized_shape=cfg.head_dim, eps=cfg.norm_eps, param_init=RMS_INIT)
    else:
        raise LockstepError(f"the torchtitan runner has no model for family {family!r}")

    def norm(dim: int):
        return RMSNorm.Config(normalized_shape=dim, eps=cfg.norm_eps, param_init=RMS_INIT)

    C, V = cfg.channels, cfg.vocab_size
    layers = [Block.Config(
        attention_norm=norm(C), ffn_norm=norm(C),
        attention=make_gqa_config(dim=C, n_heads=cfg.num_heads, n_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                                  wqkv_param_init=LINEAR_INIT, wo_param_init=LINEAR_INIT,
                                  inner_attention=attention_config(device), fuse_qkv=False, rope=rope,
                                  **({"qk_norm": qk_norm} if qk_norm is not None else {})),
        feed_forward=make_ffn_config(dim=C, hidden_dim=hidden, w1_param_init=LINEAR_INIT, w2w3_param_init=LINEAR_INIT),
    ) for _ in range(cfg.num_layers)]
    return Model.Config(dim=C, vocab_size=V, enable_weight_tying=False,
                        tok_embeddings=Embedding.Config(num_embeddings=V, embedding_dim=C,
                                                        param_init={"weight": partial(nn.init.normal_, std=1.0)}),
                        norm=norm(C), lm_head=Linear.Config(in_features=C, out_features=V, param_init=LINEAR_INIT),
                        layers=layers)


def optimizer_config(spec, lr: float):
    """torchtitan's OptimizersContainer config with one AdamW group configured as the contract's
    Adam (weight decay 0, so AdamW is Adam; bias-corrected, as torch's always is), the for-loop
    implementation (its "fused" default is CUDA only)."""
    from torchtitan.components.optimizer import OptimizersContainer
    from torchtitan.components.optimizer.optimizer import ParamGroupConfig

    if spec.kind != "adam":
        raise LockstepError(f"the torchtitan runner trains Adam cases only (the family's optimizer is {spec.kind})")
    group = ParamGroupConfig(pattern=r".*", optimizer_name="AdamW",
                             optimizer_kwargs={"lr": lr, "betas": (spec.beta1, spec.beta2), "eps": spec.eps,
                                               "weight_decay": spec.weight_decay})
    return OptimizersContainer.Config(param_groups=[group], implementation="for-loop")


def build_optimizer(model: nn.Module, spec, lr: float):
    """The optimizer `optimizer_config` describes, over `model`'s parameters."""
    return optimizer_config(spec, lr).build(model_parts=[model])
