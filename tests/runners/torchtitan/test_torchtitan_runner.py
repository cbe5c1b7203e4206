"""torchtitan's Trainer against the pytorch reference on the CPU (llama3-tiny, qwen3-tiny).

- Registration: the runner is one package plus one line; GPT-2 and Mixtral say why not.
- Two FP32 steps through torchtitan's own `train.main()` (a worker process, lockstep's config
  module): every step's loss within 1e-5 of the reference's.
- Step 1 from inside (torchtitan's model and loss): the certificate agrees with the reference's
  capture, and with the RoPE pairs of the weight mapping swapped (Q/K rows half-split instead of
  interleaved, Llama 3) it fails and names the first attention.
- Several ranks over gloo: DP (FSDP2 replicate), a ZeRO case (FSDP2 shard, SUM reductions on gloo)
  and TP through torchtitan's own plans, each within 1e-5 of the reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lockstep.capture.request import CaptureRequest
from lockstep.cases.spec import CaseSpec
from lockstep.models import FAMILIES, SHAPES
from lockstep.runners.base import RunInputs
from lockstep.runners.registry import family_gaps, get_runner, specs

pytest.importorskip("torchtitan")
pytest.importorskip("torchdata")

FP32_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def inputs_of(tmp_path_factory, training_tokens):
    from lockstep.models.init import write_initial_checkpoint

    made = {}

    def get(model: str) -> RunInputs:
        if model not in made:
            shape = SHAPES[model]
            path = tmp_path_factory.mktemp(model) / f"{model}_seed42.bin"
            write_initial_checkpoint(path, FAMILIES[shape.family], shape.config, seed=42)
            made[model] = RunInputs(checkpoint=path, tokens=training_tokens, model=shape.config, device="cpu",
                                    model_name=model)
        return made[model]

    return get


def small_case(model: str, steps: int = 2) -> CaseSpec:
    return CaseSpec(name="tt", model=model, dtype="float32", micro_batch=2, seq_len=32, total_batch=128,
                    steps=steps, lr=1e-3)


def test_registered_with_its_families():
    spec = specs()["torchtitan"]
    assert set(spec.capabilities.unsupported_families) == {"gpt2", "mixtral"}
    assert family_gaps(FAMILIES, [spec]) == []


@pytest.mark.integration
@pytest.mark.parametrize("model", ["llama3-tiny", "qwen3-tiny"])
def test_trainer_matches_pytorch(model, inputs_of, tmp_path):
    case, inputs = small_case(model), inputs_of(model)
    ref = get_runner("pytorch").run(case, inputs, tmp_path)
    tt = get_runner("torchtitan").run(case, inputs, tmp_path)
    assert ref.ok and tt.ok, tt.error
    diffs = [abs(a.loss - b.loss) for a, b in zip(ref.steps, tt.steps)]
    print(model, [s.loss for s in tt.steps], f"max |dloss| {max(diffs):.3e}")
    assert len(tt.steps) == case.steps and max(diffs) <= FP32_TOLERANCE
    log = (tmp_path / "torchtitan" / "tt.log").read_text()
    assert "lockstep torchtitan runner" in log and "step    2/2 | train loss" in log


@pytest.mark.integration
@pytest.mark.parametrize("layout", [dict(dp=2), dict(dp=2, zero=1), dict(tp=2)], ids=["dp2", "fsdp2", "tp2"])
def test_several_ranks_on_gloo_match_pytorch(layout, inputs_of, tmp_path):
    import dataclasses

    case = dataclasses.replace(small_case("llama3-tiny"), **layout).check()
    inputs = dataclasses.replace(inputs_of("llama3-tiny"), oversubscribe=True)
    ref = get_runner("pytorch").run(case, inputs, tmp_path)
    tt = get_runner("torchtitan").run(case, inputs, tmp_path)
    assert ref.ok and tt.ok, tt.error
    diffs = [abs(a.loss - b.loss) for a, b in zip(ref.steps, tt.steps)]
    assert len(tt.steps) == case.steps and max(diffs) <= FP32_TOLERANCE, diffs


@pytest.mark.integration
@pytest.mark.parametrize("granularity", ["full", "selective"])
def test_activation_recompute_is_bitwise_its_twin(granularity, inputs_of, tmp_path):
    """torchtitan's own AC policies (every block), asked for by the case's recompute fields."""
    import dataclasses

    twin, inputs = small_case("llama3-tiny"), inputs_of("llama3-tiny")
    recompute = dataclasses.replace(twin, name="rc", activation_recompute=True, recompute_granularity=granularity,
                                    recompute_num_layers=1 if granularity == "full" else 0).check()
    runner = get_runner("torchtitan")
    plain, rc = runner.run(twin, inputs, tmp_path), runner.run(recompute, inputs, tmp_path)
    assert plain.ok and rc.ok, rc.error
    assert [s.loss for s in rc.steps] == [s.loss for s in plain.steps]
    assert f"Applied {'FullAC' if granularity == 'full' else 'SelectiveAC'} activation checkpointing" in (
        tmp_path / "torchtitan" / "rc.log").read_text()


def swap_rope_pairs(monkeypatch):
    """The defect: Q and K rows of every head reordered from interleaved pairs to half-split ones."""
    from lockstep.runners.torchtitan import state_dict

    real = state_dict.from_llmc

    def swapped(tensors, cfg):
        out = real(tensors, cfg)
        hd = cfg.head_dim
        perm = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])
        for key in list(out):
            if key.endswith(("wq.weight", "wk.weight")):
                w = out[key]
                out[key] = w.view(-1, hd, w.shape[1])[:, perm].reshape(w.shape)
        return out

    monkeypatch.setattr(state_dict, "from_llmc", swapped)


@pytest.mark.integration
def test_certificate_agrees_and_names_swapped_rope_pairs(inputs_of, tmp_path, monkeypatch):
    from lockstep.certify.certificate import certify
    from lockstep.runners.pytorch import capture_case

    case, inputs = small_case("llama3-tiny", steps=1), inputs_of("llama3-tiny")
    ref = capture_case(case, str(inputs.checkpoint), str(inputs.tokens), "cpu",
                       CaptureRequest(path=str(tmp_path / "ref.npz")))
    runner = get_runner("torchtitan")
    good = runner.capture(case, inputs, tmp_path, CaptureRequest(path=str(tmp_path / "tt.npz")))
    cert = certify(ref, good, case)
    print(cert.summary_line())
    assert cert.holds, cert.summary_line()
    swap_rope_pairs(monkeypatch)
    bad = runner.capture(case, inputs, tmp_path, CaptureRequest(path=str(tmp_path / "bad.npz")))
    cert = certify(ref, bad, case)
    print(cert.summary_line())
    assert not cert.holds and cert.cause.where.startswith("attn[0]"), cert.summary_line()


def test_an_older_torch_gets_stand_ins_for_what_torchtitan_030_imports(monkeypatch):
    """The device's torch 2.11: no fsdp.DataParallelMeshDims (imported by torchtitan at import time,
    used only on SPMD paths lockstep does not take) and a FlexAttention without
    `separate_full_blocks` (then torchtitan's SDPA module, the same causal math, on CUDA too)."""
    import torch.distributed.fsdp as fsdp
    import torch.nn.attention.flex_attention as flex
    from torchtitan.models.common.attention import ScaledDotProductAttention

    from lockstep.runners.torchtitan import compat, model

    monkeypatch.delattr(fsdp, "DataParallelMeshDims", raising=False)
    compat._mesh_dims()
    with pytest.raises(RuntimeError, match="needs a torch newer than"):
        fsdp.DataParallelMeshDims()
    assert model.flex_attention_current()
    monkeypatch.setattr(flex, "create_block_mask", lambda mask_mod, B, H, Q_LEN, KV_LEN, device="cuda": None)
    assert not model.flex_attention_current()
    assert isinstance(model.attention_config("cuda"), ScaledDotProductAttention.Config)


@pytest.mark.integration
def test_diagnose_at_step_starts_torchtitan_from_the_references_state(tmp_path, capsys, monkeypatch):
    """`diagnose --at-step 3`: the reference's weights and Adam moments go through the weight map into
    torchtitan's model and its own optimizer; step 4's forward, gradients and 17 updates agree. With
    the loaded Adam step count reset (a broken resume) the updates are named the optimizer's."""
    import json

    from lockstep.certify.classify import OPTIMIZER
    from lockstep.runners.torchtitan import capture
    from support import at_step

    inputs = at_step.write_inputs(tmp_path / "in")
    assert at_step.diagnose(inputs, tmp_path / "ok", "pytorch,torchtitan", "--at-step", "3") == 0
    assert "no divergence: every module output, gradient and optimizer update agrees" in capsys.readouterr().out
    v = json.loads((tmp_path / "ok" / "diagnose" / "adam_pytorch_vs_torchtitan.at_step3.json").read_text())
    assert v["findings"] == [] and len(v["optimizer_updates"]) == 17 and v["step"] == 4

    right = capture.start_optimizer

    def step_count_reset(*args, **kwargs):
        optimizer = right(*args, **kwargs)
        for state in optimizer.optimizers[0].state.values():
            state["step"].zero_()
        return optimizer

    monkeypatch.setattr(capture, "start_optimizer", step_count_reset)
    assert at_step.diagnose(inputs, tmp_path / "reset", "pytorch,torchtitan", "--at-step", "3") == 1
    v = json.loads((tmp_path / "reset" / "diagnose" / "adam_pytorch_vs_torchtitan.at_step3.json").read_text())
    [finding] = v["findings"]
    assert finding["kind"] == OPTIMIZER and "17 of 17 tensors" in finding["classification"]
