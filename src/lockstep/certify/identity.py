"""Two captures of one step compared bit for bit (`--expect identical`): the first tensor, in the
order a difference propagates -- module outputs in forward order, the gradients arriving at them
in backward order, then the parameter gradients -- whose bytes differ, and by how much.

A certificate's capture keeps each tensor as its linear sketch and exact FP64 norm, computed by
the same code from the tensor's bytes: identical tensors give identical sketches, and a tensor
that differs in any element moves its sketch (a difference that cancels in every bucket of a
random sketch is not a case to plan for). A whole tensor, where the capture holds one, is
compared itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lockstep.formats.step_capture import StepCapture, forward_rank

# (capture kind, what it is called) in the order a difference propagates through a step
ORDER = (("fwd", "module output"), ("outgrad", "output gradient"), ("grad", "gradient"))


@dataclass(frozen=True)
class TensorDifference:
    kind: str  # "module output" | "output gradient" | "gradient"
    name: str
    rel: float  # ||a - b|| / ||a|| (from the sketches where the tensors are not whole)

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "rel_error": self.rel}

    @property
    def line(self) -> str:
        return f"{self.kind} {self.name} (relative {self.rel:.2e})"


def _values(capture: StepCapture, kind: str, name: str) -> tuple[np.ndarray, float | None] | None:
    """The tensor's bytes where it is whole, else its sketch (with its exact norm)."""
    whole = capture.store(kind)
    if name in whole:
        return np.asarray(whole[name]), None
    sketch = capture.sketch(kind, name)
    return (sketch.values, sketch.norm) if sketch is not None else None


def _ordered(capture: StepCapture, kind: str) -> list[str]:
    names = capture.names(kind)
    if kind == "grad" and capture.param_order:
        return [n for n in capture.param_order if n in names] + [n for n in names if n not in capture.param_order]
    if kind == "grad":
        return names
    # Module outputs in the capture's forward order (not the order its file lists them: InfiniTrain's
    # dumps come by file name, `logits` before the first layer's), micro batch by micro batch; the
    # gradients arriving at them in backward order, the last module's first.
    order = capture.forward_order or sorted({n.partition("@")[0] for n in names}, key=forward_rank)
    rank = {name: i for i, name in enumerate(order)}
    sign = -1 if kind == "outgrad" else 1

    def key(name: str) -> tuple:
        base, _, micro = name.partition("@")
        return int(micro or 0), base not in rank, sign * rank.get(base, 0)

    return sorted(names, key=key)


def first_difference(a: StepCapture, b: StepCapture) -> TensorDifference | str | None:
    """The first tensor whose bytes differ; None when every tensor both hold is identical; a sentence
    when the two captures do not hold the same tensors in the same form (nothing to compare bit for bit)."""
    for kind, what in ORDER:
        names = _ordered(a, kind)
        if set(names) != set(b.names(kind)):
            return f"the captures hold different {what}s"
        for name in names:
            va, vb = _values(a, kind, name), _values(b, kind, name)
            if va is None or vb is None or va[0].shape != vb[0].shape or (va[1] is None) != (vb[1] is None):
                return f"the captures hold {what} {name} in different forms"
            if va[0].dtype != vb[0].dtype or not np.array_equal(va[0], vb[0]) or va[1] != vb[1]:
                x, y = va[0].astype(np.float64), vb[0].astype(np.float64)
                norm = float(np.linalg.norm(x))
                return TensorDifference(what, name, float(np.linalg.norm(x - y)) / norm if norm else float("inf"))
    return None
