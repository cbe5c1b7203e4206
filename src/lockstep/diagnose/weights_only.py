"""Gradients of a framework that can only save weights (InfiniTrain): one step, then (w0 - w1) / lr.

SGD without momentum moves every weight by exactly lr·g, rounded once when w1 is stored in
FP32. With lr a power of two, lr·g is exact, and the only error of g = (w0 - w1)/lr is w1's
rounding: |error| <= ulp(w1)/2 / lr, i.e. a relative error of 2^-24·|w1|/(lr·|g|) -- about
6e-8 once lr·|g| dominates |w0|. `sgd_recovery_lr` picks that lr from the reference's
gradients; `grad_precision` states the bound reached per tensor.

Adam's first step (m̂ = g, v̂ = g², bias-corrected) moves a weight by lr·g/(|g| + eps): lr·sign(g)
wherever |g| >> eps. Only the sign of each gradient can be recovered; its magnitude is gone.

InfiniTrain's `--save DIR --save_interval 1` writes DIR/checkpoint_step_000001/model.ckpt:
magic "CKPT" (0x54504B43), version 1, a count, then per tensor its name, an int8 dtype
(11 = FP32), ndim, int64 dims, a uint64 byte count and the data (infini_train/src/checkpoint/
checkpoint.cc at b24d92f). Names are its module paths (transformer.h.0.attn.c_attn.weight).
"""

from __future__ import annotations

import math
import os
import re
import struct

import numpy as np

from lockstep.errors import FormatError, LockstepError

CKPT_MAGIC = 0x54504B43
CKPT_VERSION = 1
INFINITRAIN_FP32 = 11
HEADROOM = 2.0 ** 10  # lr·|g| at least this many times |w|, for most tensors' typical elements
ADAM_RECOVERY_LR = 1.0  # Adam moves each weight by ~lr·sign(g): 1.0 dominates every initial weight


def read_infinitrain_state(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The FP32 tensors of an InfiniTrain `model.ckpt`, by InfiniTrain's names (other dtypes are skipped)."""
    data = open(path, "rb").read()
    if len(data) < 12:
        raise FormatError(path, "too short for an InfiniTrain checkpoint")
    magic, version, count = struct.unpack_from("<III", data, 0)
    if magic != CKPT_MAGIC:
        raise FormatError(path, f"wrong magic number {magic:#x} for an InfiniTrain checkpoint (expected {CKPT_MAGIC:#x})")
    if version != CKPT_VERSION:
        raise FormatError(path, f"unsupported InfiniTrain checkpoint version {version} (supported: {CKPT_VERSION})")
    pos, out = 12, {}
    try:
        for _ in range(count):
            (n,) = struct.unpack_from("<I", data, pos)
            name = data[pos + 4 : pos + 4 + n].decode()
            pos += 4 + n
            dtype, ndim = struct.unpack_from("<bI", data, pos)
            pos += 5
            dims = struct.unpack_from(f"<{ndim}q", data, pos)
            pos += 8 * ndim
            (nbytes,) = struct.unpack_from("<Q", data, pos)
            pos += 8
            if dtype != INFINITRAIN_FP32:  # e.g. a non-parameter buffer: not a weight, skipped
                if pos + nbytes > len(data):
                    raise FormatError(path, f"tensor {name}: {nbytes} bytes, but the file ends early")
                pos += nbytes
                continue
            if nbytes != 4 * math.prod(dims) or pos + nbytes > len(data):
                raise FormatError(path, f"tensor {name}: {nbytes} bytes for shape {list(dims)}, or the file ends early")
            out[name] = np.frombuffer(data, dtype="<f4", count=math.prod(dims), offset=pos).reshape(dims)
            pos += nbytes
    except struct.error:
        raise FormatError(path, "ends in the middle of a tensor entry") from None
    if pos != len(data):
        raise FormatError(path, f"{len(data) - pos} trailing bytes after {count} tensors")
    return out


def write_infinitrain_state(path: str | os.PathLike, tensors: dict[str, np.ndarray]) -> None:
    """The same layout, for tests (InfiniTrain's own writer is the real source of these files)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<III", CKPT_MAGIC, CKPT_VERSION, len(tensors)))
        for name, a in tensors.items():
            a = np.ascontiguousarray(a, dtype="<f4")
            raw = name.encode()
            f.write(struct.pack("<I", len(raw)) + raw + struct.pack("<bI", INFINITRAIN_FP32, a.ndim))
            f.write(struct.pack(f"<{a.ndim}q", *a.shape) + struct.pack("<Q", a.nbytes) + a.tobytes())


_GPT2_LAYER = {"ln_1.weight": "ln1w", "ln_1.bias": "ln1b", "attn.c_attn.weight": "qkvw", "attn.c_attn.bias": "qkvb",
               "attn.c_proj.weight": "attprojw", "attn.c_proj.bias": "attprojb", "ln_2.weight": "ln2w",
               "ln_2.bias": "ln2b", "mlp.c_fc.weight": "fcw", "mlp.c_fc.bias": "fcb", "mlp.c_proj.weight": "fcprojw",
               "mlp.c_proj.bias": "fcprojb"}
_GPT2_TOP = {"transformer.wte.weight": "wte", "transformer.wpe.weight": "wpe", "transformer.ln_f.weight": "lnfw",
             "transformer.ln_f.bias": "lnfb"}


def infinitrain_gpt2_canonical(state: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
    """InfiniTrain GPT-2 names (TP=1, one stage) -> canonical names; wte's V rows padded to Vp with zeros.
    `lm_head.weight` (its own copy when the tie is lost) is not a canonical tensor and is left out."""
    out = {}
    for name, a in state.items():
        m = re.match(r"^transformer\.h\.(\d+)\.(.+)$", name)
        if m and m.group(2) in _GPT2_LAYER:
            out[f"{_GPT2_LAYER[m.group(2)]}[{int(m.group(1))}]"] = a
        elif name in _GPT2_TOP:
            out[_GPT2_TOP[name]] = a
    if "wte" in out and out["wte"].shape[0] < config.padded_vocab_size:
        padded = np.zeros((config.padded_vocab_size, out["wte"].shape[1]), dtype=np.float32)
        padded[: out["wte"].shape[0]] = out["wte"]
        out["wte"] = padded
    return out


_LLAMA3_LAYER = {"ln_1.weight": "ln1w", "attn.c_attn.weight": "qkvw", "attn.c_proj.weight": "attprojw",
                 "ln_2.weight": "ln2w", "mlp.c_fc.weight": "fcw", "mlp.c_fc2.weight": "fcw2",
                 "mlp.c_proj.weight": "fcprojw"}
_LLAMA3_TOP = {"transformer.wte.weight": "wte", "transformer.ln_f.weight": "lnfw", "lm_head.weight": "lm_head"}


def infinitrain_llama3_canonical(state: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
    """InfiniTrain Llama 3 names (TP=1, one stage; example/llama3/checkpoint_loader.cc) -> canonical names."""
    out = {}
    for name, a in state.items():
        m = re.match(r"^transformer\.h\.(\d+)\.(.+)$", name)
        if m and m.group(2) in _LLAMA3_LAYER:
            out[f"{_LLAMA3_LAYER[m.group(2)]}[{int(m.group(1))}]"] = a
        elif name in _LLAMA3_TOP:
            out[_LLAMA3_TOP[name]] = a
    return out


CANONICAL_MAPS = {"gpt2": infinitrain_gpt2_canonical, "llama3": infinitrain_llama3_canonical}


def canonical_state(family: str, state: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
    try:
        return CANONICAL_MAPS[family](state, config)
    except KeyError:
        raise LockstepError(f"diagnose cannot map InfiniTrain's {family} checkpoint names to LLMC names yet "
                            f"(mapped: {', '.join(CANONICAL_MAPS)})") from None


def sgd_recovery_lr(weights: dict[str, np.ndarray], ref_grads: dict[str, np.ndarray]) -> float:
    """A power of two lr with lr·rms(g) >= 2^10·rms(w) for every tensor that has a gradient."""
    need = 1.0
    for name, g in ref_grads.items():
        g_rms = float(np.sqrt(np.mean(np.square(g, dtype=np.float64))))
        if g_rms == 0.0:
            continue
        w_rms = float(np.sqrt(np.mean(np.square(weights[name], dtype=np.float64))))
        need = max(need, HEADROOM * max(w_rms, 1e-3) / g_rms)
    return float(2.0 ** math.ceil(math.log2(need)))


def recover_sgd(w0: np.ndarray, w1: np.ndarray, lr: float) -> tuple[np.ndarray, float]:
    """g = (w0 - w1)/lr, and the bound on ||error||/||g|| that w1's FP32 rounding allows."""
    g = (np.asarray(w0, dtype=np.float64) - np.asarray(w1, dtype=np.float64)) / lr
    g_norm = float(np.linalg.norm(g.ravel()))
    bound = 2.0 ** -24 * float(np.linalg.norm(np.asarray(w1, dtype=np.float64).ravel())) / lr
    return g.astype(np.float32), (bound / g_norm if g_norm > 0 else 0.0)


def recover_adam_sign(w0: np.ndarray, w1: np.ndarray) -> np.ndarray:
    """sign(g) after Adam's first step (0 where the weight did not move)."""
    return np.sign(np.asarray(w0, dtype=np.float64) - np.asarray(w1, dtype=np.float64)).astype(np.float32)
