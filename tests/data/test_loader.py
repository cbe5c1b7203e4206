"""The contract's data order (docs/reference/training-contract.md#data) on a synthetic stream, where a token's value is its
position: every micro batch's first token says exactly which window it read."""

from __future__ import annotations

import numpy as np
import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.data.loader import TokenBatches
from support import defects


def case(B=2, T=8, dp=2, total=64, steps=3) -> CaseSpec:
    return CaseSpec(name="order", model="gpt2", dtype="float32", micro_batch=B, seq_len=T, total_batch=total,
                    steps=steps, lr=1e-4, dp=dp)


def windows(c: CaseSpec) -> dict[tuple[int, int, int], int]:
    """(step, micro, dp_rank) -> the token position the micro batch starts at, read from the data."""
    tokens = np.arange((c.steps + 1) * c.total_batch + 1)  # token value = its position; room for a late read
    out = {}
    for rank in range(c.dp):
        batches = TokenBatches(tokens, c, dp_rank=rank)
        for step in range(c.steps):
            for micro in range(c.accum):
                x, y = batches.micro_batch(step, micro)
                # Rows are consecutive T-token windows, labels the same shifted by one.
                assert np.array_equal(x.numpy().reshape(-1), np.arange(int(x[0, 0]), int(x[0, 0]) + c.micro_batch * c.seq_len))
                assert np.array_equal(y.numpy(), x.numpy() + 1)
                out[(step, micro, rank)] = int(x[0, 0])
    return out


def test_order_is_llmc_distributed_loader_without_wraparound():
    c = case()  # B=2, T=8, DP=2, 64 tokens/step -> accum 2
    assert c.accum == 2
    # docs/reference/training-contract.md#data, written out: step-major, then micro step, then DP rank, B*T tokens each.
    expected = {(s, m, r): ((s * 2 + m) * 2 + r) * 16 for s in range(3) for m in range(2) for r in range(2)}
    assert windows(c) == expected
    # Every token of the steps is read exactly once.
    assert sorted(windows(c).values()) == list(range(0, 3 * 64, 16))


def test_order_check_catches_a_window_one_micro_batch_late(monkeypatch):
    c = case()
    clean = windows(c)
    defects.inject("data_order_off_by_one", monkeypatch)
    late = windows(c)
    assert all(late[k] == clean[k] + 16 for k in clean)
    assert late != clean


def test_a_window_past_the_end_is_an_error_not_a_short_batch():
    c = case()
    batches = TokenBatches(np.arange(3 * 64), c, dp_rank=1)  # one token short of the last label
    with pytest.raises(IndexError, match="runs past the end"):
        batches.micro_batch(2, 1)
