"""Persistent workers (runners/workers.py) on CPU: one torchrun group of world size 2 per framework
runs cases of different shapes, models and layouts (megatron DP=2, TP=2, PP=2 on gpt2-tiny and
llama3-tiny; pytorch DP=2 with and without accumulation, ZeRO-1 on llama3-tiny), and every loss is bitwise the loss of
the same case run in a process of its own. Faults injected by case name (support/worker_faults.py)
show that a case failing inside the workers fails alone while the group takes the next case, and
that a group that dies (a rank exits; a case hangs past its timeout) fails only the running case,
the next one starting a fresh group.

Each group is started once per module (the runs are module fixtures); cases train 3 short steps.
"""

from __future__ import annotations

import dataclasses
import struct

import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs
from lockstep.runners.pytorch import PyTorchRunner
from support import worker_faults

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

FAULTS = {"m_raises": "raise", "m_dies": "exit_rank1", "p_raises": "raise", "p_hangs": "hang"}
HANG_TIMEOUT_S = 6.0  # the hanging case runs in a warm group: step 1 takes well under a second


def case(name: str, model: str, B: int = 2, total: int = 128, lr: float = 1e-3, **parallel) -> CaseSpec:
    return CaseSpec(name=name, model=model, dtype="float32", micro_batch=B, seq_len=32, total_batch=total, steps=3,
                    lr=lr, **parallel)


@pytest.fixture(scope="module")
def models(tiny_checkpoint, llama3_tiny_checkpoint, training_tokens) -> dict[str, RunInputs]:
    # GPT-2's token ids are valid Llama 3 ids: one token file serves both models.
    return {"gpt2-tiny": RunInputs(checkpoint=tiny_checkpoint, tokens=training_tokens, model=SHAPES["gpt2-tiny"].config,
                                   device="cpu", model_name="gpt2-tiny"),
            "llama3-tiny": RunInputs(checkpoint=llama3_tiny_checkpoint, tokens=training_tokens,
                                     model=SHAPES["llama3-tiny"].config, device="cpu", model_name="llama3-tiny")}


def bits(record) -> list[bytes]:
    return [struct.pack("<d", s.loss) for s in record.steps]


def run_group(runner, cases, models, out, repeats=1):
    """Every case in one persistent group; returns {case name: [record per repeat that ran]}."""
    pairs = [(c, dataclasses.replace(models[c.model], timeout_s=HANG_TIMEOUT_S) if FAULTS.get(c.name) == "hang"
              else models[c.model]) for c in cases]
    dirs = [out] + [out / "repeats" / str(k) for k in range(2, repeats + 1)]
    started = []
    records = runner.run_many(pairs, dirs, on_start=lambda c, fw: started.append(c.name), persistent=True)
    assert started == [c.name for c in cases for _ in range(len(records[cases.index(c)]))]
    return {c.name: recs for c, recs in zip(cases, records)}


def run_alone(runner, cases, models, out):
    """Each case in a process of its own (what --no-persistent-workers does)."""
    pairs = [(c, models[c.model]) for c in cases]
    return {c.name: recs[0] for c, recs in zip(cases, runner.run_many(pairs, [out], persistent=False))}


@pytest.fixture(scope="module")
def megatron_runs(models, tmp_path_factory):
    pytest.importorskip("megatron.core")
    from lockstep.runners.megatron import MegatronRunner

    group = [case("m_dp2", "gpt2-tiny", dp=2), case("m_raises", "gpt2-tiny", dp=2),
             case("m_tp2", "gpt2-tiny", B=4, tp=2), case("m_tp2_kept", "gpt2-tiny", B=4, tp=2),
             case("m_pp2", "llama3-tiny", B=1, total=64, pp=2),
             case("m_dies", "gpt2-tiny", tp=2), case("m_tp2_again", "gpt2-tiny", B=4, tp=2)]
    with pytest.MonkeyPatch.context() as mp:
        worker_faults.worker_env(FAULTS, mp)
        persistent = run_group(MegatronRunner(), group, models, tmp_path_factory.mktemp("megatron_group"))
    alone = run_alone(MegatronRunner(), [c for c in group if c.name in ("m_dp2", "m_tp2", "m_pp2")], models,
                      tmp_path_factory.mktemp("megatron_alone"))
    return persistent, alone


@pytest.fixture(scope="module")
def pytorch_runs(models, tmp_path_factory):
    group = [case("p_dp2", "gpt2-tiny", dp=2), case("p_raises", "gpt2-tiny", dp=2),
             case("p_accum", "gpt2-tiny", B=1, total=128, dp=2), case("p_hangs", "gpt2-tiny", dp=2),
             case("p_llama_zero1", "llama3-tiny", B=2, dp=2, zero=1)]
    out = tmp_path_factory.mktemp("pytorch_group")
    with pytest.MonkeyPatch.context() as mp:
        worker_faults.worker_env(FAULTS, mp)
        persistent = run_group(PyTorchRunner(), group, models, out, repeats=2)
    # p_dp2 is the group's first case: only later positions can show state left by earlier cases.
    alone = run_alone(PyTorchRunner(), [group[2], group[4]], models, tmp_path_factory.mktemp("pytorch_alone"))
    return persistent, alone, out


def test_megatron_cases_in_one_group_lose_bitwise_what_they_lose_alone(megatron_runs):
    persistent, alone = megatron_runs
    for name in ("m_dp2", "m_tp2", "m_pp2"):
        got, want = persistent[name][0], alone[name]
        assert got.ok and want.ok, (got.error, want.error)
        assert len(got.steps) == 3 and bits(got) == bits(want), (name, got.steps, want.steps)
        assert "persistent_worker" not in want.meta
    assert bits(persistent["m_tp2_again"][0]) == bits(alone["m_tp2"])  # in a fresh group, after one died
    positions = {n: (r[0].meta["persistent_worker"]["group"], r[0].meta["persistent_worker"]["position"])
                 for n, r in persistent.items() if "persistent_worker" in r[0].meta}
    assert positions == {"m_dp2": (1, 1), "m_tp2": (1, 3), "m_tp2_kept": (1, 4), "m_pp2": (1, 5),
                         "m_tp2_again": (2, 1)}, positions


def test_megatron_grid_kept_for_a_case_of_the_same_layout_trains_the_same(megatron_runs):
    """m_tp2's TP=2 grid (its process groups) is kept for m_tp2_kept, the same case under another
    name: bitwise the losses of m_tp2 alone; m_pp2 then makes its own grid, as it would alone."""
    persistent, alone = megatron_runs
    kept = persistent["m_tp2_kept"][0]
    assert kept.ok and bits(kept) == bits(alone["m_tp2"]), (kept.error, kept.steps)
    assert kept.meta["phases"]["start-up"] < persistent["m_tp2"][0].meta["phases"]["start-up"] + 1.0


def test_a_group_says_where_its_start_up_went(megatron_runs):
    """The first case of each group carries the ranks' start-up timeline (runners/workers.py)."""
    persistent, _ = megatron_runs
    first = persistent["m_dp2"][0].meta["worker_startup"]
    assert {"imports", "process group", "megatron-core imports", "ready"} <= set(first["stages"]), first
    assert first["ready_after_s"] >= sum(first["stages"].values()) - 0.01
    assert first["case_waited_s"] >= 0
    assert "worker_startup" in persistent["m_tp2_again"][0].meta  # the fresh group's first case
    assert "worker_startup" not in persistent["m_tp2"][0].meta


def test_megatron_case_failing_in_the_workers_fails_alone_and_the_group_goes_on(megatron_runs):
    persistent, _ = megatron_runs
    failed = persistent["m_raises"][0]
    assert failed.status == "failed" and "injected fault in case m_raises" in failed.error, failed.error
    text = open(failed.source.replace(".jsonl", ".log")).read()
    assert "RuntimeError: injected fault in case m_raises" in text  # the traceback, in that case's log only
    assert "case m_raises" in text and "case m_tp2 " not in text and "case m_dp2 " not in text
    assert persistent["m_tp2"][0].ok  # the next case, in the same group (position 3 above)


def test_megatron_group_that_dies_fails_the_running_case_and_the_next_starts_fresh(megatron_runs):
    persistent, _ = megatron_runs
    died = persistent["m_dies"][0]
    assert died.status == "failed", died.error
    assert "worker group exited with status" in died.error and "last lines of the log" in died.error, died.error
    assert persistent["m_tp2_again"][0].ok


def test_pytorch_dp_group_matches_one_process_per_case_and_isolates_failures(pytorch_runs):
    persistent, alone, out = pytorch_runs
    for name in ("p_accum", "p_llama_zero1"):
        first, second = persistent[name]  # --repeat 2 reuses the group
        assert first.ok and alone[name].ok, (first.error, alone[name].error)
        assert bits(first) == bits(alone[name]) == bits(second), name
    assert bits(persistent["p_dp2"][0]) == bits(persistent["p_dp2"][1])
    assert [r.meta["persistent_worker"]["position"] for r in persistent["p_dp2"]] == [1, 2]
    raised = persistent["p_raises"]
    assert len(raised) == 1 and "injected fault in case p_raises" in raised[0].error  # no repeat after a failure
    assert not (out / "repeats" / "2" / "pytorch" / "p_raises.jsonl").exists()
    assert persistent["p_accum"][0].meta["persistent_worker"] == {
        **persistent["p_accum"][0].meta["persistent_worker"], "group": 1, "position": 4}
    hung = persistent["p_hangs"]
    assert len(hung) == 1 and hung[0].status == "failed" and f"timed out after {HANG_TIMEOUT_S:.0f} s at step 1" in \
        hung[0].error, hung[0].error
    assert persistent["p_llama_zero1"][0].meta["persistent_worker"]["group"] == 2
    log = (out / "pytorch" / "p_accum.log").read_text()
    assert log.count("train loss") == 3 and "p_dp2" not in log  # its own lines only
