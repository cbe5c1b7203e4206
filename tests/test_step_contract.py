"""The step contract's shared pieces: phases of a run, the logged loss, InfiniTrain's FP32 sum."""

from __future__ import annotations

import ast
import inspect
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lockstep.step_contract import WARMUP_STEPS, Phases, after_warmup, fp32_sequential_loss, logged_step_loss


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


# --- the warm-up, defined once ---------------------------------------------------------------------

def test_after_warmup_leaves_out_the_contract_warmup_unless_nothing_is_left():
    assert WARMUP_STEPS == 1
    assert after_warmup([5.0, 2.0, 3.0]) == [2.0, 3.0]
    assert after_warmup([5.0]) == [5.0] and after_warmup([]) == []


def test_every_warmup_default_is_the_contracts():
    from lockstep.cli import build_parser
    from lockstep.compare.options import CompareOptions
    from lockstep.compare.throughput import throughput_of, throughput_over_repeats
    from lockstep.formats.run_record import RunRecord
    from lockstep.history.entries import tokens_per_s_stats

    for f in (RunRecord.mean_tokens_per_s, RunRecord.mean_step_ms, throughput_of, throughput_over_repeats,
              tokens_per_s_stats):
        assert inspect.signature(f).parameters["warmup_steps"].default == WARMUP_STEPS, f.__qualname__
    assert CompareOptions().warmup_steps == WARMUP_STEPS
    assert build_parser().parse_args(["compare", "a", "b"]).warmup_steps == WARMUP_STEPS


def warmup_slices(source: str) -> list[int]:
    """Lines that slice a per-step list from a literal 1 (`times_ms[1:]`): a warm-up written out."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice)
            and isinstance(node.slice.lower, ast.Constant) and node.slice.lower.value == 1 and node.slice.upper is None
            and isinstance(node.value, ast.Name) and any(w in node.value.id for w in ("ms", "tps", "rate", "time"))]


def test_no_training_loop_writes_the_warmup_out():
    runners = Path(__file__).resolve().parents[1] / "src" / "lockstep" / "runners"
    found = {str(p.relative_to(runners)): lines for p in runners.rglob("*.py") if (lines := warmup_slices(p.read_text()))}
    assert found == {}
    # The scan's negative control: the loops' former summary lines.
    assert warmup_slices("measured = times_ms[1:] or times_ms\nr = sum(tps[1:] or tps)\n") == [1, 2]
