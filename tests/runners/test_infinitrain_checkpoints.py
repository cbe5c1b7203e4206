"""Checkpoint cases on InfiniTrain (runners/infinitrain/checkpoints.py): its own --save/--load
flags and folders; and, with a build (`LOCKSTEP_INFINITRAIN_BUILD`), its own resume judged by
compare/resume.py: gpt2-tiny (SGD) and llama3-tiny (Adam) 6 steps saving every 3, resumed from
step 3, against the run that never stopped.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from lockstep.cases.spec import CaseSpec, CheckpointSpec
from lockstep.errors import RunError
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs
from lockstep.runners.infinitrain.checkpoints import checkpoint_load_seconds, checkpoint_save_seconds, checkpoints_for
from lockstep.runners.infinitrain.runner import BUILD_ENV_VAR, InfiniTrainRunner

GPT2_TINY, LLAMA3_TINY = SHAPES["gpt2-tiny"].config, SHAPES["llama3-tiny"].config
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "infinitrain"
STEPS, SAVE_EVERY, RESUME_AT = 6, 3, 3


def saving_case(model="gpt2", lr=1e-4, **checkpoint) -> CaseSpec:
    spec = CheckpointSpec(**{"save_interval": SAVE_EVERY, **checkpoint})
    return CaseSpec(name="saving", model=model, dtype="float32", micro_batch=4, seq_len=64, total_batch=256,
                    steps=STEPS, lr=lr, checkpoint=spec).check()


def resumed_case(model="gpt2", lr=1e-4) -> CaseSpec:
    return dataclasses.replace(saving_case(model, lr), name="resumed",
                               checkpoint=CheckpointSpec(resume_from=RESUME_AT, resume_case="saving"))


def inputs_at(tmp_path: Path, tokens: Path | None = None, model=GPT2_TINY) -> RunInputs:
    return RunInputs(checkpoint=tmp_path / "m.bin", tokens=tokens or tmp_path / "t.bin", model=model, device="cpu")


def test_a_saving_case_saves_beside_its_log_and_a_resumed_one_loads_the_saving_cases_step(tmp_path):
    runner = InfiniTrainRunner(build_dir=tmp_path)
    out = tmp_path / "out"
    cmd = runner.command(saving_case(max_checkpoint_keep=0, save_optimizer_state=False), inputs_at(tmp_path),
                         run_dir=out)
    i = cmd.index("--save")
    assert cmd[i:i + 7] == ["--save", str(out / "saving.checkpoints"), "--save_interval", "3",
                            "--max_checkpoint_keep", "0", "--save_optimizer_state=false"]
    assert "--load" not in cmd
    cmd = runner.command(resumed_case(), inputs_at(tmp_path), run_dir=out)
    assert cmd[cmd.index("--load") + 1] == str(out / "saving.checkpoints" / "checkpoint_step_000003")
    assert "--save" not in cmd
    assert runner.capture_problem(resumed_case(), inputs_at(tmp_path)) == \
        "a case resumed after step 3 does not train step 1"


def test_checkpoint_save_times_come_from_its_log():
    text = ("I1202 checkpoint_manager.cc:88] Checkpoint saved at: /x/checkpoint_step_000003 (12.50 ms)\n"
            "I1202 checkpoint_manager.cc:88] Checkpoint saved at: /x/checkpoint_step_000006 (7.50 ms)\n")
    assert checkpoint_save_seconds(text) == 0.02
    assert checkpoint_save_seconds("no saves") is None


# b24d92f's llama3 resuming Llama 3.2 1B from its step-30 folder on an H200 (docs/results/2026-12-03-h200), verbatim.
RESUME_LOG = (
    'I20261203 10:47:53.004683 139978686009344 checkpoint.cc:90] [CKPT] Loading model: '
    '"/tmp/lck-infinitrain/infinitrain/llama3_ckpt_no_resume.checkpoints/checkpoint_step_000030/model.ckpt"\n'
    'I20261203 10:47:57.892352 139978686009344 checkpoint.cc:98] [CKPT] Loading optimizer: '
    '"/tmp/lck-infinitrain/infinitrain/llama3_ckpt_no_resume.checkpoints/checkpoint_step_000030/optimizer.ckpt"\n'
    'E20261203 10:48:06.233771 139978686009344 checkpoint.cc:106] [CKPT] Load done: global_step=30, '
    'consumed_batches =30, last_lr=1e-05, topology(ddp,tp,sp,pp)=(1,1,1,1)\n')


def test_checkpoint_load_time_comes_from_its_logs_glog_times():
    assert checkpoint_load_seconds(RESUME_LOG) == 13.229
    # glog's older prefix (month and day only), and a load across midnight
    assert checkpoint_load_seconds("I1203 23:59:59.500000 1 checkpoint.cc:90] [CKPT] Loading model: m\n"
                                   "E1204 00:00:01.250000 1 checkpoint.cc:106] [CKPT] Load done: global_step=3\n") == 1.75
    # a load that never finished, and a log with no load, say nothing
    assert checkpoint_load_seconds(RESUME_LOG.splitlines()[0]) is None
    assert checkpoint_load_seconds("no load") is None


def fake_build(tmp_path: Path, steps: list[int]) -> Path:
    """A stand-in gpt2 that logs real step lines renumbered as `steps` of 6."""
    line = next(ln for ln in (FIXTURES / "gpt2_1.log").read_text().splitlines() if "train loss" in ln)
    build = tmp_path / "build"
    build.mkdir(parents=True)
    exe = build / "gpt2"
    exe.write_text("#!/bin/sh\n" + "".join(
        "echo '{}' >&2\n".format(line.replace("step    1/10", f"step {s:4d}/6")) for s in steps))
    exe.chmod(0o755)
    return build


def small_tokens(tmp_path: Path) -> Path:
    from lockstep.formats.tokens import write_token_stream

    path = tmp_path / "train.bin"
    write_token_stream(path, [i % 50000 for i in range(4000)])
    return path


def test_a_resume_whose_step_folder_is_missing_fails_naming_it_before_launching(tmp_path):
    build = fake_build(tmp_path, [4, 5, 6])
    rec = InfiniTrainRunner(build_dir=build).run(resumed_case(), inputs_at(tmp_path, small_tokens(tmp_path)),
                                                 tmp_path / "out")
    assert not rec.ok
    assert f"{tmp_path / 'out' / 'infinitrain' / 'saving.checkpoints' / 'checkpoint_step_000003'}: no InfiniTrain " \
           "checkpoint there" in rec.error


def write_step3_folder(root: Path) -> Path:
    """A whole (tiny) InfiniTrain step-3 folder under `root`, as its --save writes one."""
    import numpy as np

    from lockstep.formats.infinitrain_checkpoint import write_checkpoint_folder

    state = {"n_layer": 2, "n_head": 4, "n_kv_head": 4, "n_embd": 64, "vocab_size": 50304, "global_step": 3,
             "consumed_batches": 3, "last_lr": 1e-4, "ddp_size": 1, "tp_size": 1, "sp_size": 1, "pp_size": 1}
    return write_checkpoint_folder(root, 3, {"w": np.ones((4, 4), np.float32)}, state)


def test_a_resumed_run_logs_the_steps_after_its_resume_point(tmp_path):
    build = fake_build(tmp_path, [4, 5, 6])
    folder = checkpoints_for(resumed_case(), tmp_path / "out" / "infinitrain").resume_folder
    write_step3_folder(folder.parent)
    rec = InfiniTrainRunner(build_dir=build).run(resumed_case(), inputs_at(tmp_path, small_tokens(tmp_path)),
                                                 tmp_path / "out")
    assert rec.ok, rec.error
    assert [s.step for s in rec.steps] == [4, 5, 6]
    short = fake_build(tmp_path / "short", [4, 5])
    rec = InfiniTrainRunner(build_dir=short).run(resumed_case(), inputs_at(tmp_path, small_tokens(tmp_path)),
                                                 tmp_path / "out")
    assert not rec.ok and "logged 2 of 3 step(s)" in rec.error


def test_a_saving_case_clears_its_earlier_runs_folders(tmp_path):
    plan = checkpoints_for(saving_case(), tmp_path)
    stale = plan.save_root / "checkpoint_step_000009"
    stale.mkdir(parents=True)
    plan.prepare()
    assert not plan.save_root.exists()


# ---------------------------------------------------------------------- with a build


@pytest.fixture(scope="module")
def llama3_tiny_checkpoint(tmp_path_factory) -> Path:
    from lockstep.models import FAMILIES
    from lockstep.models.init import write_initial_checkpoint

    path = tmp_path_factory.mktemp("llama3_tiny") / "llama3_tiny_seed42.bin"
    write_initial_checkpoint(path, FAMILIES["llama3"], LLAMA3_TINY, seed=42)
    return path


# gpt2 (SGD) at lr 0.1, llama3 (Adam) at lr 1e-3: a resume that loses the data position (or, for
# Adam, its moments or step count) moves the loss past 1e-5 within the three resumed steps.
REAL = {"gpt2": dict(model="gpt2-tiny", lr=0.1, config=GPT2_TINY),
        "llama3": dict(model="llama3-tiny", lr=1e-3, config=LLAMA3_TINY)}


@pytest.mark.parametrize("family", ["gpt2", "llama3"])
def test_real_infinitrain_resume_is_judged_against_its_uninterrupted_run(request, tmp_path, family):
    from lockstep.compare.resume import ResumeVerdictClass, judge_resume
    from lockstep.formats.infinitrain_checkpoint import read_infinitrain_checkpoint

    build = os.environ.get(BUILD_ENV_VAR)
    if not build or not os.access(Path(build) / family, os.X_OK):
        pytest.skip(f"{BUILD_ENV_VAR} names no InfiniTrain build with a {family} executable")
    real = REAL[family]
    checkpoint = (request.getfixturevalue("tiny_checkpoint") if family == "gpt2"
                  else request.getfixturevalue("llama3_tiny_checkpoint"))
    inputs = RunInputs(checkpoint=checkpoint, tokens=request.getfixturevalue("tiny_shakespeare_train"),
                       model=real["config"], device="cpu", timeout_s=600)
    runner = InfiniTrainRunner(build_dir=Path(build))
    full = runner.run(saving_case(real["model"], real["lr"]), inputs, tmp_path)
    assert full.ok, full.error
    root = tmp_path / "infinitrain" / "saving.checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_step_000003", "checkpoint_step_000006"]
    files = sorted(p.name for p in (root / "checkpoint_step_000003").iterdir())
    # SGD has no state: no optimizer file; Adam's moments and step count are saved.
    assert files == (["model.ckpt", "trainer_state.json"] if family == "gpt2"
                     else ["model.ckpt", "optimizer.ckpt", "trainer_state.json"])
    assert read_infinitrain_checkpoint(root / "checkpoint_step_000003" / "model.ckpt")
    assert full.meta["checkpoint_save_s"] > 0
    resumed = runner.run(resumed_case(real["model"], real["lr"]), inputs, tmp_path)
    assert resumed.ok, resumed.error
    assert resumed.meta["checkpoint_load_s"] >= 0 and "checkpoint_load_s" not in full.meta
    assert [s.step for s in resumed.steps] == [4, 5, 6]
    assert full.losses()[0] - full.losses()[-1] > 1e-3  # it trains
    verdict = judge_resume(full, resumed)
    print(f"{family}: uninterrupted {full.losses()} resumed {resumed.losses()}: {verdict.verdict.value}, "
          f"max |d| {verdict.max_abs_diff:.2e}")
    assert verdict.verdict is ResumeVerdictClass.EXACT, verdict
    if family != "gpt2":
        return
    # The control: the same folder with its data position planted at batch 0 (trainer_state.json's
    # consumed_batches, which its loader skips by) resumes steps 4..6 on steps 1..3's batches: broken.
    state = root / "checkpoint_step_000003" / "trainer_state.json"
    text = state.read_text()
    assert '"consumed_batches": 3,' in text
    state.write_text(text.replace('"consumed_batches": 3,', '"consumed_batches": 0,'))
    restarted = runner.run(dataclasses.replace(resumed_case(real["model"], real["lr"]), name="resumed_at_batch_0"),
                           inputs, tmp_path)
    assert restarted.ok, restarted.error
    broken = judge_resume(full, restarted)
    print(f"{family} resumed at batch 0: {restarted.losses()}: {broken.verdict.value}, max |d| {broken.max_abs_diff:.2e}")
    assert broken.verdict is ResumeVerdictClass.BROKEN and broken.max_abs_diff > 1e-3, broken


def test_a_save_infinitrain_left_cut_short_fails_its_run_and_is_never_resumed_from(tmp_path):
    """InfiniTrain does not check its checkpoint writes: with the H200's disk full it wrote 4.0 GB of an 18 GB
    step folder and exited 0 (docs/results/2026-12-03-h200). The saving run fails naming the folder's problem,
    and a resume from it stops before launching."""
    import numpy as np

    from lockstep.formats.infinitrain_checkpoint import MODEL_FILE, write_checkpoint_folder
    from lockstep.runners.infinitrain.checkpoints import InfiniTrainCheckpoints

    state = {"n_layer": 2, "n_head": 4, "n_kv_head": 4, "n_embd": 64, "vocab_size": 50304, "global_step": 3,
             "consumed_batches": 3, "last_lr": 1e-4, "ddp_size": 1, "tp_size": 1, "sp_size": 1, "pp_size": 1}
    root = tmp_path / "saving.checkpoints"
    for step in (3, 6):
        write_checkpoint_folder(root, step, {"w": np.ones((4, 4), np.float32)}, {**state, "global_step": step})
    saving = InfiniTrainCheckpoints(save_root=root, resume_folder=None, interval=3)
    saving.check_saved()  # whole: nothing to say
    model = root / "checkpoint_step_000003" / MODEL_FILE
    model.write_bytes(model.read_bytes()[:-10])
    with pytest.raises(RunError) as info:
        saving.check_saved()
    assert str(info.value) == (f"InfiniTrain exited 0, but the checkpoint it saved at step 3 is not whole: {model}: "
                               "truncated: tensor w needs 64 bytes, but the file ends early (10 bytes short)")
    resuming = InfiniTrainCheckpoints(save_root=None, resume_folder=root / "checkpoint_step_000003")
    with pytest.raises(RunError, match=r"^the checkpoint to resume from is not whole: .*checkpoint_step_000003/model.ckpt: "
                                       r"truncated"):
        resuming.prepare()
