"""The small GPT-2 recompute matrix the twin tests run (gpt2-tiny, full recompute of each layer)."""

from __future__ import annotations


def recompute_matrix(micro_batches: int = 1) -> str:
    """One case `rc_uniform1` of `micro_batches` micro batches of 2 x 32 tokens, 2 steps; the run
    adds its twin without recompute."""
    return f"""
[defaults]
model = "gpt2"
dtype = "float32"
seq_len = 32
steps = 2
lr = 1e-4
micro_batch = 2
total_batch = {64 * micro_batches}

[[case]]
name = "rc_uniform1"
activation_recompute = true
recompute_method = "uniform"
recompute_num_layers = 1
"""
