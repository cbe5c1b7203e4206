"""The `infinitrain` framework: an external InfiniTrain build's example executables (runner.py),
one small adapter per model family (families.py)."""

from lockstep.runners.infinitrain.runner import InfiniTrainRunner

__all__ = ["InfiniTrainRunner"]
