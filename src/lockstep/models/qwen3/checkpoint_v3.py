"""The Qwen3 LLMC layout that InfiniTrain's branch `feat/add_Qwen3-8B` (a3f84f8) reads: magic 20240804, version 3.

Written only for an InfiniTrain build whose `qwen3` executable asks for version 3 (the runner
probes it); lockstep's own Qwen3 file stays version 4 (checkpoint.py). What the branch's loader
(example/qwen3/checkpoint_loader.cc) reads, and so what is written here:

- Header words [0..15] (docs/reference/formats.md#qwen3-magic-20240804-version-3): 20240804, 3,
  max seq len, V, L, NH, n_kv_head, C, ffn_dim_multiplier (float32 bits; 0.0, so the loader
  leaves the multiplier unset), multiple_of 1, RMSNorm eps (float32 bits, every norm and the
  Q/K norms), rope_theta (float32 bits), use_scaled_rope 0, max_gen_bs 4, 1, 0 -- the words the
  branch's own converter (scripts/convert_hf_qwen3_to_llmc.py) writes. There is no
  intermediate size: the loader reads I = int(C·4.5·2/3) rows per MLP matrix and the model
  builds int(2·int(C·4.5)/3), so only shapes with I equal to both can be written.
- Tensors FP32, grouped by kind across layers, in the loader's order: wte, ln1w, the Q/K norms
  (per layer q_norm then k_norm, hd each), qkvw `[Q;K;V]`, attprojw, ln2w, c_fc, c_fc2,
  fcprojw, lnfw, lm_head. Its MLP is `c_proj(c_fc(x) · silu(c_fc2(x)))`, so c_fc is Qwen3's up
  projection (fcw) and c_fc2 its gate (fcw2) -- the reverse of version 4's gate-then-up order.
- Its attention rotates *interleaved* RoPE pairs (causal_self_attention.cc, ApplyRotaryEmbedding:
  even/odd dims), Qwen3 rotates half-split pairs. So the Q and K rows of every head, and the
  Q/K-norm weights with them, are stored permuted to interleaved order (as a Llama 3 file stores
  them): the build then computes exactly Qwen3's attention (RMSNorm over a head is indifferent to
  the order of its dims; q·k is the same sum when both are permuted alike).
"""

from __future__ import annotations

import os

import numpy as np

from lockstep.errors import FormatError
from lockstep.formats.llmc import HEADER_INTS, CheckpointLayout, float_bits, write_checkpoint
from lockstep.models.llama3.hf import hf_to_interleaved
from lockstep.models.qwen3.checkpoint import QWEN3_MAGIC
from lockstep.models.qwen3.config import Qwen3Config

VERSION_A3F84F8 = 3
# Words [12..15] as the branch's converter writes them: use_scaled_rope, max_gen_bs, version major, minor.
TRAILING_WORDS = (0, 4, 1, 0)
MULTIPLE_OF = 1


def loader_ffn_hidden(channels: int) -> int:
    """The MLP rows the branch's loader reads: `int64_t(double(n_embd) * 4.5 * 2.0 / 3.0)`."""
    return int(channels * 4.5 * 2.0 / 3.0)


def model_ffn_hidden(channels: int) -> int:
    """The MLP width its TransformerModel builds (mlp.cc, ffn_expansion_ratio 4.5, SwiGLU, multiple_of 1)."""
    return (2 * int(channels * np.float32(4.5))) // 3


def v3_problems(config: Qwen3Config) -> list[str]:
    """Why this shape cannot be written as version 3; empty when it can."""
    out = list(config.problems())
    loader, model = loader_ffn_hidden(config.channels), model_ffn_hidden(config.channels)
    if not (config.intermediate_size == loader == model):
        out.append(f"the version-3 header has no intermediate size: its reader takes I = {loader} (and its model "
                   f"builds {model}) for C={config.channels}, but this shape has I={config.intermediate_size}")
    return out


def v3_tensor_shapes(config: Qwen3Config) -> list[tuple[str, tuple[int, ...]]]:
    """The loader's order, under lockstep's tensor names: up (fcw) before gate (fcw2)."""
    shapes = dict(config.tensor_shapes())
    order = ("wte", "ln1w", "qknormw", "qkvw", "attprojw", "ln2w", "fcw", "fcw2", "fcprojw", "lnfw", "lm_head")
    return [(name, shapes[name]) for name in order]


def encode_header_v3(config: Qwen3Config) -> np.ndarray:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:16] = [QWEN3_MAGIC, VERSION_A3F84F8, config.max_seq_len, config.vocab_size, config.num_layers,
                   config.num_heads, config.num_kv_heads, config.channels, float_bits(0.0), MULTIPLE_OF,
                   float_bits(config.norm_eps), float_bits(config.rope_theta), *TRAILING_WORDS]
    return header


def interleaved_rope_tensors(config: Qwen3Config, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The Q/K rows of every head and the Q/K-norm weights from half-split to interleaved pair order."""
    nh, kv, hd = config.num_heads, config.num_kv_heads, config.head_dim
    qkv = np.array(tensors["qkvw"], dtype=np.float32)  # (L, (NH+2kv)·hd, C), a copy
    norms = np.array(tensors["qknormw"], dtype=np.float32)  # (L, 2, hd)
    for layer in range(config.num_layers):
        qkv[layer, : nh * hd] = hf_to_interleaved(qkv[layer, : nh * hd], nh)
        qkv[layer, nh * hd : (nh + kv) * hd] = hf_to_interleaved(qkv[layer, nh * hd : (nh + kv) * hd], kv)
        norms[layer] = hf_to_interleaved(norms[layer].T, 1).T  # each row one head's hd weights
    return {**tensors, "qkvw": qkv, "qknormw": norms}


def write_v3(path: str | os.PathLike, config: Qwen3Config, tensors: dict[str, np.ndarray]) -> None:
    """Qwen3 weights (lockstep's LLMC tensors, stacked over layers) as the a3f84f8 loader reads them."""
    problems = v3_problems(config)
    if problems:
        raise FormatError(path, "cannot write this Qwen3 shape as version 3: " + "; ".join(problems))
    layout = CheckpointLayout(version=VERSION_A3F84F8, config=config, dtype="fp32")
    write_checkpoint(path, encode_header_v3(config), layout, interleaved_rope_tensors(config, tensors),
                     order=v3_tensor_shapes(config))
