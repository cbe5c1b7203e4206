"""The `pytorch-fast` framework: the reference model as a performance-minded PyTorch user trains
it (torch.compile, SDPA attention, a fused optimizer): a throughput anchor, never the baseline."""

from lockstep.runners.pytorch_fast.runner import PyTorchFastRunner

__all__ = ["PyTorchFastRunner"]
