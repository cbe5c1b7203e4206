"""LoRA cases trained by the pytorch reference and by megatron-core (lockstep's adapter on its
parallel linears), on the CPU: gpt2-tiny and llama3-tiny, InfiniTrain's lora targets (rank 8 alpha 16
on c_attn,attn.c_proj; rank 4 alpha 8 on c_attn,c_fc,c_proj), TP=1 and TP=2 on megatron, DP=2 on
both; the tiny shapes' layers with a 500/512-token vocabulary. Every step's FP32 loss within 1e-5, a step-1 certificate that holds over every adapter
gradient and the frozen base (sketched, as `lockstep run` keeps it), the adapters after the last
step alike, and every base parameter bitwise its init on both sides.

Negative controls, each the certificate's named finding: megatron's workers leaving the input
LayerNorm weights trainable (frozen parameter trained, and they moved by the end), and the
reference scaling by alpha instead of alpha/rank against megatron's TP=2 capture (LoRA scale).
The in-process controls of every LoRA finding are tests/certify/test_lora_findings.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lockstep.capture.request import CAPTURE_ROWS, CaptureRequest
from lockstep.cases.spec import CaseSpec, LoraSpec
from lockstep.certify.certificate import certify
from lockstep.certify.lora import FROZEN_TRAINED, LORA_SCALE
from lockstep.formats.step_capture import StepCapture
from lockstep.models import SHAPES, load_checkpoint
from lockstep.models.family import split_canonical
from lockstep.runners.base import RunInputs
from lockstep.runners.megatron import MegatronRunner
from lockstep.runners.pytorch import PyTorchRunner
from lockstep.runners.pytorch.train import capture_case
from support import defects
from support.numerics import final_params, share_beyond

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

pytest.importorskip("megatron.core")

FP32_TOLERANCE = 1e-5  # the contract's FP32 loss threshold
# The adapters after 3 steps: SGD (GPT-2) keeps every element within ADAPTER_LIMIT (measured ≤ 2e-11); Adam
# (Llama 3) may move an element whose gradient is rounding noise by up to lr a step from last-bit
# differences, so there only a share ADAM_SHARE of the elements may be beyond it (measured 1.4e-5 at most).
ADAPTER_LIMIT = 1e-6
ADAM_SHARE = 1e-3
STEPS = 3
ATTN = LoraSpec(rank=8, alpha=16.0, target_modules=("c_attn", "attn.c_proj"))  # InfiniTrain's 1_lora
WIDE = LoraSpec(rank=4, alpha=8.0, target_modules=("c_attn", "c_fc", "c_proj"))  # its 4_lora
SHAPE = {"gpt2": "gpt2-tiny", "llama3": "llama3-tiny"}


def lora_case(family: str, spec: LoraSpec, **layout) -> CaseSpec:
    dp = layout.get("dp", 1)
    return CaseSpec(name=f"{family}_r{spec.rank}" + "".join(f"_{k}{v}" for k, v in layout.items()), model=SHAPE[family],
                    dtype="float32", micro_batch=4, seq_len=64, total_batch=256 * dp, steps=STEPS, lr=1e-3, lora=spec,
                    **layout)


# gpt2-tiny's and llama3-tiny's layers with a 512-token vocabulary (Llama also 2 layers, not 4):
# their real 50,257 / 128,256 rows make every logit, capture and comparison 100-250x larger for
# nothing LoRA touches.
GPT2 = dataclasses.replace(SHAPES["gpt2-tiny"].config, vocab_size=500, padded_vocab_size=512)
LLAMA = dataclasses.replace(SHAPES["llama3-tiny"].config, vocab_size=512, num_layers=2)
CONFIG = {"gpt2": GPT2, "llama3": LLAMA}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from lockstep.models import FAMILIES
    from lockstep.models.init import write_initial_checkpoint

    d = tmp_path_factory.mktemp("lora_models")
    for family, config in CONFIG.items():
        write_initial_checkpoint(d / f"{family}_small_seed42.bin", FAMILIES[family], config, seed=42)
    return {family: d / f"{family}_small_seed42.bin" for family in CONFIG}


@pytest.fixture(scope="module")
def training_tokens(tmp_path_factory):
    """Tokens below 500, valid for both vocabularies."""
    from lockstep.formats.tokens import write_token_stream

    path = tmp_path_factory.mktemp("lora_tokens") / "tokens.bin"
    write_token_stream(path, np.random.default_rng(5).integers(0, 500, size=8_000))
    return path


def inputs_for(checkpoints, training_tokens, family: str, capture_path) -> RunInputs:
    return RunInputs(checkpoint=checkpoints[family], tokens=training_tokens, model=CONFIG[family],
                     device="cpu", model_name=SHAPE[family], save_final_params=True,
                     capture=CaptureRequest(path=str(capture_path), rows=CAPTURE_ROWS) if capture_path else None)


@pytest.fixture(scope="module")
def runs(checkpoints, training_tokens, tmp_path_factory, worker_pool):
    """(framework, family, spec, layout) -> (record, capture or None, final params), each run once."""
    out = tmp_path_factory.mktemp("lora_runs")
    made = {}

    def get(framework: str, family: str, spec: LoraSpec, **layout):
        key = (framework, family, spec, tuple(sorted(layout.items())))
        if key not in made:
            c = lora_case(family, spec, **layout)
            world = c.world_size
            d = out / f"{framework}_{c.name}"
            inputs = inputs_for(checkpoints, training_tokens, family, d / "step1.npz" if world == 1 or framework ==
                                "megatron" else None)
            runner = PyTorchRunner() if framework == "pytorch" else MegatronRunner()
            rec = worker_pool.run(runner, c, inputs, d)
            assert rec.ok, rec.error
            cap = StepCapture.load(inputs.capture.path) if inputs.capture else None
            made[key] = (rec, cap, final_params(d, framework, c.name), c)
        return made[key]

    return get


def assert_base_frozen(params: dict, checkpoint, what: str) -> None:
    ckpt = load_checkpoint(checkpoint)
    init = split_canonical(ckpt.tensors, ckpt.config)
    moved = [n for n in init if not np.array_equal(params[n], init[n])]
    assert moved == [], f"{what}: frozen base parameters moved: {moved[:4]}"


# Each family once on one rank and once at TP=2, each target set in each family: every (family, rank,
# layout) path of the mapping, without the combinations that add only CI time.
LAYOUTS = [("gpt2", ATTN, {}), ("gpt2", WIDE, {"tp": 2}), ("llama3", WIDE, {}), ("llama3", ATTN, {"tp": 2})]


@pytest.mark.parametrize("family,spec,layout", LAYOUTS,
                         ids=[f"{f}-r{s.rank}-" + ("tp2" if lay else "tp1") for f, s, lay in LAYOUTS])
def test_megatron_trains_the_reference_lora(runs, checkpoints, family, spec, layout):
    ref, ref_cap, ref_params, ref_case = runs("pytorch", family, spec)
    mega, mega_cap, mega_params, _ = runs("megatron", family, spec, **layout)
    dloss = [abs(a - b) for a, b in zip(ref.losses(), mega.losses())]
    cert = certify(ref_cap, mega_cap, ref_case)
    lora = sorted(n for n in ref_params if n.startswith("lora_"))
    gap = max(float(np.abs(ref_params[n] - mega_params[n]).max()) for n in lora)
    print(f"{family} {spec.label} {layout or 'tp1'}: pytorch {ref.losses()} megatron {mega.losses()}; "
          f"max |dloss| {max(dloss):.3e}; adapters max |Δ| {gap:.2e}; {cert.summary_line()}")
    assert len(mega.losses()) == STEPS and max(dloss) < FP32_TOLERANCE
    assert cert.holds, cert.summary_line()
    assert cert.compared["gradients"] == len(ref_params)  # the base's (zero) and every adapter's
    assert sorted(n for n in mega_params if n.startswith("lora_")) == lora and set(mega_params) == set(ref_params)
    if family == "gpt2":
        assert gap < ADAPTER_LIMIT
    else:
        assert share_beyond({n: ref_params[n] for n in lora}, {n: mega_params[n] for n in lora}, ADAPTER_LIMIT) < ADAM_SHARE
    assert all(np.abs(ref_params[n]).max() > 0 for n in lora)  # B has trained away from zero, A moved
    assert_base_frozen(ref_params, checkpoints[family], "pytorch")
    assert_base_frozen(mega_params, checkpoints[family], "megatron")


def test_data_parallel_lora_agrees(runs):
    """DP=2 on both: DDP (pytorch, torchrun) and megatron's DDP averaging the adapters' gradients."""
    ref, _, ref_params, _ = runs("pytorch", "gpt2", WIDE, dp=2)
    mega, _, mega_params, _ = runs("megatron", "gpt2", WIDE, dp=2)
    one, _, _, _ = runs("pytorch", "gpt2", WIDE)
    dloss = max(abs(a - b) for a, b in zip(ref.losses(), mega.losses()))
    print(f"DP=2 gpt2 {WIDE.label}: pytorch {ref.losses()} megatron {mega.losses()}, max |dloss| {dloss:.3e}")
    assert dloss < FP32_TOLERANCE and ref.losses() != one.losses()  # a batch of its own, not DP=1's
    assert max(float(np.abs(ref_params[n] - mega_params[n]).max()) for n in ref_params) < ADAPTER_LIMIT


def test_a_frozen_weight_megatron_trains_is_named(runs, checkpoints, training_tokens, tmp_path, monkeypatch):
    _, ref_cap, _, ref_case = runs("pytorch", "gpt2", ATTN)
    defects.worker_env("megatron_lora_layernorm_trains", monkeypatch)
    inputs = inputs_for(checkpoints, training_tokens, "gpt2", tmp_path / "step1.npz")
    rec = MegatronRunner().run(ref_case, inputs, tmp_path)  # a process of its own: the defect is in its environment
    assert rec.ok, rec.error
    cert = certify(ref_cap, StepCapture.load(inputs.capture.path), ref_case)
    print(cert.summary_line())
    assert (cert.cause.kind, cert.cause.where) == (FROZEN_TRAINED, "ln1w[0..1]")
    assert "frozen parameter trained: megatron's ln1w[0..1] receive a gradient at step 1" in cert.cause.line
    params = final_params(tmp_path, "megatron", ref_case.name)
    with pytest.raises(AssertionError, match="frozen base parameters moved: \\['ln1w\\[0\\]', 'ln1w\\[1\\]'\\]"):
        assert_base_frozen(params, checkpoints["gpt2"], "megatron")


def test_a_reference_scaled_by_alpha_is_named_against_megatron_tp2(runs, checkpoints, training_tokens, tmp_path,
                                                                    monkeypatch):
    _, mega_cap, _, _ = runs("megatron", "llama3", WIDE, tp=2)
    ref_case = lora_case("llama3", WIDE)
    defects.inject("lora_scale_alpha", monkeypatch)
    broken = capture_case(ref_case, str(checkpoints["llama3"]), str(training_tokens), "cpu",
                          CaptureRequest(path=str(tmp_path / "ref.npz"), rows=CAPTURE_ROWS))
    cert = certify(broken, mega_cap, ref_case)
    print(cert.summary_line())
    assert cert.cause.kind == LORA_SCALE
    assert ("is 0.25x the reference (pytorch)'s (8 tensors, the same direction): the reference (pytorch) scales by "
            "alpha (8) instead of alpha/rank (2)") in cert.cause.line
