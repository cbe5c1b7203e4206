"""A case's needs (LoRA, save/resume) against what each runner implements: one place, one reason."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from lockstep.cases.spec import CaseSpec, CheckpointSpec, LoraSpec
from lockstep.runners import RUNNERS, get_runner
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs, case_skip_reason, unsupported_needs

PLAIN = CaseSpec(name="c", model="gpt2-tiny", dtype="float32", micro_batch=4, seq_len=64, total_batch=256, steps=10,
                 lr=1e-4)
LORA = dataclasses.replace(PLAIN, lora=LoraSpec(rank=8, alpha=16.0, target_modules=("c_attn", "attn.c_proj")))
RESUME = dataclasses.replace(PLAIN, steps=50, checkpoint=CheckpointSpec(save_interval=10, resume_from=30,
                                                                         resume_case="c0"))


# What the runners' own reasons read of the inputs: the family and the device (no file is opened).
CPU_INPUTS = RunInputs(checkpoint=Path("unused.bin"), tokens=Path("unused.bin"), model=SHAPES["gpt2-tiny"].config,
                       device="cpu")

LORA_RUNNERS = {"pytorch", "megatron", "infinitrain"}  # models/lora.py; runners/megatron/lora.py; its --lora_*


# The command runner is a template: its trainers exist once a --command-runner file names them.
@pytest.mark.parametrize("framework", sorted(set(RUNNERS) - {"command"}))
def test_every_runner_says_what_it_lacks_of_lora_and_resume(framework):
    runner = get_runner(framework)
    lora = None if framework in LORA_RUNNERS else f"LoRA cases are not supported by {framework} yet"
    assert unsupported_needs(LORA, runner) == lora
    both = dataclasses.replace(LORA, steps=50, checkpoint=RESUME.checkpoint)
    if framework in LORA_RUNNERS:  # all also save and resume (DCP; dist_checkpointing; InfiniTrain's --save/--load)
        assert unsupported_needs(RESUME, runner) is None
        assert unsupported_needs(both, runner) is None  # LoRA with save/resume: each runner's own reason
        if framework == "pytorch":
            assert case_skip_reason(runner, both, inputs=None) == \
                "the pytorch reference trainer does not save and resume LoRA cases yet"
    else:
        assert unsupported_needs(RESUME, runner) == \
            f"checkpoint (save/resume) cases are not supported by {framework} yet"
        assert unsupported_needs(both, runner) == \
            f"LoRA and checkpoint (save/resume) cases are not supported by {framework} yet"
    assert unsupported_needs(PLAIN, runner) is None


def test_the_need_comes_before_the_runners_own_reasons():
    # A TP LoRA case on pytorch-fast (no LoRA): the need is said before anything of its own.
    tp_lora = dataclasses.replace(LORA, tp=2)
    assert case_skip_reason(get_runner("pytorch-fast"), tp_lora, inputs=None) == \
        "LoRA cases are not supported by pytorch-fast yet"
    # The reference trains LoRA, and a TP case at its DP layout: nothing stops it here ...
    assert case_skip_reason(get_runner("pytorch"), tp_lora, inputs=CPU_INPUTS) is None
    # ... while its own reasons still hold under TP (negative control: a TP LoRA resume case).
    tp_lora_resume = dataclasses.replace(tp_lora, steps=50, checkpoint=RESUME.checkpoint)
    assert case_skip_reason(get_runner("pytorch"), tp_lora_resume, inputs=CPU_INPUTS) == \
        "the pytorch reference trainer does not save and resume LoRA cases yet"


def test_a_runner_that_supports_lora_is_asked_its_own_reasons():
    runner = get_runner("pytorch")
    supporting = type("LoraPyTorch", (type(runner),), {"supports": frozenset({"lora"})})()
    assert unsupported_needs(LORA, supporting) is None
    assert unsupported_needs(RESUME, supporting) == "checkpoint (save/resume) cases are not supported by pytorch yet"
    assert unsupported_needs(RESUME, runner) is None  # the reference's own supports
    tp_lora = dataclasses.replace(LORA, tp=2)
    assert case_skip_reason(supporting, tp_lora, inputs=CPU_INPUTS) is None  # trained at its DP layout
    assert case_skip_reason(supporting, dataclasses.replace(RESUME, tp=2), inputs=CPU_INPUTS) == \
        "checkpoint (save/resume) cases are not supported by pytorch yet"
