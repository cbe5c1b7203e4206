"""What one framework's first step looks like to `lockstep diagnose`: a `StepCapture`.

A capture holds, under canonical names (SPEC: LLMC tensor names, per layer `qkvw[3]`):
- `forward`: the output of every module on the first micro batch of DP rank 0, in forward order
  (`embedding`, `ln1[i]`, `attn[i]` (attention before its projection), `attproj[i]`, `ln2[i]`,
  `mlp[i]`, `block[i]`, `lnf`, `logits`, `loss`); empty when the framework exposes none.
- `output_grads`: the gradient arriving at each of those module outputs in step 1's backward
  (same micro batch, as the gradient of its mean loss / accum); pytorch and InfiniTrain (its
  `--precision_check` dumps). With Adam's sign-only parameter gradients they still locate a
  backward defect by magnitude.
- `grads`: every parameter's gradient of step 1 (the whole step: all micro batches and ranks).
  `grad_kind` says how it was obtained: "exact" (read from the framework), "sgd-recovered"
  ((w0 - w1)/lr after one SGD step, with `grad_precision` per tensor) or "adam-sign" (only the
  sign survives Adam's first step).
- `loss`: the step-1 loss as the framework logs it; `token_losses` (reference only) lets the
  logging precision of other frameworks be emulated.
- `tie_parts` (reference only): for a tied tensor, the gradient its embedding use alone gives
  (the rest is the output head's), so a lost tie can be recognised.
- `param_order`: canonical parameter names in the order the forward pass first uses them,
  `module_kind`: the reference module type owning each (LayerNorm, Linear, ...).

Saved as one .npz (`fwd/NAME`, `outgrad/NAME`, `grad/NAME`, `prec/NAME`, `tie/NAME`, `token_losses`, and a JSON
`meta`), written by rank 0 of whichever process made it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from lockstep.errors import FormatError

GRAD_EXACT = "exact"
GRAD_SGD_RECOVERED = "sgd-recovered"
GRAD_ADAM_SIGN = "adam-sign"


@dataclass
class StepCapture:
    framework: str
    loss: float | None = None
    forward: dict[str, np.ndarray] = field(default_factory=dict)
    forward_order: list[str] = field(default_factory=list)
    # The gradient arriving at each module's output (same micro batch and names as `forward`), as
    # the gradient of that micro batch's mean loss / accum: what the framework's backward passes on.
    output_grads: dict[str, np.ndarray] = field(default_factory=dict)
    grads: dict[str, np.ndarray] = field(default_factory=dict)
    grad_kind: str = GRAD_EXACT
    grad_precision: dict[str, float] = field(default_factory=dict)  # bound on ||error|| / ||g||, per tensor
    tie_parts: dict[str, np.ndarray] = field(default_factory=dict)  # tensor -> its embedding-use gradient
    token_losses: np.ndarray | None = None  # (micro steps, tokens) FP32 per-token losses of step 1
    param_order: list[str] = field(default_factory=list)
    module_kind: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def save(self, path: str | os.PathLike) -> None:
        arrays: dict[str, np.ndarray] = {}
        for name, a in self.forward.items():
            arrays[f"fwd/{name}"] = np.asarray(a, dtype=np.float32)
        for name, a in self.grads.items():
            arrays[f"grad/{name}"] = np.asarray(a, dtype=np.float32)
        for name, a in self.output_grads.items():
            arrays[f"outgrad/{name}"] = np.asarray(a, dtype=np.float32)
        for name, a in self.tie_parts.items():
            arrays[f"tie/{name}"] = np.asarray(a, dtype=np.float32)
        if self.token_losses is not None:
            arrays["token_losses"] = np.asarray(self.token_losses, dtype=np.float32)
        meta = {"framework": self.framework, "loss": self.loss, "forward_order": self.forward_order,
                "grad_kind": self.grad_kind, "grad_precision": self.grad_precision, "param_order": self.param_order,
                "module_kind": self.module_kind, "notes": self.notes, "meta": self.meta}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        tmp = f"{path}.tmp.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "StepCapture":
        try:
            z = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise FormatError(path, f"is not a lockstep diagnose capture ({e})") from None
        with z:
            if "meta" not in z.files:
                raise FormatError(path, "is not a lockstep diagnose capture (no meta entry)")
            meta = json.loads(bytes(z["meta"]).decode())
            cap = cls(framework=meta["framework"], loss=meta.get("loss"), forward_order=meta.get("forward_order", []),
                      grad_kind=meta.get("grad_kind", GRAD_EXACT), grad_precision=meta.get("grad_precision", {}),
                      param_order=meta.get("param_order", []), module_kind=meta.get("module_kind", {}),
                      notes=meta.get("notes", []), meta=meta.get("meta", {}))
            for key in z.files:
                kind, _, name = key.partition("/")
                if kind == "fwd":
                    cap.forward[name] = z[key]
                elif kind == "grad":
                    cap.grads[name] = z[key]
                elif kind == "outgrad":
                    cap.output_grads[name] = z[key]
                elif kind == "tie":
                    cap.tie_parts[name] = z[key]
                elif key == "token_losses":
                    cap.token_losses = z[key]
        return cap
