"""megatron-te: a family's megatron-core model built from Transformer Engine's layer spec.

The `megatron-te` framework is the megatron runner's worker with `MegatronTEOptions` (job.py);
this module is what those options change: the family adapter (families/) wrapped so that

- its layer spec is megatron-core's `get_gpt_layer_with_transformer_engine_spec` (TE's fused
  LayerNorm+Linear for QKV and fc1, TE's Linear for the projections, TE's DotProductAttention,
  which picks cuDNN's fused attention where it can), with the family's q/k layernorm;
- its parameter names follow that spec: the norm before attention is held by QKV's
  LayerNormLinear (`input_layernorm.weight` -> `self_attention.linear_qkv.layer_norm_weight`),
  the norm before the MLP by fc1's (`pre_mlp_layernorm.*` -> `mlp.linear_fc1.layer_norm_*`).
  Everything else, layouts and TP splits included, is the family's own map.

Transformer Engine runs on CUDA only, so this has no CPU test beyond the names (tests/runners);
what it measured on a GPU is in docs/results.
"""

from __future__ import annotations

from dataclasses import replace

# The local spec's separate norms -> the TE spec's norms inside the following linear layer.
TE_NAMES = (
    ("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"),
    ("input_layernorm.bias", "self_attention.linear_qkv.layer_norm_bias"),
    ("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"),
    ("pre_mlp_layernorm.bias", "mlp.linear_fc1.layer_norm_bias"),
)


def te_name(megatron_name: str) -> str:
    """A local-spec parameter name as the TE spec names it (unchanged where the two agree)."""
    for local, te in TE_NAMES:
        if megatron_name.endswith("." + local):
            return megatron_name[: -len(local)] + te
    return megatron_name


class TESpecAdapter:
    """A family adapter with the TE layer spec and its parameter names; all else is the family's."""

    spec_label = "Transformer Engine (get_gpt_layer_with_transformer_engine_spec)"  # the record's layer_spec

    def __init__(self, family_adapter):
        self._family = family_adapter

    def __getattr__(self, name):
        return getattr(self._family, name)

    def layer_spec(self, model):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=bool(getattr(self._family, "qk_layernorm",
                                                                                   False)))

    def weight_maps(self, model, shard):
        return [replace(m, megatron=te_name(m.megatron)) for m in self._family.weight_maps(model, shard)]


def transformer_engine_missing() -> str | None:
    """Why megatron-te cannot run here (None: Transformer Engine's PyTorch package is importable)."""
    import importlib.util

    if importlib.util.find_spec("transformer_engine") is None:
        return "Transformer Engine is not installed (pip install transformer_engine[pytorch]; it needs CUDA)"
    return None
