"""Gradients of a framework that can only save weights (InfiniTrain): one step, then (w0 - w1) / lr.

SGD without momentum moves every weight by exactly lr·g, rounded once when w1 is stored in
FP32. With lr a power of two, lr·g is exact, and the only error of g = (w0 - w1)/lr is w1's
rounding: |error| <= ulp(w1)/2 / lr, i.e. a relative error of 2^-24·|w1|/(lr·|g|) -- about
6e-8 once lr·|g| dominates |w0|. `sgd_recovery_lr` picks that lr from the reference's
gradients; `grad_precision` states the bound reached per tensor.

Adam's first step (m̂ = g, v̂ = g², bias-corrected) moves a weight by lr·g/(|g| + eps): lr·sign(g)
wherever |g| >> eps. Only the sign of each gradient can be recovered; its magnitude is gone.

InfiniTrain's saved weights are read by formats/infinitrain_checkpoint.py and named canonically by
runners/infinitrain/families.py.
"""

from __future__ import annotations

import math

import numpy as np

HEADROOM = 2.0 ** 10  # lr·|g| at least this many times |w|, for most tensors' typical elements
ADAM_RECOVERY_LR = 1.0  # Adam moves each weight by ~lr·sign(g): 1.0 dominates every initial weight


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
