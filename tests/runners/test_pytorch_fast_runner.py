"""pytorch-fast on gpt2-tiny, CPU: it trains the same case as the reference and agrees with it.

torch.compile is off here: inductor's first compile of even this tiny model takes minutes on two
shared cores. Measured once with it on (CPU, gpt2-tiny, B=4 T=64 accum 2, 5 steps FP32):
max |Δloss| vs pytorch 2.8e-8. Without compile the difference is SDPA's and the fused SGD's
rounding only; measured here: max |Δloss| 3.2e-8 over 4 steps (B=4 T=64 accum 2). The test allows 1e-6, a tenth of
the FP32 threshold (1e-5), so that a real semantic change (mask, scale, data order, optimizer)
still fails it while kernel rounding does not.
"""

from __future__ import annotations

import pytest
import torch

from lockstep.cases.spec import CaseSpec
from lockstep.models import SHAPES
from lockstep.runners import get_runner
from lockstep.runners.base import RunInputs
from lockstep.runners.pytorch_fast.train import sdpa_causal_attention
from lockstep.models.gpt2.model import causal_attention as gpt2_attention
from lockstep.models.llama3.model import causal_attention as llama3_attention

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

TINY = SHAPES["gpt2-tiny"].config


@pytest.fixture
def inputs(tiny_checkpoint, tiny_shakespeare_train) -> RunInputs:
    return RunInputs(checkpoint=tiny_checkpoint, tokens=tiny_shakespeare_train, model=TINY, device="cpu")


def test_sdpa_kernel_matches_the_reference_attention_with_and_without_gqa():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 16, 4, 8, generator=g) for _ in range(3))
    assert torch.allclose(sdpa_causal_attention(q, k, v), gpt2_attention(q, k, v), atol=1e-6)
    k2, v2 = k[:, :, :2], v[:, :, :2]  # 4 query heads over 2 kv heads
    assert torch.allclose(sdpa_causal_attention(q, k2, v2), llama3_attention(q, k2, v2), atol=1e-6)
    # Causal: the first position attends to itself only.
    assert torch.allclose(sdpa_causal_attention(q, k, v)[:, 0], v[:, 0].reshape(2, 32), atol=1e-6)


def test_pytorch_fast_trains_and_agrees_with_the_reference(inputs, tmp_path):
    case = CaseSpec(name="gpt2_1", model="gpt2", dtype="float32", micro_batch=4, seq_len=64, total_batch=512,
                    steps=4, lr=1e-4)
    ref = get_runner("pytorch").run(case, inputs, tmp_path)
    fast = get_runner("pytorch-fast", compile_model=False).run(case, inputs, tmp_path)
    assert ref.ok and fast.ok, fast.error
    assert [s.step for s in fast.steps] == [1, 2, 3, 4]
    diffs = [abs(a.loss - b.loss) for a, b in zip(ref.steps, fast.steps)]
    assert max(diffs) <= 1e-6, diffs
    assert fast.steps[-1].loss != fast.steps[0].loss  # it trained
    settings = fast.meta["fast_settings"]
    assert settings["attention"].startswith("scaled_dot_product_attention") and settings["tf32"] is False
    assert settings["optimizer_impl"] in ("fused", "foreach") and not settings["torch_compile"]
    assert "torch.compile off" in (tmp_path / "pytorch-fast" / "gpt2_1.log").read_text()


def test_pytorch_fast_skips_parallel_cases(inputs):
    dp2 = CaseSpec(name="gpt2_3", model="gpt2", dtype="float32", micro_batch=4, seq_len=64, total_batch=512,
                   steps=2, lr=1e-4, dp=2)
    assert "single-device" in get_runner("pytorch-fast").skip_reason(dp2, inputs)


def test_a_cases_adam_beta2_is_what_both_trainers_step_with(tmp_path):
    """A case that takes a build's hard-coded beta2 (plan.adopt_hard_coded): the reference and
    pytorch-fast both train with it (the record says so); Adam's first update does not depend on beta2,
    the second does: step 3's loss parts from the contract's by more than the FP32 threshold."""
    import dataclasses

    from lockstep.cases.spec import CaseSpec
    from lockstep.runners import get_runner
    from lockstep.runners.base import RunInputs
    from support import at_step

    ckpt, tokens, _ = at_step.write_inputs(tmp_path)
    inputs = RunInputs(ckpt, tokens, at_step.SMALL_LLAMA, "cpu")
    contract = CaseSpec(name="adam", model="llama3", dtype="float32", micro_batch=2, seq_len=32, total_batch=64,
                        steps=3, lr=1e-3)
    built = dataclasses.replace(contract, name="adam_b095", adam_beta2=0.95).check()
    ref = get_runner("pytorch").run(contract, inputs, tmp_path / "contract")
    runs = {fw: get_runner(fw).run(built, inputs, tmp_path / fw) for fw in ("pytorch", "pytorch-fast")}
    assert ref.ok and all(r.ok for r in runs.values())
    for rec in runs.values():
        assert rec.meta["optimizer"]["beta2"] == 0.95
        assert [s.loss for s in rec.steps[:2]] == pytest.approx([s.loss for s in ref.steps[:2]], abs=1e-6)
        assert abs(rec.steps[2].loss - ref.steps[2].loss) > 1e-5
    fast, reference = runs["pytorch-fast"].steps, runs["pytorch"].steps
    assert max(abs(a.loss - b.loss) for a, b in zip(fast, reference)) < 1e-5
