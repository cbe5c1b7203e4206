"""GPT-2 in Hugging Face's layout (`GPT2LMHeadModel`) <-> llm.c's LLMC GPT-2 file.

What llm.c's `train_gpt2.py` does when it writes `gpt2_124M.bin` from the pretrained model:
- HF's attention and MLP weights are `Conv1D` (stored (in, out), used as x @ W); LLMC stores
  nn.Linear's (out, in): c_attn, attn.c_proj, c_fc and mlp.c_proj are transposed. Biases and
  LayerNorms are copied. c_attn's columns are already [Q; K; V], LLMC's row order.
- wte gets zero rows up to Vp, V rounded up to a multiple of 128 (50257 -> 50304).
- The head is tied to wte: the file has no lm_head.
Hub checkpoints name tensors without the `transformer.` prefix that `save_pretrained` writes
today; both are read. The causal-mask buffers some files hold (`attn.bias`, `attn.masked_bias`)
are skipped.
"""

from __future__ import annotations

import os

import numpy as np

from lockstep.errors import FormatError
from lockstep.models.family import HFAdapter, HFModel, HFOptions
from lockstep.models.gpt2.config import GPT2Config
from lockstep.models.hf_config import hf_float, hf_int, require

PREFIX = "transformer."
VOCAB_MULTIPLE = 128  # llm.c's pad_vocab
LN_EPS = 1e-5  # the reference's LayerNorm eps (models/gpt2/model.py)
BUFFERS = (".attn.bias", ".attn.masked_bias")
# (LLMC name, HF name inside block i, transposed from Conv1D)
LAYER_TENSORS = (
    ("ln1w", "ln_1.weight", False), ("ln1b", "ln_1.bias", False),
    ("qkvw", "attn.c_attn.weight", True), ("qkvb", "attn.c_attn.bias", False),
    ("attprojw", "attn.c_proj.weight", True), ("attprojb", "attn.c_proj.bias", False),
    ("ln2w", "ln_2.weight", False), ("ln2b", "ln_2.bias", False),
    ("fcw", "mlp.c_fc.weight", True), ("fcb", "mlp.c_fc.bias", False),
    ("fcprojw", "mlp.c_proj.weight", True), ("fcprojb", "mlp.c_proj.bias", False),
)
GLOBAL_TENSORS = {"wte": "transformer.wte.weight", "wpe": "transformer.wpe.weight",
                  "lnfw": "transformer.ln_f.weight", "lnfb": "transformer.ln_f.bias"}


def padded_vocab(vocab_size: int) -> int:
    return VOCAB_MULTIPLE * ((vocab_size + VOCAB_MULTIPLE - 1) // VOCAB_MULTIPLE)


def read_config(cfg: dict, path: str | os.PathLike, options: HFOptions) -> HFModel:
    why = "lockstep's GPT-2 (llm.c's)"
    channels = hf_int(cfg, "n_embd", path)
    inner = cfg.get("n_inner")
    if inner is not None and inner != 4 * channels:
        raise FormatError(path, f"n_inner is {inner!r}; the LLMC GPT-2 format holds an MLP of 4*n_embd = {4 * channels}")
    # gelu_new is the tanh approximation the reference uses; gelu_pytorch_tanh is the same function.
    require(cfg, "activation_function", ("gelu_new", "gelu_pytorch_tanh"), path, "gelu_new", why)
    eps = hf_float(cfg, "layer_norm_epsilon", path, LN_EPS)
    if eps != LN_EPS:
        raise FormatError(path, f"layer_norm_epsilon is {eps:g}; {why} uses {LN_EPS:g}")
    require(cfg, "scale_attn_weights", (True,), path, True, why)
    require(cfg, "scale_attn_by_inverse_layer_idx", (False,), path, False, why)
    require(cfg, "tie_word_embeddings", (True,), path, True, "the LLMC GPT-2 format (no lm_head tensor)")
    vocab = hf_int(cfg, "vocab_size", path)
    config = GPT2Config(max_seq_len=hf_int(cfg, "n_positions", path), vocab_size=vocab,
                        num_layers=hf_int(cfg, "n_layer", path), num_heads=hf_int(cfg, "n_head", path),
                        channels=channels, padded_vocab_size=padded_vocab(vocab))
    problems = config.problems()
    if problems:
        raise FormatError(path, "describes a shape LLMC cannot hold: " + "; ".join(problems))
    notes = ["Conv1D weights (c_attn, attn.c_proj, c_fc, mlp.c_proj) transposed to nn.Linear's (out, in)"]
    if config.padded_vocab_size != vocab:
        notes.append(f"wte padded with zero rows from V={vocab} to Vp={config.padded_vocab_size}, as llm.c does")
    return HFModel(config=config, tied=True, notes=tuple(notes))


def tensor_shapes(model: HFModel) -> dict[str, tuple[int, ...]]:
    c: GPT2Config = model.config
    C = c.channels
    out = {"transformer.wte.weight": (c.vocab_size, C), "transformer.wpe.weight": (c.max_seq_len, C)}
    hf_shapes = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (C, 3 * C), "attn.c_attn.bias": (3 * C,),
                 "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
                 "mlp.c_fc.weight": (C, 4 * C), "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.weight": (4 * C, C),
                 "mlp.c_proj.bias": (C,)}
    for layer in range(c.num_layers):
        out |= {f"transformer.h.{layer}.{k}": v for k, v in hf_shapes.items()}
    return out | {"transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)}


def hf_name(model: HFModel, name: str) -> str | None:
    if name.endswith(BUFFERS) or name == "lm_head.weight":  # the mask; the head is wte
        return None
    return name if name.startswith(PREFIX) else PREFIX + name


def llmc_tensor(model: HFModel, name: str, layer: int | None, read) -> np.ndarray:
    c: GPT2Config = model.config
    if layer is None:
        t = read(GLOBAL_TENSORS[name])
        if name == "wte":
            padded = np.zeros((c.padded_vocab_size, c.channels), dtype=np.float32)
            padded[: c.vocab_size] = t
            return padded
        return t
    hf, transposed = next((hf, tr) for llmc, hf, tr in LAYER_TENSORS if llmc == name)
    t = read(f"transformer.h.{layer}.{hf}")
    return np.ascontiguousarray(t.T) if transposed else t


def to_hf(config: GPT2Config, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """LLMC tensors -> HF state dict (wte's padding rows dropped; no lm_head: HF ties it)."""
    out = {hf: np.asarray(tensors[llmc]) for llmc, hf in GLOBAL_TENSORS.items()}
    out["transformer.wte.weight"] = np.asarray(tensors["wte"][: config.vocab_size])
    for layer in range(config.num_layers):
        for llmc, hf, transposed in LAYER_TENSORS:
            t = np.asarray(tensors[llmc][layer])
            out[f"transformer.h.{layer}.{hf}"] = np.ascontiguousarray(t.T) if transposed else t
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def hf_config(config: GPT2Config) -> dict:
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": config.vocab_size,
            "n_positions": config.max_seq_len, "n_embd": config.channels, "n_layer": config.num_layers,
            "n_head": config.num_heads, "n_inner": None, "activation_function": "gelu_new",
            "layer_norm_epsilon": LN_EPS, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False, "tie_word_embeddings": True, "torch_dtype": "float32"}


ADAPTER = HFAdapter(model_types=("gpt2",), read_config=read_config, tensor_shapes=tensor_shapes, hf_name=hf_name,
                    llmc_tensor=llmc_tensor, to_hf=to_hf, hf_config=hf_config)
