"""Llama 3 in Hugging Face's layout (`LlamaForCausalLM`) <-> the LLMC Llama 3 file.

- q_proj / k_proj: Hugging Face's conversion script permuted Meta's rows so that each head's
  RoPE pairs are (i, i + hd/2) for its `rotate_half`; LLMC keeps Meta's order, pairs (2i, 2i+1),
  which lockstep's reference, InfiniTrain and llm.c rotate. The rows are un-permuted per head
  (llm.c's `train_llama3.py` does the same), then [Q; K; V] are stacked into qkvw.
- MLP: up_proj -> fcw (c_fc), gate_proj -> fcw2 (c_fc2), down_proj -> fcprojw.
- The header has no intermediate size: it stores Meta's ffn_dim_multiplier and multiple_of, from
  which every reader computes it (docs/reference/formats.md#llama-3-magic-20240803-version-3).
  `ffn_header` picks the pair Meta published for the model's width where one reproduces intermediate_size, else an exact one.
- rope_scaling of type llama3 (Llama 3.1, 3.2) -> use_scaled_rope 1, as llm.c writes it; the
  header has no room for the factor, and readers apply Llama 3.1's constants.
- A tied checkpoint (Llama 3.2 1B / 3B) stores no lm_head: the embedding is written as the head.
"""

from __future__ import annotations

import math
import os

import numpy as np

from lockstep.errors import FormatError
from lockstep.models.family import HFAdapter, HFModel, HFOptions
from lockstep.models.hf_config import head_dim_problem, hf_float, hf_int, require, rope_parameters, rope_theta, rope_type
from lockstep.models.llama3.config import Llama3Config, llama3_ffn_hidden

# (ffn_dim_multiplier, multiple_of) of Meta's params.json for Llama 3.x by (C, intermediate size):
# 3.2 1B, 3.2 3B, 3.1 8B, 70B, 405B. Other shapes try these pairs in this order, and take the
# first that gives their intermediate size (70B's is also reached by (1.3, 1024), hence the table).
META_FFN_PARAMETERS = {(2048, 8192): (1.5, 256), (3072, 8192): (1.0, 256), (4096, 14336): (1.3, 1024),
                       (8192, 28672): (1.3, 4096), (16384, 53248): (1.2, 4096)}
# What llm.c (and, following it, the LLMC readers) apply for use_scaled_rope: Llama 3.1's.
LLMC_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}
ROLES = ("ln1w", "qkvw", "attprojw", "ln2w", "fcw", "fcw2", "fcprojw")
MLP = {"fcw": "mlp.up_proj", "fcw2": "mlp.gate_proj", "fcprojw": "mlp.down_proj"}


def ffn_header(channels: int, intermediate_size: int) -> tuple[float, int] | None:
    """(ffn_dim_multiplier, multiple_of) whose FFN formula (formats.md) gives `intermediate_size` at width C,
    Meta's own values first; None when no pair can (intermediate_size below 1)."""
    known = META_FFN_PARAMETERS.get((channels, intermediate_size))
    if known is not None:
        return known
    for multiplier, multiple_of in dict.fromkeys(META_FFN_PARAMETERS.values()):
        if llama3_ffn_hidden(channels, multiplier, multiple_of) == intermediate_size:
            return multiplier, multiple_of
    base = int(2 * 4 * channels / 3)
    if intermediate_size < 1 or base < 1:
        return None
    # The exact ratio, stored as float32: llround(m * base) is then intermediate_size (the float32
    # error, ~6e-8 relative, is far below the 0.5 llround forgives), and any multiple_of that
    # divides it leaves it unchanged.
    multiplier = float(np.float32(intermediate_size / base))
    multiple_of = math.gcd(intermediate_size, 256)
    if llama3_ffn_hidden(channels, multiplier, multiple_of) == intermediate_size:
        return multiplier, multiple_of
    return None


def hf_to_interleaved(w: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows of each head from HF's half-split order back to Meta's interleaved pairs."""
    rows, cols = w.shape
    hd = rows // heads
    return np.ascontiguousarray(w.reshape(heads, 2, hd // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols))


def interleaved_to_hf(w: np.ndarray, heads: int) -> np.ndarray:
    rows, cols = w.shape
    hd = rows // heads
    return np.ascontiguousarray(w.reshape(heads, hd // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols))


def check_common(cfg: dict, path: str | os.PathLike, why: str) -> None:
    """What Llama 3 and Qwen3 checkpoints must share to have an LLMC form."""
    require(cfg, "hidden_act", ("silu",), path, "silu", why)
    require(cfg, "attention_bias", (False,), path, False, f"{why} (no biases)")
    require(cfg, "mlp_bias", (False,), path, False, f"{why} (no biases)")


def read_config(cfg: dict, path: str | os.PathLike, options: HFOptions) -> HFModel:
    check_common(cfg, path, "the LLMC Llama 3 format")
    channels, heads = hf_int(cfg, "hidden_size", path), hf_int(cfg, "num_attention_heads", path)
    head_dim_problem(cfg, channels, heads, path)
    intermediate = hf_int(cfg, "intermediate_size", path)
    ffn = ffn_header(channels, intermediate)
    if ffn is None:
        raise FormatError(path, f"intermediate_size {intermediate} cannot be written as an LLMC Llama 3 header's "
                                f"ffn_dim_multiplier and multiple_of at hidden_size {channels}")
    notes = ["q_proj/k_proj rows un-permuted from HF's half-split RoPE order to Meta's interleaved pairs"]
    scaling = rope_type(cfg, path)
    if scaling not in ("default", "llama3"):
        raise FormatError(path, f"rope scaling of type {scaling!r} has no LLMC form (the Llama 3 header holds only "
                                "use_scaled_rope, Llama 3.1's llama3 scaling)")
    use_scaled_rope = scaling == "llama3" and not options.drop_rope_scaling
    if scaling == "llama3":
        factor = rope_parameters(cfg).get("factor")
        if options.drop_rope_scaling:
            notes.append(f"rope_scaling (llama3, factor {factor}) dropped (--no-rope-scaling): use_scaled_rope 0, "
                         "plain RoPE as lockstep's frameworks train it; the logits differ from the pretrained model's")
        else:
            notes.append(f"rope_scaling (llama3, factor {factor}) written as use_scaled_rope 1: LLMC readers apply "
                         "Llama 3.1's factor 8; lockstep run refuses such a file (convert with --no-rope-scaling "
                         "to train it)")
    tied = bool(cfg.get("tie_word_embeddings", False))
    if tied:
        notes.append("tied embeddings: model.embed_tokens written as lm_head too")
    config = Llama3Config(
        max_seq_len=hf_int(cfg, "max_position_embeddings", path), vocab_size=hf_int(cfg, "vocab_size", path),
        num_layers=hf_int(cfg, "num_hidden_layers", path), num_heads=heads,
        num_kv_heads=hf_int(cfg, "num_key_value_heads", path, heads), channels=channels,
        ffn_dim_multiplier=ffn[0], multiple_of=ffn[1], norm_eps=hf_float(cfg, "rms_norm_eps", path, 1e-6),
        rope_theta=rope_theta(cfg, path, 10000.0), use_scaled_rope=use_scaled_rope)
    problems = config.problems()
    if problems:
        raise FormatError(path, "describes a shape LLMC cannot hold: " + "; ".join(problems))
    notes.insert(1, f"intermediate_size {intermediate} written as ffn_dim_multiplier {ffn[0]:g}, multiple_of {ffn[1]}")
    return HFModel(config=config, tied=tied, notes=tuple(notes))


def layer_shapes(c, prefix: str) -> dict[str, tuple[int, ...]]:
    """One decoder layer's tensors, as Llama 3 and Qwen3 checkpoints store them."""
    C, hd, F = c.channels, c.head_dim, c.ffn_hidden
    return {f"{prefix}.input_layernorm.weight": (C,), f"{prefix}.self_attn.q_proj.weight": (c.num_heads * hd, C),
            f"{prefix}.self_attn.k_proj.weight": (c.num_kv_heads * hd, C),
            f"{prefix}.self_attn.v_proj.weight": (c.num_kv_heads * hd, C),
            f"{prefix}.self_attn.o_proj.weight": (C, c.num_heads * hd), f"{prefix}.post_attention_layernorm.weight": (C,),
            f"{prefix}.mlp.gate_proj.weight": (F, C), f"{prefix}.mlp.up_proj.weight": (F, C),
            f"{prefix}.mlp.down_proj.weight": (C, F)}


def decoder_shapes(model: HFModel, layer_shapes=layer_shapes) -> dict[str, tuple[int, ...]]:
    c = model.config
    out = {"model.embed_tokens.weight": (c.vocab_size, c.channels)}
    for layer in range(c.num_layers):
        out |= layer_shapes(c, f"model.layers.{layer}")
    out["model.norm.weight"] = (c.channels,)
    if not model.tied:
        out["lm_head.weight"] = (c.vocab_size, c.channels)
    return out


def tensor_shapes(model: HFModel) -> dict[str, tuple[int, ...]]:
    return decoder_shapes(model)


def hf_name(model: HFModel, name: str) -> str | None:
    if name.endswith(".rotary_emb.inv_freq"):  # a buffer older checkpoints saved
        return None
    if model.tied and name == "lm_head.weight":  # Transformers ties it to the embedding on load
        return None
    return name


def shared_tensor(model: HFModel, name: str, layer: int | None, read) -> np.ndarray | None:
    """The tensors Llama 3 and Qwen3 map alike; None for qkvw (and Qwen3's qknormw)."""
    if layer is None:
        if name == "lm_head":
            return read("model.embed_tokens.weight" if model.tied else "lm_head.weight")
        return read({"wte": "model.embed_tokens.weight", "lnfw": "model.norm.weight"}[name])
    prefix = f"model.layers.{layer}"
    if name == "ln1w":
        return read(f"{prefix}.input_layernorm.weight")
    if name == "ln2w":
        return read(f"{prefix}.post_attention_layernorm.weight")
    if name == "attprojw":
        return read(f"{prefix}.self_attn.o_proj.weight")
    if name in MLP:
        return read(f"{prefix}.{MLP[name]}.weight")
    return None


def llmc_tensor(model: HFModel, name: str, layer: int | None, read) -> np.ndarray:
    t = shared_tensor(model, name, layer, read)
    if t is not None:
        return t
    c, attn = model.config, f"model.layers.{layer}.self_attn"
    assert name == "qkvw", name
    return np.concatenate([hf_to_interleaved(read(f"{attn}.q_proj.weight"), c.num_heads),
                           hf_to_interleaved(read(f"{attn}.k_proj.weight"), c.num_kv_heads),
                           read(f"{attn}.v_proj.weight")])


def split_qkv(config, qkv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q_rows, kv_rows = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return qkv[:q_rows], qkv[q_rows : q_rows + kv_rows], qkv[q_rows + kv_rows :]


def shared_to_hf(config, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Everything but q/k/v (and Qwen3's q/k norms), LLMC -> HF; the head is always written."""
    out = {"model.embed_tokens.weight": tensors["wte"], "model.norm.weight": tensors["lnfw"],
           "lm_head.weight": tensors["lm_head"]}
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}"
        out |= {f"{p}.input_layernorm.weight": tensors["ln1w"][layer],
                f"{p}.post_attention_layernorm.weight": tensors["ln2w"][layer],
                f"{p}.self_attn.o_proj.weight": tensors["attprojw"][layer]}
        out |= {f"{p}.{hf}.weight": tensors[llmc][layer] for llmc, hf in MLP.items()}
    return out


def to_hf(config: Llama3Config, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = shared_to_hf(config, tensors)
    for layer in range(config.num_layers):
        q, k, v = split_qkv(config, np.asarray(tensors["qkvw"][layer]))
        attn = f"model.layers.{layer}.self_attn"
        out |= {f"{attn}.q_proj.weight": interleaved_to_hf(q, config.num_heads),
                f"{attn}.k_proj.weight": interleaved_to_hf(k, config.num_kv_heads), f"{attn}.v_proj.weight": v}
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def hf_config(config: Llama3Config) -> dict:
    out = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": config.vocab_size,
           "max_position_embeddings": config.max_seq_len, "hidden_size": config.channels,
           "intermediate_size": config.ffn_hidden, "num_hidden_layers": config.num_layers,
           "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
           "head_dim": config.head_dim, "hidden_act": "silu", "rms_norm_eps": config.norm_eps,
           "rope_theta": config.rope_theta, "rope_scaling": dict(LLMC_ROPE_SCALING) if config.use_scaled_rope else None,
           "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "torch_dtype": "float32"}
    return out


ADAPTER = HFAdapter(model_types=("llama",), read_config=read_config, tensor_shapes=tensor_shapes, hf_name=hf_name,
                    llmc_tensor=llmc_tensor, to_hf=to_hf, hf_config=hf_config)
