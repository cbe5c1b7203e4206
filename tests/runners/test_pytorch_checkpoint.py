"""The reference trainer's DCP save and resume in one process: the state round-trips, and DCP's
single-process UserWarning is not printed at every save and load (other warnings still are)."""

from __future__ import annotations

import warnings

import torch

from lockstep.runners.pytorch import checkpoint
from lockstep.runners.pytorch.checkpoint import ResumePlan, SavePlan, load_training_state, save_training_state


def test_save_and_load_round_trip_without_dcps_single_process_warning(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        folder = save_training_state(SavePlan(str(tmp_path), interval=1), 1, model, optimizer)
        again = torch.nn.Linear(3, 2)
        shift = load_training_state(ResumePlan(str(folder), 1), again, torch.optim.AdamW(again.parameters(), lr=1e-3))
    assert shift == 0 and torch.equal(again.weight, model.weight)
    assert [str(w.message) for w in caught if "torch.distributed is disabled" in str(w.message)] == []


def test_only_that_warning_is_filtered():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with checkpoint._single_process_dcp():
            warnings.warn("torch.distributed is disabled, unavailable or uninitialized, assuming ...", UserWarning)
            warnings.warn("something else about the checkpoint", UserWarning)
    assert [str(w.message) for w in caught] == ["something else about the checkpoint"]
