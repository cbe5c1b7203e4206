"""What a runner records of step 1 (`CaptureRequest`), and the one way every runner records it
(`CaptureBuilder`): whole tensors for `lockstep diagnose`, or sketches for the certificate."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import numpy as np

from lockstep.capture.sketch import l2_norm, sketch_numpy, sketch_torch
from lockstep.formats.step_capture import APPLIED, UPDATE_LEVELS, Sketch, StepCapture

# Module outputs (and the gradients arriving at them) are recorded for the first sequences of a
# micro batch only: activations grow with the micro batch (GPT-2 124M at B=80: 2 GB of them, a 1B
# model's InfiniTrain dumps 18 GB), and a sequence's forward does not depend on the others in its
# batch, so a few of them show where a forward parts as well as all.
CAPTURE_ROWS = 4


# Micro batches (of DP rank 0) whose module outputs are recorded; the first whole or sketched as
# asked, the rest sketched. Enough for every pipeline schedule's warm-up and steady state.
MAX_MICRO_BATCHES = 16


def micro_name(name: str, micro: int) -> str:
    """`ln1[0]` on micro batch 0, `ln1[0]@3` on micro batch 3."""
    return name if micro == 0 else f"{name}@{micro}"


@dataclass(frozen=True)
class CaptureRequest:
    path: str  # the .npz the capture goes to
    full: bool = False  # whole tensors (diagnose) rather than sketches (the certificate)
    # Adam families: also record Adam's first update u = g/(|g| + eps) of every exact gradient,
    # the only thing a framework that can merely save its weights (InfiniTrain) can show.
    adam_eps: float | None = None
    rows: int | None = None  # forward and output gradients: the micro batch's first `rows` sequences (None: all)
    reference: str | None = None  # another framework's capture of the same step (InfiniTrain's recovery lr)
    # With `full` and `adam_eps`: False keeps each gradient as its sketch and its Adam update whole
    # (int8 signs, a quarter of the bytes), for a diagnose whose other side shows only that update.
    whole_grads: bool = True
    # `lockstep diagnose --at-step N`: the step captured is N+1, from the reference's state after N
    # steps (`start_state`, a torch.distributed.checkpoint folder of the pytorch reference: its
    # weights, optimizer state and data position), loaded by the framework in its own checkpoint
    # format; its data window is step N+1's, and the update its optimizer applies is recorded too.
    start_step: int = 0
    start_state: str | None = None
    # Step 1 too (diagnose asks for it): the capture lets the optimizer step and records the update
    # it applied (`applied/`), so that an update differing while the gradients agree is located.
    applied: bool = False

    def __post_init__(self):
        if not self.whole_grads and (self.adam_eps is None or not self.full):
            raise ValueError("a capture without whole gradients keeps their Adam update whole: it needs full and adam_eps")
        if self.start_step < 0 or (self.start_step > 0) != (self.start_state is not None):
            raise ValueError("a capture after step N > 0 needs the state it starts from, and only then")

    @property
    def records_applied(self) -> bool:
        """Whether the capture steps the optimizer and records its update: always from a saved state."""
        return self.applied or self.start_state is not None

    @property
    def step(self) -> int:
        """The step captured (1-based): 1, or the one after the state it starts from."""
        return self.start_step + 1

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "CaptureRequest | None":
        return cls(**d) if d else None


# Adam's first update of an element is u = g/(|g| + eps) (m̂ = g, v̂ = g²): saturated at ±1 where
# |g| >> eps, and there only the sign of g survives. Below, u is rounding noise amplified: an
# element whose true gradient is ~0 gets u anywhere in (-1, 1) from last-bit differences. So what
# two frameworks' first Adam updates can be held to is the sign of the saturated elements.
# Between the two, a ramp: a hard edge would let an element whose |g| lies within FP32's reach of
# it fall on either side in two correct frameworks, a whole ±1 apart. Measured on llama3-tiny's
# LoRA B gradients (2026-12-03, docs/results/2026-12-03-adam-saturation-ramp): pytorch and
# megatron-core differ by up to 4.0e-4 relative on elements of |g| 5e-6..2e-5 (small gradients
# are sums that cancel), and in a 2,048-element tensor the element nearest the edge sat 8.9e-4 from
# it; one such element on the other side made a correct InfiniTrain run's tensor differ by 2.3e-2.
# On the ramp an element moves by about its gradient's relative error (du/dg = eps/(|g| + eps)²,
# over a ramp 1e-3 wide in u), as every other tensor's comparison does.
ADAM_SATURATED = 1.0 - 1e-3  # |u| at or above this (|g| >= 999·eps): the sign, ±1
ADAM_NOISE = 1.0 - 2e-3  # |u| at or below this (|g| <= 499·eps): 0, rounding noise


# Whole tensors this large are worked on a GPU where there is one: elementwise FP64 work over a
# 1B model's tensors (Adam's update, its sign) took ~80 s of a diagnose on the host.
ON_GPU_ELEMENTS = 1 << 22
GPU = "cuda"


def on_gpu_if_large(array):
    """`array` as a tensor on the GPU when it is large and there is one (same values and dtype);
    otherwise `array` itself. FP64 elementwise arithmetic (+, -, *, /, abs, sign) rounds the same
    there as on the host, so what is computed from it is bitwise the host's."""
    numel = array.numel() if callable(getattr(array, "numel", None)) else int(np.size(array))
    if numel < ON_GPU_ELEMENTS:
        return array
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return array
    if not gpu_available() or not _fits(torch, numel):
        return array
    return to_gpu(array)


def to_gpu(array):
    """`array` (numpy or torch) as a tensor on the GPU, same values and dtype; one on a GPU already
    stays on its own."""
    import torch

    if isinstance(array, torch.Tensor):
        return array if array.is_cuda else array.to(GPU)
    with warnings.catch_warnings():
        # A read-only array (a memory-mapped checkpoint's tensor) is copied to the GPU at once, never written.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(np.asarray(array)).to(GPU)


def gpu_available() -> bool:
    """Whether there is a GPU (`GPU`) to work large tensors on."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return GPU != "cuda" or torch.cuda.is_available()


def _fits(torch, numel: int) -> bool:
    """Room on the GPU for the FP64 work on `numel` elements (a few FP64 temporaries at once)."""
    if GPU != "cuda":
        return True
    free, _total = torch.cuda.mem_get_info()
    return 8 * 8 * numel < free


def adam_update_sign(u):
    """The saturation of Adam's first update u (numpy or torch): sign(u) where |u| >= ADAM_SATURATED, 0
    where |u| <= ADAM_NOISE, linear in |u| between the two; in FP32 steps of 1/UPDATE_LEVELS, the
    values an int8 capture holds (`update_signs`, `update_values`), so that a whole reference
    transformed here and one kept as int8 compare alike."""
    ramp = 1.0 / (ADAM_SATURATED - ADAM_NOISE)
    try:
        import torch

        if isinstance(u, torch.Tensor):
            u64 = u.detach().to(torch.float64)
            s = torch.sign(u64) * ((u64.abs() - ADAM_NOISE) * ramp).clamp(0.0, 1.0)
            return (s * UPDATE_LEVELS).round().to(torch.float32) / UPDATE_LEVELS
    except ImportError:  # pragma: no cover
        pass
    u64 = np.asarray(u, dtype=np.float64)
    s = np.sign(u64) * np.clip((np.abs(u64) - ADAM_NOISE) * ramp, 0.0, 1.0)
    return np.rint(s * UPDATE_LEVELS).astype(np.float32) / np.float32(UPDATE_LEVELS)


def adam_first_update(g, eps: float):
    """What a framework's first Adam step shows of a gradient: the sign of its saturated update
    (`adam_update_sign` of g/(|g| + eps), bias-corrected: m̂ = g, v̂ = g²)."""
    try:
        import torch

        if isinstance(g, torch.Tensor):
            g64 = g.detach().to(torch.float64)
            return adam_update_sign(g64 / (g64.abs() + eps))
    except ImportError:  # pragma: no cover
        pass
    g64 = np.asarray(g, dtype=np.float64)
    return adam_update_sign(g64 / (np.abs(g64) + eps))


def update_signs(u) -> np.ndarray:
    """Adam update saturations (`adam_update_sign`, -1..1; numpy or torch, anywhere) as the int8 host
    array a capture keeps: UPDATE_LEVELS steps of 1/UPDATE_LEVELS."""
    if callable(getattr(u, "cpu", None)):
        import torch

        return (u * UPDATE_LEVELS).round().to(torch.int8).cpu().numpy()
    return np.rint(np.asarray(u, dtype=np.float64) * UPDATE_LEVELS).astype(np.int8)


def update_values(array, levels: int = UPDATE_LEVELS):
    """An int8 array a capture kept (`update_signs`) as the saturations it stands for (FP32, -1..1);
    any other array unchanged. `levels`: the capture's (1 for files before capture schema 4)."""
    if getattr(array, "dtype", None) == np.int8:
        return np.asarray(array, dtype=np.float32) / np.float32(levels)
    return array


class CaptureBuilder:
    """Collects one framework's step 1 as the request asks, from torch or numpy tensors in
    canonical layout; `finish()` writes the capture."""

    def __init__(self, request: CaptureRequest, framework: str):
        self.request = request
        self.capture = StepCapture(framework=framework)
        for name in ("forward", "output_grads", "grads", "updates", "tie_parts"):
            setattr(self.capture, name, {})

    def rows_of(self, t):
        """The forward / output-gradient rows kept: the first `rows` sequences (dim 0)."""
        rows = self.request.rows
        return t if rows is None or t.ndim == 0 else t[:rows]

    def add(self, kind: str, name: str, tensor) -> None:
        """One tensor in canonical layout: "fwd", "outgrad", "grad" or "tie"."""
        if kind in ("fwd", "outgrad"):
            tensor = self.rows_of(tensor)
        if self.request.full and not self.request.whole_grads and kind in ("grad", "tie"):
            self.capture.sketches[f"{kind}/{name}"] = make_sketch(tensor)
            if kind == "grad":
                self.capture.updates[name] = update_signs(adam_first_update(on_gpu_if_large(tensor),
                                                                            self.request.adam_eps))
            return
        if self.request.full:
            array = _to_numpy(tensor)  # sign-valued tensors (InfiniTrain's Adam update) stay int8
            self.capture.store(kind)[name] = array.copy() if array.dtype == np.int8 else array.astype(np.float32, copy=True)
        else:
            self.capture.sketches[f"{kind}/{name}"] = make_sketch(update_values(tensor))
        if kind == "grad" and self.request.adam_eps is not None:
            self.capture.sketches[f"update/{name}"] = make_sketch(adam_first_update(tensor, self.request.adam_eps))

    def finish(self) -> StepCapture:
        self.capture.meta.setdefault("request", self.request.to_dict())
        self.capture.save(self.request.path)
        self.capture.source = self.request.path
        return self.capture


def make_sketch(tensor) -> Sketch:
    """A tensor's sketch and exact norm; a large host tensor is sketched on the GPU where there is
    one (`on_gpu_if_large`: hashing 1B elements takes minutes on a CPU)."""
    tensor = on_gpu_if_large(tensor)
    try:
        import torch

        if isinstance(tensor, torch.Tensor):
            return Sketch(sketch_torch(tensor).cpu().numpy(), l2_norm(tensor), tuple(tensor.shape))
    except ImportError:  # pragma: no cover
        pass
    arr = np.asarray(tensor)
    return Sketch(sketch_numpy(arr), l2_norm(arr), tuple(arr.shape))


def _to_numpy(t) -> np.ndarray:
    try:
        import torch

        if isinstance(t, torch.Tensor):
            return t.detach().float().cpu().numpy()
    except ImportError:  # pragma: no cover
        pass
    return np.asarray(t)


def applied_update(before, after, lr: float):
    """The update an optimizer applied, per unit lr: ((w_before - w_after)/lr, the bound on its
    relative error that w_after's FP32 rounding allows, 2^-24·||w_after||/lr). At lr 0 (a warm-up
    from 0) there is no per-unit update: the weights must not move at all, so the movement itself is
    returned (both sides' zeros when they held still) with bound 0. Torch tensors in FP64."""
    import torch

    moved = before - after
    if lr == 0:
        return moved, 0.0
    moved = moved / lr
    norm = float(torch.linalg.vector_norm(moved))
    bound = 2.0 ** -24 * float(torch.linalg.vector_norm(after)) / lr
    return moved, (bound / norm if norm > 0 else 0.0)


def add_applied_update(builder: CaptureBuilder, before: dict, params: dict,
                       lr: float, step: int) -> None:
    """The update the optimizer applied in `step`, (w_before - w_after)/lr per parameter, sketched
    (`applied/NAME`), with the bound on its relative error that w_after's FP32 rounding allows (as
    for a gradient recovered from saved weights: 2^-24·||w_after||/lr over ||update||); at lr 0 the
    movement itself, which must be zero (capture.request.applied_update)."""
    precision = {}
    for name, p in params.items():
        moved, precision[name] = applied_update(before[name].double(), p.detach().double(), lr)
        builder.capture.sketches[f"{APPLIED}/{name}"] = make_sketch(moved)
    builder.capture.meta[APPLIED] = {"step": step, "lr": lr, "precision": precision}
    if lr == 0:
        builder.capture.notes.append(zero_lr_note(step))


def zero_lr_note(step: int) -> str:
    """The capture's sentence for a step that trained at lr 0."""
    return (f"step {step} trained at lr 0 (the warm-up's start): the optimizer's update is checked as the weights' "
            "movement, which must be exactly zero, not as an update per unit lr")
