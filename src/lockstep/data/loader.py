"""The training contract's data order (docs/reference/training-contract.md#data), shared by every in-process runner.

Micro step m of step s on DP rank r reads x = tokens[p : p+B*T], y = tokens[p+1 : p+B*T+1]
with p = ((s*accum + m)*DP + r)*B*T (s and m 0-based) -- llm.c's DistributedDataLoader
without wrap-around, and Megatron's GPTDataset with its shuffle index set to the identity.
"""

from __future__ import annotations

import numpy as np
import torch

from lockstep.cases.spec import CaseSpec


def window_start(case: CaseSpec, step: int, micro_step: int, dp_rank: int) -> int:
    """Token offset of a micro batch; `step` is 0-based here."""
    return ((step * case.accum + micro_step) * case.dp + dp_rank) * case.micro_batch * case.seq_len


class TokenBatches:
    """Yields (x, y) int64 tensors of shape (B, T) in the contract's order."""

    def __init__(self, tokens: np.ndarray, case: CaseSpec, dp_rank: int = 0):
        self.tokens = tokens
        self.case = case
        self.dp_rank = dp_rank

    def micro_batch(self, step: int, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.case
        n = c.micro_batch * c.seq_len
        p = window_start(c, step, micro_step, self.dp_rank)
        buf = np.asarray(self.tokens[p : p + n + 1], dtype=np.int64)
        if buf.shape[0] != n + 1:
            # CaseSpec.check(available_tokens=...) rejects such cases before any run starts.
            raise IndexError(f"micro batch at token {p} runs past the end of the token stream")
        t = torch.from_numpy(buf)
        return t[:-1].view(c.micro_batch, c.seq_len), t[1:].view(c.micro_batch, c.seq_len)
