"""Qwen3 in Hugging Face's layout (`Qwen3ForCausalLM`) <-> the LLMC Qwen3 v4 file.

As InfiniTrain-Test's `convert_hf_qwen3_to_llmc.py` lays it out
(docs/reference/formats.md#qwen3-magic-20240804-version-4): Qwen3 rotates
half-split pairs, HF's own order, so q/k rows are copied as they are (no permutation, unlike
Llama 3); each layer's q_norm and k_norm become its (2, hd) qknormw; gate_proj -> fcw2, up_proj
-> fcw, down_proj -> fcprojw; the header stores intermediate_size itself. A tied checkpoint
(Qwen3-0.6B/1.7B/4B) stores no lm_head: the embedding is written as the head. The v4 layout
derives head_dim as C/NH, so a model whose head_dim differs (Qwen3-0.6B, 4B, 32B) is refused.
"""

from __future__ import annotations

import os

import numpy as np

from lockstep.errors import FormatError
from lockstep.models.family import HFAdapter, HFModel, HFOptions
from lockstep.models.hf_config import head_dim_problem, hf_float, hf_int, require, rope_theta, rope_type
from lockstep.models.llama3.hf import check_common, decoder_shapes, layer_shapes, shared_tensor, shared_to_hf, split_qkv
from lockstep.models.qwen3.config import Qwen3Config

WHY = "the LLMC Qwen3 format"


def read_config(cfg: dict, path: str | os.PathLike, options: HFOptions) -> HFModel:
    check_common(cfg, path, WHY)
    require(cfg, "use_sliding_window", (False,), path, False, f"{WHY} (full attention in every layer)")
    scaling = rope_type(cfg, path)
    if scaling != "default":
        raise FormatError(path, f"rope scaling of type {scaling!r} has no place in {WHY}")
    channels, heads = hf_int(cfg, "hidden_size", path), hf_int(cfg, "num_attention_heads", path)
    head_dim_problem(cfg, channels, heads, path)
    tied = bool(cfg.get("tie_word_embeddings", False))
    config = Qwen3Config(
        max_seq_len=hf_int(cfg, "max_position_embeddings", path), vocab_size=hf_int(cfg, "vocab_size", path),
        num_layers=hf_int(cfg, "num_hidden_layers", path), num_heads=heads,
        num_kv_heads=hf_int(cfg, "num_key_value_heads", path, heads), channels=channels,
        intermediate_size=hf_int(cfg, "intermediate_size", path), norm_eps=hf_float(cfg, "rms_norm_eps", path, 1e-6),
        rope_theta=rope_theta(cfg, path, 10000.0))
    problems = config.problems()
    if problems:
        raise FormatError(path, "describes a shape LLMC cannot hold: " + "; ".join(problems))
    notes = ["q/k/v rows copied in HF's order (Qwen3 rotates half-split pairs: no permutation)",
             "q_norm/k_norm of each layer written as its (2, head_dim) qknormw"]
    if tied:
        notes.append("tied embeddings: model.embed_tokens written as lm_head too")
    return HFModel(config=config, tied=tied, notes=tuple(notes))


def qwen3_layer_shapes(c, prefix: str) -> dict[str, tuple[int, ...]]:
    return layer_shapes(c, prefix) | {f"{prefix}.self_attn.q_norm.weight": (c.head_dim,),
                                      f"{prefix}.self_attn.k_norm.weight": (c.head_dim,)}


def tensor_shapes(model: HFModel) -> dict[str, tuple[int, ...]]:
    return decoder_shapes(model, qwen3_layer_shapes)


def hf_name(model: HFModel, name: str) -> str | None:
    return None if model.tied and name == "lm_head.weight" else name


def llmc_tensor(model: HFModel, name: str, layer: int | None, read) -> np.ndarray:
    t = shared_tensor(model, name, layer, read)
    if t is not None:
        return t
    attn = f"model.layers.{layer}.self_attn"
    if name == "qknormw":
        return np.stack([read(f"{attn}.q_norm.weight"), read(f"{attn}.k_norm.weight")])
    assert name == "qkvw", name
    return np.concatenate([read(f"{attn}.{p}_proj.weight") for p in "qkv"])


def to_hf(config: Qwen3Config, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = shared_to_hf(config, tensors)
    for layer in range(config.num_layers):
        attn = f"model.layers.{layer}.self_attn"
        q, k, v = split_qkv(config, np.asarray(tensors["qkvw"][layer]))
        norms = np.asarray(tensors["qknormw"][layer])
        out |= {f"{attn}.q_proj.weight": q, f"{attn}.k_proj.weight": k, f"{attn}.v_proj.weight": v,
                f"{attn}.q_norm.weight": norms[0], f"{attn}.k_norm.weight": norms[1]}
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def hf_config(config: Qwen3Config) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": config.vocab_size,
            "max_position_embeddings": config.max_seq_len, "hidden_size": config.channels,
            "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
            "head_dim": config.head_dim, "hidden_act": "silu", "rms_norm_eps": config.norm_eps,
            "rope_theta": config.rope_theta, "rope_scaling": None, "attention_bias": False,
            "use_sliding_window": False, "tie_word_embeddings": False, "torch_dtype": "float32"}


ADAPTER = HFAdapter(model_types=("qwen3",), read_config=read_config, tensor_shapes=tensor_shapes, hf_name=hf_name,
                    llmc_tensor=llmc_tensor, to_hf=to_hf, hf_config=hf_config)
