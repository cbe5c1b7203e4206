"""The canonical training state: what one framework's saved state is under LLMC names, for another
framework's runner to write into its own checkpoint format (`lockstep diagnose --at-step N`, a
resumed case's certificate). A plain type: the reference reads its folders into it
(runners/reference.py), each runner writes it out through its own weight map."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class CanonicalState:
    """The state after `step` steps: FP32 weights and, for Adam, both moments and its step count."""

    step: int
    weights: dict[str, np.ndarray]
    exp_avg: dict[str, np.ndarray] = field(default_factory=dict)  # empty: SGD without momentum has no state
    exp_avg_sq: dict[str, np.ndarray] = field(default_factory=dict)
    adam_step: int | None = None  # the number of Adam updates made (every parameter's, the same)
