"""Tensor by tensor: max |Δ|, relative error ‖Δ‖/‖ref‖ and cosine, for forward outputs and gradients."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lockstep.diagnose.capture import GRAD_ADAM_SIGN, StepCapture


@dataclass(frozen=True)
class TensorDiff:
    name: str
    kind: str  # "forward" | "gradient" | "gradient sign"
    max_abs: float
    rel: float  # ||test - ref|| / ||ref||; for "gradient sign": the share of elements whose sign differs
    cosine: float
    ref_norm: float
    shape: tuple[int, ...]
    precision: float = 0.0  # what the test side's own recovery allows (relative), 0 when exact

    def to_json(self) -> dict:
        return {"tensor": self.name, "kind": self.kind, "max_abs_diff": self.max_abs, "rel_error": self.rel,
                "cosine": self.cosine, "ref_norm": self.ref_norm, "shape": list(self.shape),
                "recovery_precision": self.precision}


def tensor_diff(name: str, kind: str, ref: np.ndarray, test: np.ndarray, precision: float = 0.0) -> TensorDiff:
    # FP32 throughout (BLAS dots, one pass each): two close FP32 values subtract exactly, and the
    # norms' own rounding (~1e-7 relative) is far below any tolerance used here. logits are
    # B*T*V values; FP64 copies of them made a gpt2-tiny diagnose spend seconds here.
    shape = tuple(np.shape(ref))
    if shape != tuple(np.shape(test)):
        raise ValueError(f"{name}: shapes differ, reference {shape} vs test {tuple(np.shape(test))}")
    ref = np.ascontiguousarray(ref, dtype=np.float32).ravel()
    test = np.ascontiguousarray(test, dtype=np.float32).ravel()
    delta = test - ref
    ref_norm, test_norm, d_norm = (math.sqrt(max(float(np.dot(a, a)), 0.0)) for a in (ref, test, delta))
    if ref_norm > 0:
        rel = d_norm / ref_norm
    else:
        rel = 0.0 if d_norm == 0 else math.inf
    if ref_norm > 0 and test_norm > 0:
        # |d|^2 = |r|^2 + |t|^2 - 2 r.t, written so that equal tensors give exactly 1 and close ones
        # do not lose their difference to the rounding of two large squared norms.
        cosine = 1.0 - (d_norm**2 - (ref_norm - test_norm) ** 2) / (2 * ref_norm * test_norm)
        cosine = min(1.0, max(-1.0, cosine))
    else:
        cosine = 1.0 if d_norm == 0 else 0.0
    max_abs = float(np.max(np.abs(delta))) if delta.size else 0.0
    return TensorDiff(name, kind, max_abs, rel, cosine, ref_norm, shape, precision)


def sign_diff(name: str, ref: np.ndarray, test_sign: np.ndarray, eps: float) -> TensorDiff:
    """Adam's first step keeps only sign(g) (where |g| >> eps): the share of elements whose sign differs."""
    ref = np.asarray(ref, dtype=np.float64)
    meaningful = np.abs(ref) > 10 * eps  # smaller gradients move a weight by lr*|g|/(|g|+eps): sign unreliable
    wrong = np.sign(ref[meaningful]) != np.sign(np.asarray(test_sign)[meaningful])
    share = float(wrong.mean()) if wrong.size else 0.0
    ref_norm = float(np.linalg.norm(ref.ravel()))
    return TensorDiff(name, "gradient sign", float(wrong.any()), share, 1.0 - 2.0 * share, ref_norm, tuple(ref.shape))


def compare_forward(ref: StepCapture, test: StepCapture) -> list[TensorDiff]:
    """Every module output both sides have, in the reference's forward order."""
    order = ref.forward_order or list(ref.forward)
    # Same shape only: a TP rank's shard or a PP stage's share of another layout is not the module's output.
    return [tensor_diff(n, "forward", ref.forward[n], test.forward[n]) for n in order
            if n in test.forward and np.shape(test.forward[n]) == np.shape(ref.forward[n])]


def compare_output_grads(ref: StepCapture, test: StepCapture) -> list[TensorDiff]:
    """The gradient arriving at every module output both sides have, in backward order (logits first)."""
    order = [n for n in reversed(ref.forward_order or list(ref.forward)) if n in ref.output_grads]
    return [tensor_diff(n, "output gradient", ref.output_grads[n], test.output_grads[n]) for n in order
            if n in test.output_grads and np.shape(test.output_grads[n]) == np.shape(ref.output_grads[n])]


def compare_grads(ref: StepCapture, test: StepCapture, adam_eps: float = 1e-8) -> list[TensorDiff]:
    order = ref.param_order or list(ref.grads)
    missing = [n for n in order if n not in test.grads]
    if missing:
        raise ValueError(f"{test.framework} has no gradient for {', '.join(missing[:3])}")
    if test.grad_kind == GRAD_ADAM_SIGN:
        return [sign_diff(n, ref.grads[n], test.grads[n], adam_eps) for n in order]
    return [tensor_diff(n, "gradient", ref.grads[n], test.grads[n], test.grad_precision.get(n, 0.0)) for n in order]
