"""pytorch vs megatron-core on step 1: every gradient within 1e-6 relative, every module output
in agreement, for GPT-2 (tied, biases, LayerNorm) and Llama 3 (untied, RMSNorm, GQA, SwiGLU)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.capture.request import CaptureRequest
from lockstep.diagnose.verdict import diagnose_captures
from lockstep.runners import get_runner
from lockstep.formats.tokens import write_token_stream
from lockstep.models import FAMILIES, SHAPES
from lockstep.models.init import write_initial_checkpoint
from lockstep.runners.base import RunInputs
from lockstep.runners.megatron.runner import megatron_core_installed

pytestmark = [pytest.mark.skipif(not megatron_core_installed(), reason="megatron-core is not installed"), pytest.mark.integration]


def tiny_inputs(shape: str, tmp_path):
    """A registered tiny shape's llm.c init (seed 42) and 4,000 random GPT-2-vocabulary tokens."""
    config = SHAPES[shape].config
    family = FAMILIES[config.family]
    ckpt, tokens = tmp_path / "init.bin", tmp_path / "tokens.bin"
    write_initial_checkpoint(ckpt, family, config, seed=42)
    write_token_stream(tokens, np.random.default_rng(0).integers(0, 50257, size=4000), kind=family.name)
    return config, ckpt, tokens


def capture(framework, case, inputs, work_dir, full=True, pool=None):
    """What `lockstep diagnose` asks each runner for (whole tensors), or the certificate's sketches.
    With `pool` (tests/conftest.py), as diagnose does where the runner has persistent workers: the
    one-step run that records step 1, in the session's shared worker group (no megatron start-up)."""
    request = CaptureRequest(path=str(work_dir / f"{framework}_{case.name}.npz"), full=full)
    runner = get_runner(framework)
    if pool is None or pool.group(runner, case, inputs) is None:
        return runner.capture(case, inputs, work_dir, request)
    from lockstep.formats.step_capture import StepCapture

    rec = pool.run(runner, case.with_overrides(steps=1, name=f"{case.name}_step1"),
                   dataclasses.replace(inputs, capture=request, save_final_params=False), work_dir)
    assert rec.ok and rec.meta.get("step1_capture"), rec.error or rec.meta.get("step1_capture_error")
    return StepCapture.load(request.path)


@pytest.mark.parametrize("shape,parallel", [("gpt2-tiny", {}), ("gpt2-tiny", {"tp": 2}), ("llama3-tiny", {})])
def test_pytorch_and_megatron_agree_on_every_gradient(shape, parallel, tmp_path, worker_pool):
    config, ckpt, tokens = tiny_inputs(shape, tmp_path)
    case = CaseSpec(name="c", model=shape, dtype="float32", micro_batch=4, seq_len=64, total_batch=256, steps=1,
                    lr=1e-4, **parallel)
    inputs = RunInputs(checkpoint=ckpt, tokens=tokens, model=config, device="cpu")
    ref = capture("pytorch", case, inputs, tmp_path)
    test = capture("megatron", case, inputs, tmp_path, pool=worker_pool)
    v = diagnose_captures(ref, test, case)
    assert v.findings == [] and v.headline == "no divergence"
    assert len(v.grads) == len(ref.grads)
    assert max(d.rel for d in v.grads) < 1e-6
    names = [d.name for d in v.forward]
    assert names[0] == "embedding" and names[-3:] == ["lnf", "logits", "loss"]
    assert len(names) == 3 + 6 * config.num_layers + 1
    assert max(d.rel for d in v.forward) < 1e-6
    assert abs(v.loss.test - v.loss.ref) < 1e-6


@pytest.mark.slow
def test_one_sequence_micro_batches_keep_megatrons_logits(tmp_path, worker_pool):
    """B=1: megatron hands the loss a view of the captured logits (its [b, s] transpose needs no copy)
    and its vocab-parallel cross entropy turns them into softmax in place; the capture must copy."""
    config, ckpt, tokens = tiny_inputs("qwen3-tiny", tmp_path)
    case = CaseSpec(name="c", model="qwen3-tiny", dtype="float32", micro_batch=1, seq_len=64, total_batch=64,
                    steps=1, lr=1e-5)
    inputs = RunInputs(checkpoint=ckpt, tokens=tokens, model=config, device="cpu")
    v = diagnose_captures(capture("pytorch", case, inputs, tmp_path),
                          capture("megatron", case, inputs, tmp_path, pool=worker_pool), case)
    logits = next(d for d in v.forward if d.name == "logits")
    assert logits.rel < 1e-6 and v.findings == []


@pytest.mark.parametrize("shape,parallel", [("gpt2-tiny", {"tp": 2}), ("llama3-tiny", {"pp": 2})])
def test_the_certificates_sketches_of_megatron_agree_with_pytorchs(shape, parallel, tmp_path, worker_pool):
    """The certificate's capture from inside megatron's training step: each TP rank sketches its
    share of a split output (the attention before its projection, the vocab-parallel logits), each
    stage its layers, and every micro batch is seen (accum 2), all in the canonical layout."""
    from lockstep.certify.certificate import certify
    from lockstep.formats.step_capture import StepCapture

    config, ckpt, tokens = tiny_inputs(shape, tmp_path)
    case = CaseSpec(name="c", model=shape, dtype="float32", micro_batch=4, seq_len=64, total_batch=512, steps=1,
                    lr=1e-4, **parallel)
    inputs = RunInputs(checkpoint=ckpt, tokens=tokens, model=config, device="cpu")
    ref = StepCapture.load(capture("pytorch", case, inputs, tmp_path, full=False).source)
    test = capture("megatron", case, inputs, tmp_path, full=False, pool=worker_pool)
    cert = certify(ref, test, case)
    assert cert.holds, cert.summary_line()
    assert cert.compared["module outputs"] == 3 + 6 * config.num_layers + 1
    assert cert.compared["later micro batches"] == 3 + 6 * config.num_layers + 1  # micro batch 1, sketched
    assert cert.compared["gradients"] == len(ref.names("grad"))
    assert max(d.rel for d in cert.worst.values() if d is not None) < 1e-6


@pytest.mark.slow
def test_micro_batches_handed_the_wrong_activation_are_named(tmp_path, monkeypatch):
    """Issue 22's class, named by the certificate itself: PP=2 x VPP=2 with megatron-core's batched
    p2p (the old CUDA setting) swaps an activation and a gradient in the steady state. Micro batch 0
    agrees everywhere; a later one differs from a module on -- micro batches paired wrong, not a
    module that computes wrong."""
    from lockstep.certify.certificate import certify
    from lockstep.certify.classify import MICRO_BATCH
    from lockstep.formats.step_capture import StepCapture
    from support import defects

    config, ckpt, tokens = tiny_inputs("qwen3-tiny", tmp_path)
    case = CaseSpec(name="c", model="qwen3-tiny", dtype="float32", micro_batch=2, seq_len=64, total_batch=512, steps=1,
                    lr=1e-5, pp=2, vpp=2)
    inputs = RunInputs(checkpoint=ckpt, tokens=tokens, model=config, device="cpu")
    ref = StepCapture.load(capture("pytorch", case, inputs, tmp_path, full=False).source)
    defects.worker_env("megatron_batched_p2p", monkeypatch)
    cert = certify(ref, capture("megatron", case, inputs, tmp_path, full=False), case)
    assert not cert.holds and cert.findings[0].kind == MICRO_BATCH, [f.line for f in cert.findings]
    assert "every module output of micro batches 0 and 1 agrees, but on micro batch 2 ln1[1]'s output differs" in \
        cert.findings[0].line  # the warm-up sends one way only; the steady state swaps (shared/docs finding)
    first_forward = cert.worst["module outputs"]
    assert first_forward.rel < 1e-6  # micro batch 0: every output agrees
