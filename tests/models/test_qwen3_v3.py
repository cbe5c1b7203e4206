"""The Qwen3 LLMC version-3 layout that InfiniTrain's branch feat/add_Qwen3-8B (a3f84f8) reads.

Exact header words, the file's sha256 for fixed tensors, every tensor found where the branch's
loader (example/qwen3/checkpoint_loader.cc) reads it -- re-read here in its order, not lockstep's --
and the file's meaning: the model that branch builds (interleaved RoPE, Q/K norm, c_fc · silu(c_fc2))
run on the re-read tensors gives the logits of lockstep's Qwen3 reference on the original ones,
within 1e-5. Shapes whose intermediate size the header cannot say are refused.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lockstep.errors import FormatError
from lockstep.fsutil import sha256_file
from lockstep.models.llama3.model import causal_attention, rope_angles, rope_interleaved
from lockstep.models.qwen3.checkpoint_v3 import v3_problems, write_v3
from lockstep.models.qwen3.config import Qwen3Config
from lockstep.models.qwen3.model import Qwen3

# I = 3C, the only intermediate size a version-3 reader builds (int(C·4.5·2/3)).
SMALL = Qwen3Config(max_seq_len=32, vocab_size=96, num_layers=2, num_heads=4, num_kv_heads=2, channels=32,
                    intermediate_size=96)
# sha256 of write_v3(SMALL, fixed_tensors(SMALL)); change on purpose only.
GOLDEN_SMALL_V3 = "032e50096181fe7372404142461d68bb543b78e8182e8ab8cdb05fa8911ce241"


def f32_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def fixed_tensors(c: Qwen3Config) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    out = {name: (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.2)) for name, shape in c.tensor_shapes()}
    for norm in ("ln1w", "ln2w", "lnfw", "qknormw"):  # near 1, and every element distinct
        out[norm] = np.float32(1.0) + out[norm] * np.float32(0.5)
    return out


def read_like_the_a3f84f8_loader(path, c: Qwen3Config) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The branch's LoadFromLLMC at TP=PP=1, transcribed: its header words, then its reads in order."""
    L, C, V, NH, KV = c.num_layers, c.channels, c.vocab_size, c.num_heads, c.num_kv_heads
    hd = C // NH
    ffn = int(C * 4.5 * 2.0 / 3.0)  # ffn_hidden, hard-coded in the loader
    raw = np.fromfile(path, dtype="<f4", offset=1024)
    pos = 0

    def take(*shape):
        nonlocal pos
        n = math.prod(shape)
        out = raw[pos : pos + n].reshape(shape)
        pos += n
        return out

    t = {"wte": take(V, C), "ln_1": take(L, C)}
    norms = take(L, 2, hd)  # per layer: q_norm (hd) then k_norm (hd)
    t["q_norm"], t["k_norm"] = norms[:, 0], norms[:, 1]
    t |= {"c_attn": take(L, (NH + 2 * KV) * hd, C), "attn.c_proj": take(L, C, C), "ln_2": take(L, C),
          "c_fc": take(L, ffn, C), "c_fc2": take(L, ffn, C), "mlp.c_proj": take(L, C, ffn), "ln_f": take(C),
          "lm_head": take(V, C)}
    assert pos == raw.size, "the file holds more than the loader reads"
    return np.fromfile(path, dtype="<i4", count=256), t


def a3f84f8_logits(t: dict[str, np.ndarray], c: Qwen3Config, idx: torch.Tensor) -> torch.Tensor:
    """The forward that branch builds: RMSNorm, QK-norm then RoPE on (2i, 2i+1) pairs
    (causal_self_attention.cc), GQA, c_proj(c_fc(x) · silu(c_fc2(x))) (mlp.cc), untied head."""
    g = {k: torch.from_numpy(np.array(v)) for k, v in t.items()}
    NH, KV, hd, eps = c.num_heads, c.num_kv_heads, c.channels // c.num_heads, c.norm_eps
    B, T = idx.shape
    cos, sin = rope_angles(hd, T, c.rope_theta, idx.device)
    x = g["wte"][idx]
    for i in range(c.num_layers):
        h = F.rms_norm(x, (c.channels,), g["ln_1"][i], eps)
        q, k, v = (h @ g["c_attn"][i].T).split([NH * hd, KV * hd, KV * hd], dim=-1)
        q = rope_interleaved(F.rms_norm(q.view(B, T, NH, hd), (hd,), g["q_norm"][i], eps), cos, sin)
        k = rope_interleaved(F.rms_norm(k.view(B, T, KV, hd), (hd,), g["k_norm"][i], eps), cos, sin)
        x = x + causal_attention(q, k, v.view(B, T, KV, hd)) @ g["attn.c_proj"][i].T
        h = F.rms_norm(x, (c.channels,), g["ln_2"][i], eps)
        x = x + ((h @ g["c_fc"][i].T) * F.silu(h @ g["c_fc2"][i].T)) @ g["mlp.c_proj"][i].T
    return F.rms_norm(x, (c.channels,), g["ln_f"], eps) @ g["lm_head"].T


@pytest.fixture(scope="module")
def small_v3(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3v3") / "small.v3.bin"
    tensors = fixed_tensors(SMALL)
    write_v3(path, SMALL, tensors)
    return path, tensors


def test_header_words_size_and_bytes(small_v3):
    path, _ = small_v3
    words = np.fromfile(path, dtype="<i4", count=256)
    # magic, 3, maxT, V, L, NH, kv, C, ffn_dim_multiplier 0.0, multiple_of 1, eps, theta, use_scaled_rope 0,
    # max_gen_bs 4, version 1.0 (docs/reference/formats.md#qwen3-magic-20240804-version-3)
    assert words[:16].tolist() == [20240804, 3, 32, 96, 2, 4, 2, 32, 0, 1, f32_bits(1e-6), f32_bits(1e6), 0, 4, 1, 0]
    assert not words[16:].any()
    assert path.stat().st_size == 1024 + 4 * SMALL.num_parameters() == 1024 + 4 * 30_912  # 2VC + L(2C + 2hd + (NH+2kv)hd·C + C² + 3IC) + C
    assert sha256_file(path) == GOLDEN_SMALL_V3


def test_every_tensor_where_the_loader_reads_it(small_v3):
    path, src = small_v3
    _, t = read_like_the_a3f84f8_loader(path, SMALL)
    for mine, theirs in (("wte", "wte"), ("ln1w", "ln_1"), ("attprojw", "attn.c_proj"), ("ln2w", "ln_2"),
                         ("fcw", "c_fc"), ("fcw2", "c_fc2"), ("fcprojw", "mlp.c_proj"), ("lnfw", "ln_f"),
                         ("lm_head", "lm_head")):
        np.testing.assert_array_equal(t[theirs], src[mine], err_msg=f"{mine} -> {theirs}")
    # Q/K rows and Q/K-norm weights: each head's half-split dims (i, i + hd/2) stored as pair (2i, 2i+1).
    hd = SMALL.head_dim
    perm = np.stack([np.arange(hd // 2), np.arange(hd // 2) + hd // 2], axis=1).ravel()  # 0, 4, 1, 5, ...
    assert perm[:4].tolist() == [0, 4, 1, 5]
    np.testing.assert_array_equal(t["q_norm"], src["qknormw"][:, 0, perm])
    np.testing.assert_array_equal(t["k_norm"], src["qknormw"][:, 1, perm])
    qkv = src["qkvw"]
    nq, nk = SMALL.num_heads * hd, SMALL.num_kv_heads * hd
    rows_q = np.concatenate([h * hd + perm for h in range(SMALL.num_heads)])
    rows_k = nq + np.concatenate([h * hd + perm for h in range(SMALL.num_kv_heads)])
    np.testing.assert_array_equal(t["c_attn"][:, :nq], qkv[:, rows_q])
    np.testing.assert_array_equal(t["c_attn"][:, nq : nq + nk], qkv[:, rows_k])
    np.testing.assert_array_equal(t["c_attn"][:, nq + nk :], qkv[:, nq + nk :])  # V as it is


def test_the_branch_model_on_the_file_is_the_reference(small_v3):
    path, src = small_v3
    _, t = read_like_the_a3f84f8_loader(path, SMALL)
    idx = torch.from_numpy(np.random.default_rng(5).integers(0, SMALL.vocab_size, size=(2, 16)))
    ref = Qwen3.from_llmc(src, SMALL)
    with torch.no_grad():
        want, _ = ref(idx)
        got = a3f84f8_logits(t, SMALL, idx)
        unpermuted = dict(t, c_attn=src["qkvw"], q_norm=src["qknormw"][:, 0], k_norm=src["qknormw"][:, 1])
        wrong = a3f84f8_logits(unpermuted, SMALL, idx)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
    # The control: the rows as lockstep stores them, under the branch's interleaved RoPE, are another model.
    assert float((wrong - want).abs().max()) > 1e-3


def test_a_shape_the_header_cannot_say_is_refused(tmp_path):
    odd = Qwen3Config(max_seq_len=32, vocab_size=96, num_layers=1, num_heads=4, num_kv_heads=2, channels=32,
                      intermediate_size=64)
    assert v3_problems(odd) == ["the version-3 header has no intermediate size: its reader takes I = 96 (and its "
                                "model builds 96) for C=32, but this shape has I=64"]
    with pytest.raises(FormatError, match="cannot write this Qwen3 shape as version 3") as e:
        write_v3(tmp_path / "x.bin", odd, fixed_tensors(odd))
    assert not (tmp_path / "x.bin").exists()
    assert str(tmp_path / "x.bin") in str(e.value)
