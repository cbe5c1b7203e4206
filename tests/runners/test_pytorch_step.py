"""One reference step (runners/pytorch/step.py) for every loop and capture on a reference module:
the training loop, its FP64 evidence run, the step-1 capture (also in FP64) and pytorch-fast's loop.

The test swaps the shared function for a wrapper and sees every path go through it; the
negative control is a planted defect (a loss shifted by one inside the shared forward), which
must move every path's logged loss by exactly that, so that no path keeps a forward of its own.
"""

from __future__ import annotations

import io

import pytest

from lockstep.capture.request import CaptureRequest
from lockstep.cases.spec import CaseSpec
from lockstep.runners.pytorch import step as reference_step
from lockstep.runners.pytorch.train import ProcessGroupInfo, capture_case, train_case, train_fp64
from lockstep.runners.pytorch_fast.train import train_fast

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)


def tiny_case(dp: int = 1) -> CaseSpec:
    return CaseSpec(name="c", model="gpt2", dtype="float32", micro_batch=2, seq_len=32, total_batch=128 * dp, steps=2,
                    lr=1e-4, dp=dp)


def every_path(checkpoint, tokens, tmp_path) -> dict[str, float]:
    """The step-1 logged loss of each path that runs the reference step."""
    ck, tk = str(checkpoint), str(tokens)
    tmp_path.mkdir(parents=True, exist_ok=True)
    losses = {}
    recs = []
    info = train_case(tiny_case(), ck, tk, "cpu", ProcessGroupInfo(), recs.append, io.StringIO(),
                      capture=CaptureRequest(path=str(tmp_path / "inrun.npz"), full=True))
    assert "step1_capture_error" not in info, info
    losses["train"] = recs[0].loss
    losses["capture"] = capture_case(tiny_case(dp=2), ck, tk, "cpu",
                                     CaptureRequest(path=str(tmp_path / "cap.npz"), full=True)).loss
    losses["capture fp64"] = capture_case(tiny_case(), ck, tk, "cpu", CaptureRequest(path=str(tmp_path / "c64.npz")),
                                          float64=True).loss
    losses["train fp64"] = train_fp64(tiny_case(), ck, tk, "cpu")[0].loss
    recs = []
    train_fast(tiny_case(), ck, tk, "cpu", recs.append, io.StringIO(), compile_model=False)
    losses["pytorch-fast"] = recs[0].loss
    return losses


def test_every_loop_and_capture_runs_the_one_reference_step(tiny_checkpoint, training_tokens, tmp_path, monkeypatch):
    calls: list[tuple[int, bool]] = []
    original_step, original_losses = reference_step.contract_step, reference_step.token_losses

    def counting(micro_batches, losses_of, divisor, optimizer=None, before_update=None):
        calls.append((divisor, optimizer is not None))
        return original_step(micro_batches, losses_of, divisor, optimizer, before_update)

    monkeypatch.setattr(reference_step, "contract_step", counting)
    clean = every_path(tiny_checkpoint, training_tokens, tmp_path / "clean")
    # Accum 2. train: 2 steps; capture DP 2: one step of accum·DP 4, no update; capture fp64: one;
    # train fp64: 2 steps; pytorch-fast: 2 steps.
    assert calls == [(2, True), (2, True), (4, False), (2, False), (2, True), (2, True), (2, True), (2, True)]
    # The FP64 capture and the FP64 evidence run's step 1 are one step: one loss, to the bit.
    assert clean["capture fp64"] == clean["train fp64"]

    # The negative control: a defect planted in the shared forward reaches every path.
    def shifted(model, x, y, bf16, observe=None):
        return original_losses(model, x, y, bf16, observe) + 1.0

    monkeypatch.setattr(reference_step, "token_losses", shifted)
    defective = every_path(tiny_checkpoint, training_tokens, tmp_path / "defective")
    assert set(defective) == set(clean)
    for path, loss in defective.items():
        assert loss - clean[path] == pytest.approx(1.0, abs=1e-5), path


def test_a_trainable_parameter_without_a_gradient_takes_the_step_with_zero():
    """docs/reference/training-contract.md#every-parameter-takes-every-step: a trainable parameter
    the forward never used gets g = 0 and Adam steps it (its step count, its moments decayed); a
    frozen one (a LoRA base weight) stays without a gradient and untouched. Negative control: torch's
    own skip, `zero_missing_gradients` off, leaves the unused parameter a step behind."""
    import torch

    def two_steps(fill: bool):
        torch.manual_seed(0)
        used, unused, frozen = (torch.nn.Linear(3, 3, bias=False) for _ in range(3))
        frozen.weight.requires_grad_(False)
        params = [used.weight, unused.weight]
        optimizer = torch.optim.Adam(params, lr=0.1)
        frozen_before = frozen.weight.detach().clone()
        x = torch.ones(2, 3)
        gradients = []

        def losses(mb):
            return (used(mb.x) + (unused(mb.x) if step == 0 else 0) + frozen(mb.x)).sum(dim=1)

        for step in range(2):
            if fill:
                reference_step.contract_step([reference_step.MicroBatch(x, x)], losses, 1, optimizer)
            else:
                right = reference_step.zero_missing_gradients
                reference_step.zero_missing_gradients = lambda opt: 0
                try:
                    reference_step.contract_step([reference_step.MicroBatch(x, x)], losses, 1, optimizer)
                finally:
                    reference_step.zero_missing_gradients = right
            gradients.append(unused.weight.grad)
        assert frozen.weight.grad is None and torch.equal(frozen.weight, frozen_before)
        return [int(optimizer.state[p]["step"]) for p in params], gradients[1], optimizer.state[unused.weight]

    counts, grad, state = two_steps(fill=True)
    assert counts == [2, 2] and torch.equal(grad, torch.zeros(3, 3))
    # g of step 1 is 1 everywhere (the mean over the two rows of x = 1): m = (1 - beta1) * 1 = 0.1; step 2
    # with g = 0 decays it by beta1
    assert torch.allclose(state["exp_avg"], torch.full((3, 3), 0.9 * 0.1))
    counts, grad, state = two_steps(fill=False)
    assert counts == [2, 1] and grad is None
    assert torch.allclose(state["exp_avg"], torch.full((3, 3), 0.1))
