"""`lockstep diagnose --at-step N`: step N+1 compared from inside, every framework starting it from
the reference's state after step N (stepcheck/state.py).

The acceptance: a defect that first shows after step 1 -- pytorch-fast's Adam bias-correcting every
update as step 1 does (tests/support/defects.py) -- passes the step-1 comparison (its certificate
holds, diagnose finds nothing), and `--at-step 5` names the optimizer update, from the rows of the
update each optimizer applied. A Llama 3 family model (Adam) of a small vocabulary: llama3-tiny's
real 128,256 rows make one CPU diagnose take over a minute.
"""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest

from lockstep.certify.certificate import certify
from lockstep.certify.classify import OPTIMIZER
from lockstep.formats.step_capture import StepCapture
from support import at_step, defects

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

# Adam (llama3: beta1 0.9, beta2 0.999) bias-corrected as step 1 at step 6 scales each update by
# (1 - 0.9^6)/(1 - 0.9) * sqrt((1 - 0.999)/(1 - 0.999^6)) = 1.915 where |m̂| >> eps·sqrt(v̂).
STEP6_DEFECT_REL = 0.915


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return at_step.write_inputs(tmp_path_factory.mktemp("at_step"))


def diagnose(inputs, out, *extra, frameworks="pytorch,pytorch-fast"):
    return at_step.diagnose(inputs, out, frameworks, *extra)


def test_a_defect_after_step_1_passes_step_1_and_at_step_5_is_named_the_optimizer_update(inputs, tmp_path, capsys,
                                                                                          monkeypatch):
    defects.inject("fast_adam_bias_correction_step1", monkeypatch)

    assert diagnose(inputs, tmp_path / "step1") == 0
    out = capsys.readouterr().out
    assert "no divergence" in out and "at step 1, from the same initial weights" in out
    step1 = json.loads((tmp_path / "step1" / "diagnose" / "adam_pytorch_vs_pytorch-fast.json").read_text())
    assert step1["findings"] == [] and step1["at_step"] == 0
    # Step 1's applied updates are compared too, and agree: the defect's bias correction is right at step 1.
    assert len(step1["optimizer_updates"]) == 17 and max(r["rel_error"] for r in step1["optimizer_updates"]) < 1e-3
    # The certificate `lockstep run` would make of the same step 1 (its sketches) holds.
    kept = tmp_path / "step1" / "diagnose"
    cert = certify(StepCapture.load(kept / "pytorch_adam_step1.npz"), StepCapture.load(kept / "pytorch-fast_adam_step1.npz"),
                   _case(step1))
    assert cert.holds and cert.findings == [] and cert.compared["optimizer updates"] == 17

    assert diagnose(inputs, tmp_path / "at5", "--at-step", "5") == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "at step 6, from the reference's state after step 5" in out
    v = json.loads((tmp_path / "at5" / "diagnose" / "adam_pytorch_vs_pytorch-fast.at_step5.json").read_text())
    assert (v["at_step"], v["step"], v["compared"]) == (5, 6, "at step 6, from the reference's state after step 5")
    [finding] = v["findings"]
    assert finding["kind"] == OPTIMIZER and finding["where"] == "optimizer"
    assert finding["classification"].startswith("optimizer update of step 6: the forward and the gradients agree")
    assert "17 of 17 tensors" in finding["classification"] and finding["classification"] in out
    # From the same state the step's forward and gradients agree (SDPA and the reference's attention
    # differ in rounding only); every update row is ~1.9x the reference's.
    assert max(r["rel_error"] for r in v["forward"] + v["gradients"]) < 1e-5
    rels = [r["rel_error"] for r in v["optimizer_updates"]]
    assert len(rels) == 17 and all(0.85 < r < 1.0 for r in rels), rels
    assert statistics.median(rels) == pytest.approx(STEP6_DEFECT_REL, abs=0.01)
    assert v["loss_step1"]["abs_diff"] < 1e-6  # the step-6 loss: before the update, it agrees
    # The certificate of the at-step captures: its update rows are what fails.
    kept = tmp_path / "at5" / "diagnose"
    cert = certify(StepCapture.load(kept / "pytorch_adam_step6.npz"), StepCapture.load(kept / "pytorch-fast_adam_step6.npz"),
                   _case(v))
    assert not cert.holds and cert.cause.kind == OPTIMIZER and cert.compared["optimizer updates"] == 17
    assert cert.worst["optimizer updates"].rel > 0.85 and cert.worst["gradients"].rel < 1e-5
    # The reference's state (its DCP folder) is removed once loaded; its record of steps 1..5 stays.
    state = kept / "at_step_5" / "pytorch"
    assert not list(state.glob("*.checkpoints")) and (state / "adam_to_step5.jsonl").is_file()


def test_the_same_pair_without_the_defect_agrees_at_step_3_updates_included(inputs, tmp_path, capsys):
    assert diagnose(inputs, tmp_path, "--at-step", "3") == 0
    out = capsys.readouterr().out
    assert "no divergence: every module output, gradient and optimizer update agrees" in out
    v = json.loads((tmp_path / "diagnose" / "adam_pytorch_vs_pytorch-fast.at_step3.json").read_text())
    assert v["findings"] == [] and len(v["optimizer_updates"]) == 17
    # The fused Adam's update rounds as the reference's does, to within w's FP32 rounding.
    assert max(r["rel_error"] for r in v["optimizer_updates"]) < 1e-3
    assert any(n.startswith("at step 4, from the reference's state after step 3") for n in v["notes"])
    # Step 4 from the state is step 4 of the run that never stopped: the same weights, Adam state
    # and data window (its loss bitwise the uninterrupted run's, not step 1's window again).
    uninterrupted = _uninterrupted_losses(inputs, tmp_path / "run", steps=4)
    assert v["loss_step1"]["reference"] == uninterrupted[4] != uninterrupted[1]
    reference_steps = [json.loads(line) for line in
                       (tmp_path / "diagnose" / "at_step_3" / "pytorch" / "adam_to_step3.jsonl").read_text().splitlines()[1:]]
    assert [s["loss"] for s in reference_steps] == [uninterrupted[k] for k in (1, 2, 3)]


def test_a_schedule_one_step_late_is_named_the_learning_rate_of_the_step(inputs, tmp_path, capsys, monkeypatch):
    """pytorch-fast's Adam one step behind a warm-up of 3 from 0 (then cosine): from the reference's
    state after step 2, step 3 trains at step 2's lr, every update 1/2 of the expected."""
    from lockstep.cases.matrix import load_matrix
    from lockstep.certify.classify import LR_SCHEDULE

    ckpt, tokens, matrix = inputs
    scheduled = tmp_path / "scheduled.toml"
    scheduled.write_text(matrix.read_text() + '\n[case.lr_schedule]\nlr_decay_style = "cosine"\n'
                         'lr_warmup_iters = 3\nmin_lr = 1e-5\n')
    [case] = load_matrix(str(scheduled))
    defects.inject_late_schedule(case, monkeypatch)

    assert at_step.diagnose((ckpt, tokens, scheduled), tmp_path, "pytorch,pytorch-fast", "--at-step", "2") == 1
    out = " ".join(capsys.readouterr().out.split())
    v = json.loads((tmp_path / "diagnose" / "adam_pytorch_vs_pytorch-fast.at_step2.json").read_text())
    [finding] = v["findings"]
    assert (finding["kind"], finding["where"]) == (LR_SCHEDULE, "lr schedule")
    line = finding["classification"]
    assert line.startswith("learning rate of step 3: forward and gradients agree, and every update the optimizer "
                           "applied is 0.5x the expected (17 of 17 tensors"), line
    assert line.endswith("step 3 trained at lr 3.33333e-05, the contract's lr of step 2, not its own 6.66667e-05: "
                         "the lr schedule runs 1 step late") and line in out


@pytest.mark.parametrize("extra, frameworks, sentence", [
    (["--at-step", "6"], "pytorch,pytorch-fast",
     "--at-step 6: case adam trains 6 steps, so the latest state it can start from is the one after step 5"),
    (["--at-step", "-1"], "pytorch,pytorch-fast",
     "--at-step -1: a step cannot be negative (0, or no --at-step, compares step 1)"),
])
def test_an_at_step_that_cannot_be_done_is_one_sentence_before_anything_trains(inputs, tmp_path, capsys, extra,
                                                                                frameworks, sentence):
    assert diagnose(inputs, tmp_path, *extra, frameworks=frameworks) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(f"lockstep: error: {sentence}") and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err and not (tmp_path / "diagnose" / "at_step_2").exists()


def test_infinitrain_starts_adam_cases_from_the_state_but_not_lora_ones(inputs):
    """It starts SGD and Adam families from the state (tests/runners/test_infinitrain_at_step.py: Adam's moments in
    its own parameter order), not a LoRA case, whose adapters the reference's state does not hold apart."""
    from lockstep.runners import get_runner

    from lockstep.cases.spec import CaseSpec, LoraSpec
    from lockstep.runners.base import RunInputs

    ckpt, tokens, _ = inputs
    case = CaseSpec(name="adam", model="llama3", dtype="float32", micro_batch=2, seq_len=32, total_batch=64, steps=6,
                    lr=1e-4)
    runner, run_inputs = get_runner("infinitrain"), RunInputs(ckpt, tokens, at_step.SMALL_LLAMA, "cpu")
    assert runner.at_step_problem(case, run_inputs) is None
    lora = dataclasses.replace(case, lora=LoraSpec(rank=8, alpha=16.0, target_modules=("c_attn",)))
    assert runner.at_step_problem(lora, run_inputs).startswith("InfiniTrain cannot start a LoRA case")


def _uninterrupted_losses(inputs, out, steps: int) -> dict[int, float]:
    from lockstep.runners.base import RunInputs
    from lockstep.runners.pytorch import PyTorchRunner

    ckpt, tokens, _ = inputs
    case = dataclasses.replace(_case({"case": "adam", "dtype": "float32"}), steps=steps)
    record = PyTorchRunner().run(case, RunInputs(ckpt, tokens, at_step.SMALL_LLAMA, "cpu"), out)
    assert record.ok, record.error
    return {s.step: s.loss for s in record.steps}


def _case(verdict: dict):
    from lockstep.cases.spec import CaseSpec

    return CaseSpec(name=verdict["case"], model="llama3", dtype=verdict["dtype"], micro_batch=2, seq_len=32,
                    total_batch=64, steps=6, lr=1e-4)
