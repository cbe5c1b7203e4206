"""`lockstep diagnose --at-step N` with megatron-core as a side: megatron starts step N+1 from the
reference's state after step N, written as its own dist_checkpointing step folder
(write_megatron_checkpoint, from the state read under canonical names), and its capture of that
step records the update its optimizer applied, as the reference's does.

The acceptance: pytorch vs megatron agree at step 4 from the state after step 3 (forward,
gradients and the 17 updates); a megatron resume that resets Adam's step count (its bias
correction then that of step 1) is passed by the step-1 diagnose and named the optimizer update
by --at-step 3; and a plain step-1 diagnose carries the update rows too, in agreement. The small
Llama of test_diagnose_at_step.py (L2 C64 V2048, Adam).
"""

from __future__ import annotations

import json
import statistics

import pytest

from lockstep.certify.classify import OPTIMIZER
from lockstep.runners.megatron.runner import megatron_core_installed
from support import at_step, defects

pytestmark = [pytest.mark.skipif(not megatron_core_installed(), reason="megatron-core is not installed"), pytest.mark.integration]

PAIR = "pytorch,megatron"
# Adam (llama3: beta1 0.9, beta2 0.999) whose step count restarts at the load of step 3's state
# bias-corrects step 4 as step 1: each update scaled by (1 - 0.9^4)/(1 - 0.9) * sqrt((1 - 0.999)/(1 - 0.999^4))
# = 1.721 where |m̂| >> eps·sqrt(v̂).
STEP4_RESET_REL = 0.721
VERDICT = "adam_pytorch_vs_megatron"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return at_step.write_inputs(tmp_path_factory.mktemp("at_step_megatron"))


def diagnose(inputs, out, *extra):
    return at_step.diagnose(inputs, out, PAIR, *extra)


def verdict(out, at_step: int = 0) -> dict:
    suffix = f".at_step{at_step}" if at_step else ""
    return json.loads((out / "diagnose" / f"{VERDICT}{suffix}.json").read_text())


def worst(rows: list[dict]) -> float:
    return max(r["rel_error"] for r in rows)


def test_pytorch_and_megatron_agree_at_step_4_from_the_references_state(inputs, tmp_path, capsys):
    assert diagnose(inputs, tmp_path, "--at-step", "3") == 0
    out = capsys.readouterr().out
    assert "no divergence: every module output, gradient and optimizer update agrees" in out
    v = verdict(tmp_path, 3)
    assert (v["at_step"], v["step"], v["findings"]) == (3, 4, [])
    assert len(v["optimizer_updates"]) == 17
    print(f"at step 4: forward {worst(v['forward']):.2e}, gradients {worst(v['gradients']):.2e}, "
          f"updates {worst(v['optimizer_updates']):.2e}, loss {v['loss_step1']['abs_diff']:.2e}")
    # Megatron's step 4 from the reference's state is the reference's: FP32 rounding apart.
    assert worst(v["forward"]) < 1e-5 and worst(v["gradients"]) < 1e-5
    assert worst(v["optimizer_updates"]) < 1e-3
    assert v["loss_step1"]["abs_diff"] < 1e-6
    # The step folder written from the state goes once the capture has loaded it.
    assert not list((tmp_path / "diagnose").rglob("*.reference_state"))


def test_megatrons_adam_step_count_reset_at_load_passes_step_1_and_at_step_3_is_named_the_optimizer_update(
        inputs, tmp_path, capsys, monkeypatch):
    """The defect damages only a resume (megatron's load_training_state, in its workers), so the
    plain step-1 diagnose is also the clean one: its 17 applied-update rows are compared, and agree."""
    defects.worker_env("megatron_resume_step_reset", monkeypatch)

    assert diagnose(inputs, tmp_path / "step1") == 0
    step1 = verdict(tmp_path / "step1")
    assert step1["findings"] == [] and len(step1["optimizer_updates"]) == 17
    print(f"step 1: gradients {worst(step1['gradients']):.2e}, updates {worst(step1['optimizer_updates']):.2e}")
    assert worst(step1["gradients"]) < 1e-5 and worst(step1["optimizer_updates"]) < 1e-3
    assert "optimizer updates of step 1: 17 tensors" in capsys.readouterr().out

    assert diagnose(inputs, tmp_path / "at3", "--at-step", "3") == 1
    out = " ".join(capsys.readouterr().out.split())
    v = verdict(tmp_path / "at3", 3)
    [finding] = v["findings"]
    assert finding["kind"] == OPTIMIZER and finding["where"] == "optimizer"
    assert finding["classification"].startswith("optimizer update of step 4: the forward and the gradients agree")
    assert "17 of 17 tensors" in finding["classification"] and finding["classification"] in out
    assert worst(v["forward"]) < 1e-5 and worst(v["gradients"]) < 1e-5
    rels = sorted(r["rel_error"] for r in v["optimizer_updates"])
    print(f"step-count reset, at step 4: updates {rels[0]:.3f}..{rels[-1]:.3f}")
    assert statistics.median(rels) == pytest.approx(STEP4_RESET_REL, abs=0.02)


@pytest.mark.parametrize("layout, device, native_bf16, reason", [
    ({}, "cpu", False, None),
    ({"tp": 2}, "cpu", False, None),
    ({"zero": 1, "dp": 2}, "cuda", False,
     "megatron cannot start from the reference's state under its distributed optimizer (ZeRO-1)"),
    ({"dtype": "bfloat16"}, "cuda", True, "megatron cannot start from the reference's state in native bf16"),
])
def test_megatron_says_where_it_cannot_start_from_the_references_state(inputs, layout, device, native_bf16, reason):
    """Refused where write_megatron_checkpoint cannot seed its optimizer (ZeRO-1's flat shards,
    native bf16's FP32 main copies), whatever the machine; else as its step-1 capture."""
    from lockstep.cases.spec import CaseSpec
    from lockstep.runners import get_runner
    from lockstep.runners.base import RunInputs

    ckpt, tokens, _ = inputs
    fields = {"dtype": "float32", **layout}
    case = CaseSpec(name="adam", model="llama3", micro_batch=2, seq_len=32, total_batch=64, steps=6, lr=1e-4, **fields)
    runner = get_runner("megatron", native_bf16=True) if native_bf16 else get_runner("megatron")
    problem = runner.at_step_problem(case, RunInputs(ckpt, tokens, at_step.SMALL_LLAMA, device))
    assert problem == reason if reason is None else problem.startswith(reason), problem
