"""The step contract's shared pieces: phases of a run, the logged loss, InfiniTrain's FP32 sum."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from lockstep.step_contract import Phases, fp32_sequential_loss, logged_step_loss


def test_phases_by_block_and_by_lap():
    phases = Phases()
    with phases("weights"):
        time.sleep(0.02)
    time.sleep(0.01)
    phases.lap("data")  # since the block ended
    phases.lap("training")
    phases.add("weights", 1.0)
    got = phases.to_dict()
    assert list(got) == ["weights", "data", "training"]  # in the phases' own order
    assert 1.015 < got["weights"] < 1.2 and 0.005 < got["data"] < 0.1 and got["training"] < 0.01
    report = phases.report()
    assert report["case_started_wall"] <= report["case_finished_wall"]
    with pytest.raises(ValueError, match="unknown phase 'loading'"):
        phases.add("loading", 1.0)


def test_logged_loss_is_the_fp64_mean_and_infinitrains_is_the_fp32_running_sum():
    rng = np.random.default_rng(0)
    micro = [torch.from_numpy((10.85 + 0.5 * rng.standard_normal(2560)).astype(np.float32)) for _ in range(2)]
    exact = float(np.mean(np.concatenate([m.numpy() for m in micro]).astype(np.float64)))
    assert logged_step_loss(micro, accum=2) == pytest.approx(exact, abs=1e-12)
    shifted = fp32_sequential_loss([m.numpy() for m in micro])
    assert 1e-7 < abs(shifted - exact) < 1e-4  # 2 x 2,560 FP32 additions up to 2.8e4 (ulp 0.002)
