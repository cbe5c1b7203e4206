"""The `megatron` framework: NVIDIA megatron-core's GPTModel built from the LLMC weights.

runner.py (parent process, never imports megatron-core) launches worker.py under torchrun;
the worker uses model.py (TransformerConfig, GPTModel chunks, DDP, optimizer), weights.py
(LLMC -> Megatron layout, sharded for TP/PP), dataset.py (indexed dataset + GPTDataset with
the identity shuffle), parallel.py (the process grid) and, without CUDA, cpu_shims.py.
"""

from lockstep.runners.megatron.runner import MegatronRunner

__all__ = ["MegatronRunner"]
