"""megatron-fast: megatron-core with what it offers without Transformer Engine or Apex.

The `megatron-fast` framework is the megatron runner's worker with `MegatronFastOptions`
(job.py); this module is everything those options change, so that `megatron` itself is untouched:

- Core attention: `SDPAttention`, torch's `scaled_dot_product_attention` behind megatron-core's
  core-attention interface (the one DotProductAttention has), put into the family's local layer
  spec by `layer_spec` (`core_attention = "sdpa"`). Causal through SDPA's `is_causal`, scaled
  by megatron's softmax scale (1/sqrt(head_dim)), GQA by repeating the kv heads as megatron does.
  Everything around it is the local spec's: the QKV projection, Qwen3's q/k layernorm, RoPE.
- Fusions (`fusions`), megatron-core's own jit/torch.compile'd functions:
  bias+activation (`bias_activation_fusion`: GPT-2's bias+GELU, the tanh form GPT-2 trains with;
  the SwiGLU of Llama 3, Qwen3 and Mixtral's experts), bias+dropout+add at both residuals
  (`bias_dropout_fusion`), and megatron-core's native fused vocab-parallel cross entropy in the
  worker's loss (`cross_entropy_fusion_impl="native"`) -- in BF16 cases only: its backward rounds
  the logits' gradient to BF16 (`calculate_gradients` ends in `.to(torch.bfloat16)`, in 0.16.1 and
  0.19 alike), which a BF16 autocast step does anyway (the output layer's logits are BF16) but
  which is not the FP32 contract's arithmetic. `masked_softmax_fusion` does not apply: it picks
  DotProductAttention's softmax kernel, and SDPA replaces that softmax.
  On the CPU these functions run uncompiled (`compile_stance`): the same code, without inductor's
  import and half a minute of compiling on a 2-core machine.
- CUDA graphs (`cuda_graphs`, opt-in): megatron-core's local per-layer graphs
  (`cuda_graph_impl="local"`, a graph-safe RNG tracker), on CUDA only, and never in a run that
  records step 1 from inside (its hooks cannot sit inside a captured graph).

`paths()` says which of these a run has on, and why not where off; the worker logs it and puts it
in the record's meta (`megatron_fast`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class FastPaths:
    """What one run of the worker turns on; `notes` says why a part is off (for the record)."""

    sdpa_attention: bool
    bias_activation_fusion: bool
    bias_dropout_fusion: bool
    cross_entropy_fusion: bool
    cuda_graphs: bool
    # megatron-core's fused functions compiled by its jit_fuser (torch.compile); off on the CPU.
    compiled_fusions: bool = False
    notes: tuple[str, ...] = ()

    @property
    def any(self) -> bool:
        return any((self.sdpa_attention, self.bias_activation_fusion, self.bias_dropout_fusion,
                    self.cross_entropy_fusion, self.cuda_graphs))

    def label(self) -> str:
        on = [name for name, value in (("SDPA attention", self.sdpa_attention),
                                       ("fused bias+activation", self.bias_activation_fusion),
                                       ("fused bias+dropout+add", self.bias_dropout_fusion),
                                       ("fused cross entropy", self.cross_entropy_fusion),
                                       ("CUDA graphs", self.cuda_graphs)) if value]
        return ", ".join(on) or "none"

    def to_dict(self) -> dict:
        return {**asdict(self), "notes": list(self.notes)}


def paths(options, case, adapter, model, device: str, capturing: bool) -> FastPaths:
    """Which of megatron-fast's parts this run of the worker turns on (all off for `megatron`)."""
    notes = []
    fused = bool(options.fusions)
    activation = fused and bool(adapter.fused_activation_overrides(model))
    if fused and not activation:
        notes.append(f"megatron-core has no fused bias+activation for the {adapter.family} MLP")
    cross_entropy = fused and case.is_bf16
    if fused and not case.is_bf16:
        notes.append("fused cross entropy off in FP32: megatron-core's native fused cross entropy rounds the "
                     "logits' gradient to BF16 (fused_cross_entropy.calculate_gradients)")
    compiled = fused and device == "cuda"
    if fused and not compiled:
        notes.append("megatron-core's fused functions run uncompiled on the CPU (the same functions; torch.compile of "
                     "them costs half a minute of a 2-core machine's first step)")
    graphs = bool(options.cuda_graphs) and device == "cuda" and not capturing
    if options.cuda_graphs and device != "cuda":
        notes.append("CUDA graphs off: no CUDA device")
    elif options.cuda_graphs and capturing:
        notes.append("CUDA graphs off in this run: it records step 1 from inside (hooks in every layer)")
    return FastPaths(sdpa_attention=options.core_attention == "sdpa", bias_activation_fusion=activation,
                     bias_dropout_fusion=fused, cross_entropy_fusion=cross_entropy, cuda_graphs=graphs,
                     compiled_fusions=compiled, notes=tuple(notes))


def compile_stance(fast: FastPaths):
    """Where the fusions are on but not compiled (the CPU), megatron-core's fused functions run
    uncompiled inside (compile_on_call.uncompiled); elsewhere nothing changes."""
    import contextlib

    from lockstep.runners.megatron.compile_on_call import uncompiled

    if fast.compiled_fusions or not (fast.bias_activation_fusion or fast.bias_dropout_fusion or fast.cross_entropy_fusion):
        return contextlib.nullcontext()
    return uncompiled()


def config_overrides(fast: FastPaths, adapter, model) -> dict:
    """TransformerConfig fields of the parts that are on (applied over model.py's unfused defaults)."""
    out: dict = {}
    if fast.bias_activation_fusion:
        out.update(adapter.fused_activation_overrides(model))
    if fast.bias_dropout_fusion:
        out["bias_dropout_fusion"] = True
    if fast.cross_entropy_fusion:
        # The worker computes the loss itself (loss_func); these say which one, as Megatron-LM's flags do.
        out.update(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="native")
    if fast.cuda_graphs:
        out.update(cuda_graph_impl="local", cuda_graph_scope=[])
    return out


def layer_spec(spec, fast: FastPaths):
    """The family's local layer spec with SDPA as its core attention (a copy; the family's is untouched)."""
    if not fast.sdpa_attention:
        return spec
    import copy

    spec = copy.deepcopy(spec)
    attention = spec.submodules.self_attention
    attention.submodules.core_attention = SDPAttention
    return spec


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, fused: bool) -> torch.Tensor:
    """Per-token loss [b, s] over vocab-parallel logits: megatron-core's fused function or its plain one."""
    from megatron.core import parallel_state, tensor_parallel

    if not fused:
        return tensor_parallel.vocab_parallel_cross_entropy(logits, labels)
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy

    return fused_vocab_parallel_cross_entropy(logits, labels, parallel_state.get_tensor_model_parallel_group())


def _module_base():
    from megatron.core.transformer.module import MegatronModule

    return MegatronModule


class SDPAttention(_module_base()):
    """megatron-core's core attention (DotProductAttention's constructor and forward) computed by
    torch's scaled_dot_product_attention.

    In: query [sq, b, np, hn], key and value [sk, b, ng, hn] (this TP rank's heads and query groups).
    Out: the context [sq, b, np * hn]. The mask megatron hands over is the causal mask the worker
    builds for every micro batch, so SDPA's `is_causal` stands for it (no [s, s] mask is read)."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None, **_unused):
        import math

        from megatron.core.transformer.enums import AttnMaskType

        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPAttention does not implement context parallelism")
        if attn_mask_type != AttnMaskType.causal:
            raise ValueError(f"SDPAttention computes causal attention only, not {attn_mask_type}")
        if getattr(config, "softmax_type", "vanilla") != "vanilla":
            raise ValueError("SDPAttention computes the vanilla softmax only")
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        head_dim = config.kv_channels
        self.softmax_scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
        if config.apply_query_key_layer_scaling:  # as DotProductAttention: 1/sqrt(hd) over the layer number
            self.softmax_scale /= self.layer_number

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **_unused):
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPAttention takes neither packed sequences nor an attention bias")
        heads, groups = query.size(2), key.size(2)
        if heads != groups:  # GQA: each query group's k, v serve its heads (megatron's repeat_interleave)
            key = key.repeat_interleave(heads // groups, dim=2)
            value = value.repeat_interleave(heads // groups, dim=2)
        # [s, b, n, hn] -> [b, n, s, hn]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                                 dropout_p=self.dropout_p if self.training else 0.0)
        sq, b = query.size(0), query.size(1)
        return context.permute(2, 0, 1, 3).reshape(sq, b, heads * query.size(3))
