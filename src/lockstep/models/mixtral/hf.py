"""Mixtral in Hugging Face's layout (`MixtralForCausalLM`) <-> the LLMC Mixtral v2 file.

- q_proj / k_proj: HF's rows are in half-split RoPE order (`rotate_half`); tiny_mixtral rotates
  interleaved pairs as Llama 3 does, so the rows are un-permuted per head, as for Llama 3
  (models/llama3/hf.py), then [Q; K; V] are stacked into qkvw.
- block_sparse_moe.gate -> routerw; expert e's w1 (gate) -> fcw2, w3 (up) -> fcw, w2 (down)
  -> fcprojw. This is the Hub's per-expert layout, the one Transformers 5 writes too.
- intermediate_size -> the expert width F (header word 16); ffn_expansion_ratio, which no MoE
  layer reads, is written as F / C (3.5 for tiny_mixtral's own shape).
- Router jitter, sliding-window attention and RoPE scaling have no place in the file: refused.
  router_aux_loss_coef is not stored: the family's contract sets the coefficient (0).
"""

from __future__ import annotations

import os

import numpy as np

from lockstep.errors import FormatError
from lockstep.formats.llmc import float32
from lockstep.models.family import HFAdapter, HFModel, HFOptions
from lockstep.models.hf_config import head_dim_problem, hf_float, hf_int, require, rope_theta, rope_type
from lockstep.models.llama3.hf import hf_to_interleaved, interleaved_to_hf, split_qkv
from lockstep.models.mixtral.config import MixtralConfig, expert_tensor

WHY = "the LLMC Mixtral format"
EXPERT_HF = {"fcw2": "w1", "fcw": "w3", "fcprojw": "w2"}  # LLMC role -> Mixtral expert matrix
LAYER_HF = {"ln1w": "input_layernorm", "ln2w": "post_attention_layernorm", "attprojw": "self_attn.o_proj",
            "routerw": "block_sparse_moe.gate"}


def read_config(cfg: dict, path: str | os.PathLike, options: HFOptions) -> HFModel:
    require(cfg, "hidden_act", ("silu",), path, "silu", WHY)
    require(cfg, "sliding_window", (None,), path, None, f"{WHY} (full attention in every layer)")
    require(cfg, "router_jitter_noise", (0, 0.0), path, 0.0, f"{WHY} (a deterministic router)")
    scaling = rope_type(cfg, path)
    if scaling != "default":
        raise FormatError(path, f"rope scaling of type {scaling!r} has no place in {WHY}")
    channels, heads = hf_int(cfg, "hidden_size", path), hf_int(cfg, "num_attention_heads", path)
    head_dim_problem(cfg, channels, heads, path)
    tied = bool(cfg.get("tie_word_embeddings", False))
    ffn = hf_int(cfg, "intermediate_size", path)
    config = MixtralConfig(
        max_seq_len=hf_int(cfg, "max_position_embeddings", path), vocab_size=hf_int(cfg, "vocab_size", path),
        num_layers=hf_int(cfg, "num_hidden_layers", path), num_heads=heads,
        num_kv_heads=hf_int(cfg, "num_key_value_heads", path, heads), channels=channels,
        num_experts=hf_int(cfg, "num_local_experts", path), router_topk=hf_int(cfg, "num_experts_per_tok", path),
        moe_ffn_hidden_size=ffn, ffn_expansion_ratio=float32(ffn / channels),
        norm_eps=hf_float(cfg, "rms_norm_eps", path, 1e-5), rope_theta=rope_theta(cfg, path, 1e6))
    problems = config.problems()
    if problems:
        raise FormatError(path, "describes a shape LLMC cannot hold: " + "; ".join(problems))
    notes = ["q_proj/k_proj rows un-permuted from HF's half-split RoPE order to interleaved pairs",
             f"intermediate_size {ffn} written as the expert width; ffn_expansion_ratio {config.ffn_expansion_ratio:g}",
             f"router_aux_loss_coef {cfg.get('router_aux_loss_coef', 0.001)} not stored: the contract's coefficient is 0"]
    if tied:
        notes.append("tied embeddings: model.embed_tokens written as lm_head too")
    return HFModel(config=config, tied=tied, notes=tuple(notes))


def tensor_shapes(model: HFModel) -> dict[str, tuple[int, ...]]:
    c = model.config
    C, hd, F = c.channels, c.head_dim, c.moe_ffn_hidden_size
    out = {"model.embed_tokens.weight": (c.vocab_size, C)}
    for layer in range(c.num_layers):
        p = f"model.layers.{layer}"
        out |= {f"{p}.input_layernorm.weight": (C,), f"{p}.self_attn.q_proj.weight": (c.num_heads * hd, C),
                f"{p}.self_attn.k_proj.weight": (c.num_kv_heads * hd, C),
                f"{p}.self_attn.v_proj.weight": (c.num_kv_heads * hd, C),
                f"{p}.self_attn.o_proj.weight": (C, c.num_heads * hd), f"{p}.post_attention_layernorm.weight": (C,),
                f"{p}.block_sparse_moe.gate.weight": (c.num_experts, C)}
        for e in range(c.num_experts):
            q = f"{p}.block_sparse_moe.experts.{e}"
            out |= {f"{q}.w1.weight": (F, C), f"{q}.w3.weight": (F, C), f"{q}.w2.weight": (C, F)}
    out["model.norm.weight"] = (C,)
    if not model.tied:
        out["lm_head.weight"] = (c.vocab_size, C)
    return out


def hf_name(model: HFModel, name: str) -> str | None:
    if name.endswith(".rotary_emb.inv_freq"):  # a buffer older checkpoints saved
        return None
    return None if model.tied and name == "lm_head.weight" else name


def parse(name: str) -> tuple[str, int | None, int | None]:
    """`expert5.fcw2[3]` -> ("fcw2", 3, 5); `qkvw[3]` -> ("qkvw", 3, None); `wte` -> ("wte", None, None)."""
    if "[" not in name:
        return name, None, None
    head, layer = name[:-1].split("[")
    if head.startswith("expert"):
        expert, role = head[len("expert"):].split(".")
        return role, int(layer), int(expert)
    return head, int(layer), None


def llmc_tensor(model: HFModel, name: str, layer: int | None, read) -> np.ndarray:
    c = model.config
    role, layer, expert = parse(name)
    if layer is None:
        if role == "lm_head":
            return read("model.embed_tokens.weight" if model.tied else "lm_head.weight")
        return read({"wte": "model.embed_tokens.weight", "lnfw": "model.norm.weight"}[role])
    p = f"model.layers.{layer}"
    if expert is not None:
        return read(f"{p}.block_sparse_moe.experts.{expert}.{EXPERT_HF[role]}.weight")
    if role in LAYER_HF:
        return read(f"{p}.{LAYER_HF[role]}.weight")
    assert role == "qkvw", name
    attn = f"{p}.self_attn"
    return np.concatenate([hf_to_interleaved(read(f"{attn}.q_proj.weight"), c.num_heads),
                           hf_to_interleaved(read(f"{attn}.k_proj.weight"), c.num_kv_heads),
                           read(f"{attn}.v_proj.weight")])


def to_hf(config: MixtralConfig, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {"model.embed_tokens.weight": tensors["wte"], "model.norm.weight": tensors["lnfw"],
           "lm_head.weight": tensors["lm_head"]}
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}"
        out |= {f"{p}.{hf}.weight": tensors[f"{role}[{layer}]"] for role, hf in LAYER_HF.items()}
        q, k, v = split_qkv(config, np.asarray(tensors[f"qkvw[{layer}]"]))
        out |= {f"{p}.self_attn.q_proj.weight": interleaved_to_hf(q, config.num_heads),
                f"{p}.self_attn.k_proj.weight": interleaved_to_hf(k, config.num_kv_heads),
                f"{p}.self_attn.v_proj.weight": v}
        for e in range(config.num_experts):
            out |= {f"{p}.block_sparse_moe.experts.{e}.{hf}.weight": tensors[expert_tensor(e, role, layer)]
                    for role, hf in EXPERT_HF.items()}
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def hf_config(config: MixtralConfig) -> dict:
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": config.vocab_size,
            "max_position_embeddings": config.max_seq_len, "hidden_size": config.channels,
            "intermediate_size": config.moe_ffn_hidden_size, "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
            "head_dim": config.head_dim, "hidden_act": "silu", "rms_norm_eps": config.norm_eps,
            "rope_theta": config.rope_theta, "rope_scaling": None, "sliding_window": None,
            "num_local_experts": config.num_experts, "num_experts_per_tok": config.router_topk,
            "router_jitter_noise": 0.0, "router_aux_loss_coef": 0.0, "output_router_logits": False,
            "tie_word_embeddings": False, "torch_dtype": "float32"}


ADAPTER = HFAdapter(model_types=("mixtral",), read_config=read_config, tensor_shapes=tensor_shapes, hf_name=hf_name,
                    llmc_tensor=llmc_tensor, to_hf=to_hf, hf_config=hf_config)
