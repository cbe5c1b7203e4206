"""The `pytorch` framework: lockstep's own reference trainer (runner.py drives train.py)."""

from lockstep.runners.pytorch.runner import PyTorchRunner

__all__ = ["PyTorchRunner"]
