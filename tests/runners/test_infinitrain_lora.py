"""LoRA cases on InfiniTrain (runners/infinitrain/lora.py): its --lora_* flags, lockstep's one init
handed to it as --lora_load_path, the log check that the load took; and, with a build
(`LOCKSTEP_INFINITRAIN_BUILD`), gpt2-tiny and llama3-tiny LoRA trained by InfiniTrain against
the pytorch runner from the same adapters (models/lora.py lora_init_tensors), each step within
1e-5 plus InfiniTrain's FP32 loss-sum rounding of that step (docs/reference/infinitrain.md).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from lockstep.cases.spec import CaseSpec, LoraSpec
from lockstep.errors import RunError
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs, case_skip_reason
from lockstep.runners.infinitrain.lora import check_lora_loaded, infinitrain_lora_init
from lockstep.runners.infinitrain.runner import BUILD_ENV_VAR, InfiniTrainRunner
from support.numerics import CONTRACT_LOSS_LIMIT

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

GPT2_TINY, LLAMA3_TINY = SHAPES["gpt2-tiny"].config, SHAPES["llama3-tiny"].config
# InfiniTrain's lora group's first test (scripts/test_config.json at b24d92f): rank 8, alpha 16.
GPT2_LORA = LoraSpec(rank=8, alpha=16.0, target_modules=("c_attn", "attn.c_proj"))
LLAMA3_LORA = LoraSpec(rank=8, alpha=16.0, target_modules=("c_attn", "c_proj", "c_fc", "c_fc2"))
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "infinitrain"


def lora_case(model="gpt2", lora=GPT2_LORA, steps=4, lr=1e-4, tp=1, name="gpt2_lora") -> CaseSpec:
    return CaseSpec(name=name, model=model, dtype="float32", micro_batch=4, seq_len=64, total_batch=256 * tp,
                    steps=steps, lr=lr, tp=tp, lora=lora).check()


def flags_of(cmd: list[str]) -> dict[str, str]:
    out, i = {}, 1
    while i < len(cmd):
        if "=" in cmd[i]:
            k, v = cmd[i][2:].split("=", 1)
            out[k], i = v, i + 1
        else:
            out[cmd[i][2:]], i = cmd[i + 1], i + 2
    return out


def test_lora_flags_name_the_init_beside_the_log(tmp_path):
    inputs = RunInputs(checkpoint=tmp_path / "m.bin", tokens=tmp_path / "t.bin", model=GPT2_TINY, device="cpu")
    flags = flags_of(InfiniTrainRunner(build_dir=tmp_path).command(lora_case(), inputs, run_dir=tmp_path / "out"))
    assert (flags["lora_rank"], flags["lora_alpha"], flags["lora_target_modules"]) == ("8", "16.0", "c_attn,attn.c_proj")
    assert flags["lora_load_path"] == str(tmp_path / "out" / "gpt2_lora.lora_init.bin")
    with pytest.raises(ValueError, match="run_dir"):
        InfiniTrainRunner(build_dir=tmp_path).command(lora_case(), inputs)


def test_tp_lora_is_skipped_saying_why_and_tp1_lora_is_not(tmp_path):
    inputs = RunInputs(checkpoint=tmp_path / "m.bin", tokens=tmp_path / "t.bin", model=GPT2_TINY, device="cuda")
    runner = InfiniTrainRunner(build_dir=tmp_path)
    reason = case_skip_reason(runner, lora_case(tp=2), inputs)
    assert reason == ("InfiniTrain reads one --lora_load_path file into every TP rank, so lockstep's LoRA init "
                      "reaches it at TP=1 only (docs/reference/lora.md)")
    on_cpu = dataclasses.replace(inputs, device="cpu")
    assert case_skip_reason(runner, lora_case(), on_cpu) is None
    # Its step 1 is captured as a plain case's (test_infinitrain_lora_capture.py); a TP case's is not, as it is skipped.
    assert runner.capture_problem(lora_case(), on_cpu) is None
    assert runner.capture_problem(lora_case(tp=2), inputs) == reason


def test_the_init_is_the_references_own_draw_under_infinitrain_names(tiny_checkpoint):
    """The file's tensors are lora_init_tensors' (what the pytorch and megatron runners load), and
    equal lora_init of the real reference model."""
    from lockstep.models import family, load_checkpoint
    from lockstep.models.lora import apply_lora, lora_init

    ckpt = load_checkpoint(tiny_checkpoint)
    model = family("gpt2").reference_class().from_llmc(ckpt.tensors, ckpt.config)
    real = lora_init(apply_lora(model, GPT2_LORA), 42)
    got = infinitrain_lora_init(lora_case(), "gpt2", GPT2_TINY, 42)
    assert list(got) == list(real) == [f"transformer.h.{i}.attn.{m}.lora_{p}" for i in range(2)
                                       for m in ("c_attn", "c_proj") for p in "AB"]
    for name in real:
        assert np.array_equal(got[name], real[name]), name
    assert got["transformer.h.0.attn.c_attn.lora_A"].shape == (8, 96)
    assert not got["transformer.h.0.attn.c_attn.lora_B"].any()
    other = infinitrain_lora_init(lora_case(), "gpt2", GPT2_TINY, 43)["transformer.h.0.attn.c_attn.lora_A"]
    assert not np.array_equal(other, got["transformer.h.0.attn.c_attn.lora_A"])  # the run's seed draws it


def test_its_adapters_come_back_under_the_canonical_names():
    from lockstep.runners.infinitrain.lora import canonical_adapters

    init = infinitrain_lora_init(lora_case(lora=LoraSpec(8, 16.0, ("c_attn", "c_proj"))), "gpt2", GPT2_TINY, 42)
    got = canonical_adapters({**init, "transformer.h.0.attn.c_attn.weight": np.zeros(1)})
    assert sorted(got) == sorted(f"lora_{p}.{w}[{i}]" for i in range(2) for w in ("qkvw", "attprojw", "fcprojw")
                                 for p in "AB")
    assert got["lora_A.fcprojw[1]"] is init["transformer.h.1.mlp.c_proj.lora_A"]


def test_the_log_check_fails_a_load_that_did_not_take(tmp_path):
    log, init = tmp_path / "c.log", tmp_path / "c.lora_init.bin"
    ok = "I1202 main.cc:267] Optimizing 8 LoRA parameters\n"
    check_lora_loaded(ok, log, init, 8)
    with pytest.raises(RunError, match="its model has no parameter transformer.h.0.attn.c_attn.lora_A"):
        check_lora_loaded("W1202 lora_utils.cc:400] LoRA parameter not found in model: "
                          "transformer.h.0.attn.c_attn.lora_A\n" + ok, log, init, 8)
    with pytest.raises(RunError, match="trains 12 LoRA tensors but lockstep's init .* holds 8"):
        check_lora_loaded("I1202 main.cc:267] Optimizing 12 LoRA parameters\n", log, init, 8)
    with pytest.raises(RunError, match="does not say how many LoRA parameters"):
        check_lora_loaded("", log, init, 8)


def test_a_build_that_warns_of_an_unknown_name_fails_the_case(tmp_path):
    """A stand-in executable logging the loader's warning beside real step lines: a failed record."""
    from lockstep.formats.tokens import write_token_stream

    build = tmp_path / "build"
    build.mkdir()
    steps = [ln for ln in (FIXTURES / "gpt2_1.log").read_text().splitlines() if "train loss" in ln][:4]
    script = ("echo 'I1202 main.cc:267] Optimizing 8 LoRA parameters' >&2\n"
              "echo 'W1202 lora_utils.cc:400] LoRA parameter not found in model: transformer.h.1.attn.c_attn.lora_B' >&2\n"
              + "".join(f"echo '{ln}' >&2\n" for ln in steps))
    exe = build / "gpt2"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)
    tokens = tmp_path / "train.bin"
    write_token_stream(tokens, [i % 50000 for i in range(4000)])
    inputs = RunInputs(checkpoint=tmp_path / "m.bin", tokens=tokens, model=GPT2_TINY, device="cpu")
    rec = InfiniTrainRunner(build_dir=build).run(lora_case(), inputs, tmp_path / "out")
    assert not rec.ok and "did not load lockstep's LoRA init" in rec.error
    assert "transformer.h.1.attn.c_attn.lora_B" in rec.error
    assert (tmp_path / "out" / "infinitrain" / "gpt2_lora.lora_init.bin").is_file()


# ---------------------------------------------------------------------- with a build


def real_build_or_skip(executable: str) -> Path:
    build = os.environ.get(BUILD_ENV_VAR)
    if not build:
        pytest.skip(f"{BUILD_ENV_VAR} is not set: no InfiniTrain build to run")
    if not os.access(Path(build) / executable, os.X_OK):
        pytest.skip(f"{BUILD_ENV_VAR}={build} holds no executable {executable}")
    return Path(build)


@pytest.fixture(scope="module")
def llama3_tiny_checkpoint(tmp_path_factory) -> Path:
    from lockstep.models import FAMILIES
    from lockstep.models.init import write_initial_checkpoint

    path = tmp_path_factory.mktemp("llama3_tiny") / "llama3_tiny_seed42.bin"
    write_initial_checkpoint(path, FAMILIES["llama3"], LLAMA3_TINY, seed=42)
    return path


# gpt2 (SGD) at lr 0.1 and llama3 (Adam) at lr 1e-3: the adapters move the loss by well over the
# threshold within the steps, so a wrong scale, target or frozen weight shows.
REAL = {"gpt2": dict(model="gpt2-tiny", lora=GPT2_LORA, lr=0.1, config=GPT2_TINY),
        "llama3": dict(model="llama3-tiny", lora=LLAMA3_LORA, lr=1e-3, config=LLAMA3_TINY)}


@pytest.mark.parametrize("family", ["gpt2", "llama3"])
def test_real_infinitrain_lora_trains_like_the_pytorch_runner(request, tmp_path, family):
    from lockstep.models import load_checkpoint
    from lockstep.models.family import split_canonical
    from lockstep.models.lora import is_lora_name
    from lockstep.runners.pytorch import PyTorchRunner
    build = real_build_or_skip(family)
    real = REAL[family]
    checkpoint = (request.getfixturevalue("tiny_checkpoint") if family == "gpt2"
                  else request.getfixturevalue("llama3_tiny_checkpoint"))
    tokens = request.getfixturevalue("tiny_shakespeare_train")
    case = lora_case(real["model"], real["lora"], steps=5, lr=real["lr"], name=f"{family}_lora")
    inputs = RunInputs(checkpoint=checkpoint, tokens=tokens, model=real["config"], device="cpu", timeout_s=600,
                       save_final_params=True)
    rec = InfiniTrainRunner(build_dir=build).run(case, inputs, tmp_path)
    assert rec.ok, rec.error
    ref = PyTorchRunner().run(case, inputs, tmp_path)
    assert ref.ok, ref.error
    ref_losses = ref.losses()
    diffs = [abs(a - b) for a, b in zip(rec.losses(), ref_losses)]
    # 1e-5 plus InfiniTrain's FP32 sequential loss sum's rounding, from the reference's own token losses.
    allowance = [CONTRACT_LOSS_LIMIT + abs(s.loss_fp32_sum - s.loss) for s in ref.steps]
    print(f"{family} LoRA infinitrain {rec.losses()} pytorch {ref_losses} |d| {[f'{d:.2e}' for d in diffs]} "
          f"allowed {[f'{a:.2e}' for a in allowance]}")
    # The adapters move the loss (Adam at lr 1e-3 on llama3-tiny moves it up and down: 11.758, 11.755, 11.818, ...),
    # by far more than the threshold, so a wrong scale, target or frozen weight shows.
    assert max(abs(l - ref_losses[0]) for l in ref_losses) > 100 * CONTRACT_LOSS_LIMIT
    assert all(d <= a for d, a in zip(diffs, allowance)), diffs
    # Its weights after the last step (its own save, read back under canonical names): the base
    # bitwise the init (frozen), the adapters the reference's.
    def final(framework):
        with np.load(tmp_path / framework / f"{case.name}.final.npz") as f:
            return {name: f[name] for name in f.files}

    it_final, pt_final = final("infinitrain"), final("pytorch")
    for name, w0 in split_canonical(load_checkpoint(checkpoint).tensors, real["config"]).items():
        assert np.array_equal(it_final[name], w0), f"frozen parameter trained: {name}"
    adapters = sorted(n for n in pt_final if is_lora_name(n))
    assert sorted(n for n in it_final if is_lora_name(n)) == adapters and len(adapters) == rec.meta["lora_init_tensors"]
    gaps = {n: float(np.max(np.abs(it_final[n] - pt_final[n]))) for n in adapters}
    print(f"{family} LoRA adapters after {case.steps} steps, largest |infinitrain - pytorch|: {max(gaps.values()):.2e}")
    assert max(gaps.values()) < 1e-5, gaps
