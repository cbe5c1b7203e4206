"""Case specs and case matrices (TOML): what to train, on how many devices, for how long."""

from lockstep.cases.spec import CaseSpec
from lockstep.cases.matrix import load_matrix, builtin_matrices

__all__ = ["CaseSpec", "load_matrix", "builtin_matrices"]
