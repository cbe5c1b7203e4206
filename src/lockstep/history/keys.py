"""What makes two records results of the same case: the inputs a record states it trained on.

A case name (gpt2_1) says which parallel layout and dtype; it does not say how many steps, which
initial weights or which tokens. Trends across commits only mean something between runs of the
same inputs, so the history keys a case by this digest (docs/reference/history-site.md), and the
golden values record it as the case's hash."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

# The record's meta keys that are the case's inputs: what it trains (model, weights), on what
# (tokens), how long and how (the case spec: steps, batch, lr, layout; the optimizer).
INPUT_KEYS = ("case_spec", "model", "optimizer", "checkpoint_sha256", "data_sha256")


# case_spec fields added after records existed, at their defaults: left out of the digest.
MISSING = object()
LATER_DEFAULTS = {"ep": 1, "lr_schedule": None, "activation_recompute": False, "recompute_granularity": "full",
                  "recompute_method": "none", "recompute_num_layers": 0}


def case_inputs_sha256(meta: dict) -> str | None:
    """sha256 of the inputs the record states, or None for a record that states none (a foreign
    log): such a record cannot be told apart from another run of the same case name."""
    inputs = {k: meta.get(k) for k in INPUT_KEYS if meta.get(k) not in (None, "", {})}
    if not inputs:
        return None
    spec = inputs.get("case_spec")
    if isinstance(spec, dict):
        # The display name is not an input; the rest of the spec is (steps, lr, batch, layout).
        # Fields added later at their default (ep = 1, no lr_schedule) leave the digest of older records' cases as it was.
        inputs["case_spec"] = {k: v for k, v in spec.items() if k != "name" and LATER_DEFAULTS.get(k, MISSING) != v}
    model = inputs.get("model")
    if isinstance(model, dict):
        inputs["model"] = {k: v for k, v in model.items() if k != "name"}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def file_sha256(path: str | os.PathLike) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
