"""Tensor by tensor: max |Δ|, relative error ‖Δ‖/‖ref‖ and cosine, for module outputs, the
gradients arriving at them, and parameter gradients; from whole tensors where both captures hold
them, else from their sketches (capture/sketch.py: relative error and cosine to a few percent,
no max |Δ|)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from lockstep.capture import request as capture_request
from lockstep.cases.lora_targets import is_lora_name
from lockstep.capture.request import adam_first_update, make_sketch, on_gpu_if_large, update_values
from lockstep.formats.step_capture import APPLIED, GRAD_ADAM_UPDATE, Sketch, StepCapture

FORWARD, OUTPUT_GRADIENT, GRADIENT, ADAM_UPDATE = "forward", "output gradient", "gradient", "adam update"
APPLIED_UPDATE = "optimizer update"  # the update the optimizer applied in the captured step


@dataclass(frozen=True)
class TensorDiff:
    name: str
    kind: str  # "forward" | "output gradient" | "gradient" | "adam update" | "optimizer update"
    max_abs: float | None  # None when measured from sketches
    rel: float  # ||test - ref|| / ||ref||
    cosine: float
    ref_norm: float
    shape: tuple[int, ...]
    precision: float = 0.0  # what the test side's own recovery allows (relative), 0 when exact
    sketched: bool = False
    # What FP32 arithmetic itself moves this tensor by: the reference's own relative distance from an
    # FP64 run of the same step, times ROUNDING_FACTOR (0 when not measured); for step 1's applied
    # Adam update, what the two gradients' difference moves it by (first_adam_eps) plus w's rounding.
    rounding: float = 0.0
    test_norm: float | None = None  # None where only the difference was kept (older JSON)

    @property
    def scale(self) -> float | None:
        """||test|| / ||ref||: with a cosine of 1, the one factor between the two tensors."""
        if self.test_norm is None or not self.ref_norm:
            return None
        return self.test_norm / self.ref_norm

    def to_json(self) -> dict:
        return {"tensor": self.name, "kind": self.kind, "max_abs_diff": self.max_abs, "rel_error": self.rel,
                "cosine": self.cosine, "ref_norm": self.ref_norm, "shape": list(self.shape),
                "recovery_precision": self.precision, "sketched": self.sketched, "fp32_rounding": self.rounding,
                **({"test_norm": self.test_norm} if self.test_norm is not None else {})}

    @classmethod
    def from_json(cls, d: dict) -> "TensorDiff":
        return cls(d["tensor"], d["kind"], d.get("max_abs_diff"), d["rel_error"], d["cosine"], d["ref_norm"],
                   tuple(d.get("shape", ())), d.get("recovery_precision", 0.0), d.get("sketched", False),
                   d.get("fp32_rounding", 0.0), d.get("test_norm"))


def _cosine(ref_norm: float, test_norm: float, d_norm: float) -> float:
    if ref_norm > 0 and test_norm > 0:
        # |d|^2 = |r|^2 + |t|^2 - 2 r.t, written so that equal tensors give exactly 1 and close ones
        # do not lose their difference to the rounding of two large squared norms.
        cosine = 1.0 - (d_norm**2 - (ref_norm - test_norm) ** 2) / (2 * ref_norm * test_norm)
        return min(1.0, max(-1.0, cosine))
    return 1.0 if d_norm == 0 else 0.0


def _rel(ref_norm: float, d_norm: float) -> float:
    if ref_norm > 0:
        return d_norm / ref_norm
    return 0.0 if d_norm == 0 else math.inf


def tensor_diff(name: str, kind: str, ref: np.ndarray, test: np.ndarray, precision: float = 0.0) -> TensorDiff:
    # FP32 throughout (BLAS dots, one pass each): two close FP32 values subtract exactly, and the
    # norms' own rounding (~1e-7 relative) is far below any tolerance used here. logits are
    # B*T*V values; FP64 copies of them made a gpt2-tiny diagnose spend seconds here.
    shape = tuple(np.shape(ref))
    if shape != tuple(np.shape(test)):
        raise ValueError(f"{name}: shapes differ, reference {shape} vs test {tuple(np.shape(test))}")
    if _is_torch(ref) or _is_torch(test) or (np.size(ref) >= capture_request.ON_GPU_ELEMENTS and capture_request.gpu_available()):
        return _tensor_diff_on_device(name, kind, ref, test, precision, shape)
    ref = np.ascontiguousarray(ref, dtype=np.float32).ravel()
    test = np.ascontiguousarray(test, dtype=np.float32).ravel()
    delta = test - ref
    ref_norm, test_norm, d_norm = (math.sqrt(max(float(np.dot(a, a)), 0.0)) for a in (ref, test, delta))
    max_abs = float(np.max(np.abs(delta))) if delta.size else 0.0
    return TensorDiff(name, kind, max_abs, _rel(ref_norm, d_norm), _cosine(ref_norm, test_norm, d_norm), ref_norm,
                      shape, precision, test_norm=test_norm)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _tensor_diff_on_device(name, kind, ref, test, precision, shape) -> TensorDiff:
    """Large tensors (a 1B model's in seconds) or tensors already on the GPU, compared there."""
    import torch

    def on_gpu(x):
        t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
        return t.to(capture_request.GPU, torch.float32).reshape(-1)

    r, t = on_gpu(ref), on_gpu(test)
    d = t - r
    ref_norm, test_norm, d_norm = (math.sqrt(max(float(torch.dot(a, a)), 0.0)) for a in (r, t, d))
    max_abs = float(d.abs().max()) if d.numel() else 0.0
    return TensorDiff(name, kind, max_abs, _rel(ref_norm, d_norm), _cosine(ref_norm, test_norm, d_norm), ref_norm,
                      shape, precision, test_norm=test_norm)


def sketch_diff(name: str, kind: str, ref: Sketch, test: Sketch, precision: float = 0.0) -> TensorDiff:
    if ref.shape != test.shape:
        raise ValueError(f"{name}: shapes differ, reference {ref.shape} vs test {test.shape}")
    r, t = np.asarray(ref.values, dtype=np.float64), np.asarray(test.values, dtype=np.float64)
    d = t - r
    d_norm = float(np.sqrt(np.dot(d, d)))
    exact = ref.exact
    # The direction from the sketches alone: the sketched difference's norm is an estimate, and mixed
    # with the exact norms it would make a tensor scaled as a whole (a cosine of 1) look a few % off.
    cosine = _cosine(float(np.sqrt(np.dot(r, r))), float(np.sqrt(np.dot(t, t))), d_norm)
    return TensorDiff(name, kind, float(np.max(np.abs(d))) if exact and d.size else None, _rel(ref.norm, d_norm),
                      cosine, ref.norm, ref.shape, precision, sketched=not exact, test_norm=test.norm)


def _whole(cap: StepCapture, kind: str, name: str) -> np.ndarray | None:
    """A tensor the capture holds whole (an int8 Adam update saturation as its -1..1 values), or None."""
    store = cap.store(kind)
    return update_values(store[name], cap.update_levels) if name in store else None


def _sketch(cap: StepCapture, kind: str, name: str, whole: np.ndarray | None) -> Sketch | None:
    s = cap.sketch(kind, name)
    if s is None and whole is not None:
        s = make_sketch(whole)  # a large one on the GPU where there is one
    return s


def diff(ref: StepCapture, test: StepCapture, kind: str, name: str, label: str, precision: float = 0.0,
         ref_kind: str | None = None, ref_transform=None) -> TensorDiff | None:
    """The difference of one tensor both captures hold (whole or sketched), or None; `ref_kind` /
    `ref_transform` read the reference's tensor from another entry or transform its whole tensor
    first (Adam's update from the reference's gradient)."""
    ref_kind = ref_kind or kind
    r_whole, t_whole = _whole(ref, kind, name), _whole(test, kind, name)
    stored = _whole(ref, ref_kind, name) if ref_kind != kind else None  # e.g. the update's signs, kept whole
    if stored is not None:
        r_whole = stored
    elif ref_transform is not None and r_whole is not None:
        r_whole = ref_transform(on_gpu_if_large(r_whole))
    elif ref_kind != kind:
        r_whole = None
    if r_whole is not None and t_whole is not None:
        if np.shape(r_whole) != np.shape(t_whole):
            return None  # a TP rank's shard or a PP stage's share of another layout is not the module's output
        return tensor_diff(name, label, r_whole, t_whole, precision)
    r_sk, t_sk = _sketch(ref, ref_kind, name, r_whole), _sketch(test, kind, name, t_whole)
    if r_sk is None or t_sk is None or r_sk.shape != t_sk.shape:
        return None
    return sketch_diff(name, label, r_sk, t_sk, precision)


def forward_names(cap: StepCapture) -> list[str]:
    """Micro batch 0's module outputs in forward order."""
    names = [n for n in cap.names("fwd") if "@" not in n]
    order = [n for n in cap.forward_order if n in names]
    return order + [n for n in names if n not in order]


def compare_forward(ref: StepCapture, test: StepCapture) -> list[TensorDiff]:
    """Every module output of micro batch 0 both sides have, in the reference's forward order."""
    return [d for n in forward_names(ref) if (d := diff(ref, test, "fwd", n, FORWARD)) is not None]


def compare_micro_batches(ref: StepCapture, test: StepCapture) -> dict[int, list[TensorDiff]]:
    """Micro batches 1.. (their outputs and losses, sketched), by micro batch, in forward order."""
    order = {n: i for i, n in enumerate(forward_names(ref))}
    by_micro: dict[int, list[TensorDiff]] = {}
    for key in ref.names("fwd"):
        if "@" not in key:
            continue
        base, micro = key.split("@")
        d = diff(ref, test, "fwd", key, FORWARD)
        if d is not None:
            by_micro.setdefault(int(micro), []).append(d)
    for diffs in by_micro.values():
        diffs.sort(key=lambda d: order.get(d.name.split("@")[0], len(order)))
    return dict(sorted(by_micro.items()))


def compare_output_grads(ref: StepCapture, test: StepCapture) -> list[TensorDiff]:
    """The gradient arriving at every module output both sides have, in backward order (logits first)."""
    have = set(ref.names("outgrad"))
    return [d for n in reversed(forward_names(ref)) if n in have
            if (d := diff(ref, test, "outgrad", n, OUTPUT_GRADIENT)) is not None]


def compare_grads(ref: StepCapture, test: StepCapture, adam_eps: float | None = None) -> list[TensorDiff]:
    """Every parameter gradient in the reference's parameter order; against a test that shows only
    Adam's first update (InfiniTrain on Adam families), the reference's update of the same step,
    with `adam_eps`, else the eps the captures were requested with (stepcheck/request.py)."""
    order = ref.param_order or ref.names("grad")
    order = order + [n for n in ref.names("grad") if n not in order]
    # An adapter only one side has is not compared: the certificate's LoRA rule names it (certify/lora.py).
    order = [n for n in order if not is_lora_name(n) or n in set(test.names("grad"))]
    missing = [n for n in order if n not in set(test.names("grad"))]
    if missing:
        raise ValueError(f"{test.framework} has no gradient for {', '.join(missing[:3])}")
    if test.grad_kind == GRAD_ADAM_UPDATE and adam_eps is None:
        adam_eps = requested_adam_eps(ref, test)
    out = []
    for n in order:
        if test.grad_kind == GRAD_ADAM_UPDATE:
            d = diff(ref, test, "grad", n, ADAM_UPDATE, ref_kind="update",
                     ref_transform=lambda g: adam_first_update(g, adam_eps))
        else:
            d = diff(ref, test, "grad", n, GRADIENT, test.grad_precision.get(n, 0.0))
        if d is None:
            raise ValueError(f"{n}: the captures of {ref.framework} and {test.framework} cannot be compared "
                             "(different shapes, or no common form)")
        out.append(d)
    return out


def compare_applied(ref: StepCapture, test: StepCapture) -> list[TensorDiff]:
    """The update each side's optimizer applied to every parameter (captures that stepped their
    optimizer: diagnose --at-step), in the reference's parameter order; empty unless both have it.
    Each tensor's precision is what both sides' FP32 rounding of the weights after it allows."""
    have = set(test.names(APPLIED))
    order = [n for n in (ref.param_order or ref.names("grad")) if n in set(ref.names(APPLIED))]
    order += [n for n in ref.names(APPLIED) if n not in order]
    if not have:
        return []
    ref_precision, test_precision = ref.applied_precision, test.applied_precision
    eps = first_adam_eps(ref, test)
    out = []
    for n in order:
        if n not in have:
            raise ValueError(f"{test.framework} recorded no optimizer update for {n}")
        d = diff(ref, test, APPLIED, n, APPLIED_UPDATE, ref_precision.get(n, 0.0) + test_precision.get(n, 0.0))
        if d is None:
            raise ValueError(f"{n}: the optimizer updates of {ref.framework} and {test.framework} cannot be compared "
                             "(different shapes)")
        r_grad, t_grad = (_whole(ref, "grad", n), _whole(test, "grad", n)) if eps is not None else (None, None)
        if r_grad is not None and t_grad is not None and np.shape(r_grad) == np.shape(t_grad):
            from_grads = tensor_diff(n, APPLIED_UPDATE, exact_first_update(r_grad, eps), exact_first_update(t_grad, eps))
            d = dataclasses.replace(d, rounding=max(d.rounding, from_grads.rel + RECOVERY_ALLOWANCE * d.precision))
        out.append(d)
    return out


RECOVERY_ALLOWANCE = 10  # what classify allows of a recovery precision (its allowance), kept beside another part


def requested_adam_eps(ref: StepCapture, test: StepCapture) -> float:
    """The Adam eps the captures were requested with (the test's, else the reference's)."""
    for cap in (test, ref):
        eps = (cap.meta.get("request") or {}).get("adam_eps")
        if eps is not None:
            return float(eps)
    raise ValueError(f"{test.framework} shows only Adam's first update, and neither capture records Adam's eps")


def first_adam_eps(ref: StepCapture, test: StepCapture) -> float | None:
    """Adam's eps when both captures applied Adam's first update (step 1 from a fresh optimizer),
    else None. That update is g/(|g| + eps) of each side's own gradient, so the gradients' FP32
    difference alone moves it -- by up to 1/eps times a gradient's error where |g| is near eps,
    far beyond w_after's rounding (small Llama, lr 1e-4: fcw[1] 1.01e-4 from gradients within
    2e-7): `compare_applied` allows that part, computed exactly from both whole gradients, on top."""
    applied = [(cap.meta.get(APPLIED) or {}) for cap in (ref, test)]
    if any(a.get("step") != 1 for a in applied):
        return None
    eps = {(cap.meta.get("request") or {}).get("adam_eps") for cap in (ref, test)}
    return eps.pop() if len(eps) == 1 and None not in eps else None


def exact_first_update(grad: np.ndarray, eps: float) -> np.ndarray:
    g = np.asarray(grad, dtype=np.float64)
    return (g / (np.abs(g) + eps)).astype(np.float32)


def tie_diff(ref: StepCapture, test: StepCapture, name: str) -> tuple[float, float]:
    """A tied tensor's test gradient against each use's part of the reference's: (relative error
    to the embedding lookup's part, to the output head's part)."""
    full, part, t = _whole(ref, "grad", name), _whole(ref, "tie", name), _whole(test, "grad", name)
    if full is not None and part is not None and t is not None:
        return (tensor_diff(name, GRADIENT, part, t).rel, tensor_diff(name, GRADIENT, full - part, t).rel)
    s_full, s_part, s_t = _sketch(ref, "grad", name, full), _sketch(ref, "tie", name, part), _sketch(test, "grad", name, t)
    head = np.asarray(s_full.values) - np.asarray(s_part.values)  # linear: the head's part, sketched
    # The parts' norms are estimated from their sketches (whole tensors are not at hand).
    s_head = Sketch(head, float(np.linalg.norm(head)), s_full.shape)
    return sketch_diff(name, GRADIENT, s_part, s_t).rel, sketch_diff(name, GRADIENT, s_head, s_t).rel
