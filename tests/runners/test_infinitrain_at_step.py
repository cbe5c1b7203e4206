"""diagnose --at-step N on InfiniTrain (runners/infinitrain/at_step.py): the reference's weights after
step N written as its own step folder (every name of its gpt2 state dict, the trainer state its
--load checks), the capture's launch a resume of it; which cases cannot start from a state, saying
why. With a real build (LOCKSTEP_INFINITRAIN_BUILD): its own save of step N has the names, shapes
and trainer state lockstep writes, and `lockstep diagnose --at-step` against pytorch finds nothing."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from lockstep.cases.spec import CaseSpec, LoraSpec
from lockstep.errors import LockstepError, RunError
from lockstep.formats.infinitrain_checkpoint import read_checkpoint_folder, read_infinitrain_checkpoint
from lockstep.models import SHAPES, load_checkpoint
from lockstep.models.family import split_canonical
from lockstep.runners.base import RunInputs
from lockstep.runners.infinitrain.at_step import at_step_problem, consumed_batches, resumed, write_reference_state
from lockstep.runners.infinitrain.families import adapter_for
from lockstep.runners.infinitrain.runner import InfiniTrainRunner
from support.resume_case import RESUME_MATRIX

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

GPT2 = SHAPES["gpt2-tiny"].config


def gpt2_case(**kw) -> CaseSpec:
    return CaseSpec(**{**dict(name="sgd", model="gpt2-tiny", dtype="float32", micro_batch=4, seq_len=64,
                              total_batch=512, steps=6, lr=1e-4), **kw})


def inputs_of(checkpoint, tokens=Path("tokens.bin"), config=GPT2) -> RunInputs:
    return RunInputs(checkpoint=Path(checkpoint), tokens=Path(tokens), model=config, device="cpu")


def test_gpt2_native_state_is_canonical_states_inverse_with_its_tie_copy_and_masks(tiny_checkpoint):
    ckpt = load_checkpoint(tiny_checkpoint)
    canonical = split_canonical(ckpt.tensors, ckpt.config)
    adapter = adapter_for("gpt2")
    native = adapter.native_state(canonical, GPT2)
    V, T = GPT2.vocab_size, GPT2.max_seq_len
    assert native["transformer.wte.weight"].shape == (V, GPT2.channels)
    assert np.array_equal(native["lm_head.weight"], canonical["wte"][:V])
    mask = native["transformer.h.1.attn.bias"]
    assert mask.shape == (1, 1, T, T) and mask[0, 0, 0, 1] == 0 and mask[0, 0, 1, 0] == 1 and mask.sum() == T * (T + 1) / 2
    assert len(native) == len(canonical) + 1 + GPT2.num_layers
    back = adapter.canonical_state(native, GPT2)
    assert sorted(back) == sorted(canonical)
    for name, w in canonical.items():
        rows = slice(0, V) if name == "wte" else slice(None)
        assert np.array_equal(back[name][rows], w[rows]), name
    # Negative control: a tensor InfiniTrain has no name for is refused, not dropped.
    with pytest.raises(LockstepError, match="canonical tensor lora_A.qkvw\\[0\\] has no InfiniTrain name"):
        adapter.native_state({**canonical, "lora_A.qkvw[0]": canonical["qkvw[0]"]}, GPT2)


def test_the_state_folder_is_what_the_resumed_launch_loads(tiny_checkpoint, tmp_path):
    ckpt = load_checkpoint(tiny_checkpoint)
    weights = split_canonical(ckpt.tensors, ckpt.config)
    launch = resumed(gpt2_case(name="sgd_step4_recovery_lr1024", lr=1024.0), 3)
    assert (launch.steps, launch.checkpoint.resume_from) == (4, 3)
    folder = write_reference_state(weights, 3, launch, inputs_of(tiny_checkpoint), tmp_path, tokens_per_step=512)
    assert folder == (tmp_path / "sgd_step4_recovery_lr1024.checkpoints" / "checkpoint_step_000003").resolve()
    read = read_checkpoint_folder(folder)
    assert read.problems == [] and read.ranks[0].optimizer is None
    assert read.trainer_state.values == dict(n_layer=12, n_head=12, n_kv_head=12, n_embd=768, vocab_size=50304,
                                             global_step=3, consumed_batches=6, last_lr=1024.0, ddp_size=1, tp_size=1,
                                             sp_size=1, pp_size=1)
    saved = read_infinitrain_checkpoint(folder / "model.ckpt")
    assert np.array_equal(saved["transformer.h.0.attn.c_attn.weight"], weights["qkvw[0]"])
    cmd = InfiniTrainRunner(build_dir=tmp_path).command(launch, inputs_of(tiny_checkpoint), run_dir=tmp_path)
    assert cmd[cmd.index("--load") + 1] == str(folder) and cmd[cmd.index("--num_iteration") + 1] == "4"


def test_the_loader_position_is_counted_in_the_launchs_own_batches():
    case = gpt2_case()  # 512 tokens a step: 2 micro batches of 4x64
    assert consumed_batches(case, 3, 512) == 6
    assert consumed_batches(case.with_overrides(micro_batch=2, total_batch=128), 3, 512) == 12  # a 2-row dump launch
    with pytest.raises(RunError, match="no whole number"):
        consumed_batches(case.with_overrides(micro_batch=3, total_batch=192), 1, 512)


def test_which_cases_cannot_start_from_a_state(tiny_checkpoint, tmp_path):
    from lockstep.models.llama3.config import Llama3Config

    runner = InfiniTrainRunner(build_dir=None)
    assert runner.at_step_problem(gpt2_case(), inputs_of(tiny_checkpoint)) is None
    llama = inputs_of(tiny_checkpoint, config=Llama3Config(vocab_size=128256, num_layers=1, num_heads=2,
                                                           num_kv_heads=1, channels=16, max_seq_len=64))
    assert runner.at_step_problem(gpt2_case(model="llama3"), llama) is None  # Adam: its moments in its own order
    lora = gpt2_case(lora=LoraSpec(rank=8, alpha=16.0, target_modules=("c_attn",)))
    assert "cannot start a LoRA case" in runner.at_step_problem(lora, inputs_of(tiny_checkpoint))
    assert "parallel" in runner.at_step_problem(gpt2_case(dp=2), inputs_of(tiny_checkpoint))
    # A resumed case (`lockstep run` certifies its step N+1 from the reference's state) starts from it as its plain
    # case does, though its own step 1 is not captured (it does not train step 1).
    from lockstep.cases.spec import CheckpointSpec

    resumed_case = gpt2_case(checkpoint=CheckpointSpec(resume_from=3))
    assert runner.at_step_problem(resumed_case, inputs_of(tiny_checkpoint)) is None
    assert "does not train step 1" in runner.capture_problem(resumed_case, inputs_of(tiny_checkpoint))


# ---------------------------------------------------------------------- with a real build

def real_build_or_skip() -> Path:
    build = os.environ.get("LOCKSTEP_INFINITRAIN_BUILD")
    if not build or not (Path(build) / "gpt2").is_file():
        pytest.skip("set LOCKSTEP_INFINITRAIN_BUILD to an InfiniTrain build with gpt2 to run this")
    return Path(build)


def test_real_infinitrain_saves_what_lockstep_writes_and_resumes_from_it_alike(tiny_checkpoint, tiny_shakespeare_train,
                                                                              tmp_path, monkeypatch):
    """Its own save after step 3 has the names, shapes, dtypes and trainer state lockstep writes; a
    resume from lockstep's folder of those weights logs InfiniTrain's own resumed step 4; with the
    loader position planted one batch on, it does not."""
    from lockstep.cases.spec import CheckpointSpec
    from lockstep.formats.infinitrain_checkpoint import read_state_file
    from lockstep.runners.infinitrain import at_step

    build = real_build_or_skip()
    runner = InfiniTrainRunner(build_dir=build)
    inputs = dataclasses.replace(inputs_of(tiny_checkpoint, tiny_shakespeare_train), timeout_s=600)
    case = gpt2_case(name="own", steps=3, lr=0.1, checkpoint=CheckpointSpec(save_interval=3))
    saved = runner.run(case, inputs, tmp_path)
    assert saved.ok, saved.error
    own = tmp_path / "infinitrain" / "own.checkpoints" / "checkpoint_step_000003"
    weights = adapter_for("gpt2").canonical_state(read_infinitrain_checkpoint(own / "model.ckpt"), GPT2)

    def layout(folder):
        state = read_state_file(folder / "model.ckpt")
        return sorted((e.name, e.shape, e.dtype) for e in state.entries)

    def step4(name, plant=None):
        launch = resumed(gpt2_case(name=name, lr=0.1), 3)
        if plant:
            monkeypatch.setattr(at_step, "consumed_batches", plant)
        folder = write_reference_state(weights, 3, launch, inputs, tmp_path / "infinitrain", tokens_per_step=512)
        monkeypatch.undo()
        record = runner.run(launch, inputs, tmp_path)
        assert record.ok, record.error
        return folder, record

    folder, mine = step4("mine")
    assert layout(folder) == layout(own)
    ours, theirs = read_checkpoint_folder(folder).trainer_state.values, read_checkpoint_folder(own).trainer_state.values
    assert ours == theirs, (ours, theirs)
    own_resume = runner.run(dataclasses.replace(resumed(gpt2_case(name="own_resume", lr=0.1), 3),
                                                checkpoint=CheckpointSpec(resume_from=3, resume_case="own")),
                            inputs, tmp_path)
    assert own_resume.ok, own_resume.error
    _, shifted = step4("shifted", plant=lambda case, steps, tokens: 2 * steps + 1)
    print(f"step 4 from InfiniTrain's own folder {own_resume.losses()}, from lockstep's {mine.losses()}, "
          f"from lockstep's one batch on {shifted.losses()}")
    assert [s.step for s in mine.steps] == [4] and mine.losses() == own_resume.losses()
    assert abs(shifted.losses()[0] - mine.losses()[0]) > 1e-4  # negative control: another batch, another loss


SGD_MATRIX = """
[defaults]
model = "gpt2"
dtype = "float32"
micro_batch = 4
seq_len = 64
total_batch = 512
steps = 5
lr = 0.1

[[case]]
name = "sgd"
"""


def diagnose_at_step(tiny_checkpoint, tokens, out: Path, build: Path) -> tuple[int, dict]:
    import json

    from lockstep.cli import main

    matrix = out / "sgd.toml"
    out.mkdir(parents=True, exist_ok=True)
    matrix.write_text(SGD_MATRIX)
    rc = main(["diagnose", "--case", "sgd", "--matrix", str(matrix), "--frameworks", "pytorch,infinitrain",
               "--llmc", str(tiny_checkpoint), "--data", str(tokens), "--device", "cpu", "--out", str(out),
               "--no-drift", "--at-step", "3", "--infinitrain-build", str(build)])
    return rc, json.loads((out / "diagnose" / "sgd_pytorch_vs_infinitrain.at_step3.json").read_text())


def test_real_diagnose_at_step_3_finds_infinitrain_agreeing_from_the_references_state(
        tiny_checkpoint, tiny_shakespeare_train, tmp_path, capsys, monkeypatch):
    from lockstep.runners.infinitrain import at_step

    build = real_build_or_skip()
    rc, v = diagnose_at_step(tiny_checkpoint, tiny_shakespeare_train, tmp_path / "clean", build)
    out = capsys.readouterr().out
    worst = {k: max((r["rel_error"] for r in v[k]), default=None) for k in ("forward", "gradients", "optimizer_updates")}
    print(f"at step 4: {worst}, loss {v['loss_step1']}, findings {[f['kind'] for f in v['findings']]}")
    assert rc == 0, out
    assert (v["at_step"], v["step"]) == (3, 4)
    assert all(f["kind"] == "logging precision only" for f in v["findings"]), v["findings"]
    assert worst["gradients"] < 1e-5 and len(v["gradients"]) == 12 * GPT2.num_layers + 4
    assert not list((tmp_path / "clean" / "diagnose").rglob("checkpoint_step_000003"))  # the state folder goes
    # Negative control: the loader position written one batch on: InfiniTrain's step 4 is another batch's.
    monkeypatch.setattr(at_step, "consumed_batches", lambda case, steps, tokens: steps * tokens // (
        case.micro_batch * case.seq_len) + 1)
    rc, v = diagnose_at_step(tiny_checkpoint, tiny_shakespeare_train, tmp_path / "shifted", build)
    print(f"loader one batch on: {[(f['kind'], f['where']) for f in v['findings']]}")
    assert rc == 1 and v["findings"] and v["findings"][0]["kind"] != "logging precision only"




def test_real_diagnose_at_step_of_an_adam_family_starts_infinitrain_from_the_references_moments(tmp_path, capsys,
                                                                                              monkeypatch):
    """Llama 3 (Adam) at step 4 from the reference's state after step 3: its weights as model.ckpt, its moments as
    optimizer.ckpt in InfiniTrain's own parameter order (learnt from a probe step), adam.t 3. Measured on b24d92f's
    CPU build, llama3-tiny: every gradient within 1.2e-6, the step-4 loss within 3.8e-7. Negative control: the
    moments written one layer off (layer 0's as layer 1's, ...) move InfiniTrain's update, and diagnose names it."""
    import json

    from lockstep.cli import main
    from lockstep.formats.tokens import write_token_stream
    from lockstep.models import FAMILIES, SHAPES
    from lockstep.models.init import write_initial_checkpoint
    from lockstep.runners.infinitrain import at_step

    build = real_build_or_skip()
    ckpt, tokens = tmp_path / "llama3.bin", tmp_path / "tokens.bin"
    write_initial_checkpoint(ckpt, FAMILIES["llama3"], SHAPES["llama3-tiny"].config, seed=42)
    write_token_stream(tokens, np.random.default_rng(0).integers(0, 128000, size=8000), kind="llama3")

    def diagnose(out):
        rc = main(["diagnose", "--case", "llama3_1", "--matrix", "llama3", "--frameworks", "pytorch,infinitrain",
                   "--llmc", str(ckpt), "--data", str(tokens), "--device", "cpu", "--out", str(out), "--no-drift",
                   "--at-step", "3", "--infinitrain-build", str(build)])
        return rc, json.loads((out / "diagnose" / "llama3_1_pytorch_vs_infinitrain.at_step3.json").read_text())

    rc, v = diagnose(tmp_path / "clean")
    assert rc == 0 and (v["at_step"], v["step"], v["gradient_source"]) == (3, 4, "adam-moment")
    assert v["findings"] == [] and len(v["gradients"]) == 31 and len(v["optimizer_updates"]) == 31
    assert max(r["rel_error"] for r in v["gradients"]) < 1e-5
    right = at_step.adam_state

    def one_layer_off(order, exp_avg, exp_avg_sq, step):
        shift = {n: n.replace("[0]", "[1]") if "[0]" in n else n.replace("[1]", "[0]") if "[1]" in n else n for n in order}
        return right(order, {n: exp_avg[shift[n]] for n in order}, {n: exp_avg_sq[shift[n]] for n in order}, step)

    monkeypatch.setattr(at_step, "adam_state", one_layer_off)
    rc, v = diagnose(tmp_path / "shifted")
    print(f"moments one layer off: {[(f['kind'], f['where']) for f in v['findings']]}")
    assert rc == 1 and v["findings"] and v["findings"][0]["kind"] == "optimizer update"


def test_real_run_certifies_infinitrains_resumed_case_from_the_references_state(tiny_checkpoint, training_tokens,
                                                                                tmp_path, capsys):
    """`lockstep run` certifies a resumed case at its first step (3) with each framework starting it from
    the reference's saved state (pipeline.resumed_capture): InfiniTrain's now through its --load."""
    import json

    from lockstep.cli import main

    build = real_build_or_skip()
    matrix = tmp_path / "resume.toml"
    matrix.write_text(RESUME_MATRIX)
    out = tmp_path / "run"
    rc = main(["run", "--matrix", str(matrix), "--frameworks", "pytorch,infinitrain", "--device", "cpu", "--llmc",
               str(tiny_checkpoint), "--data", str(training_tokens), "--out", str(out), "--no-report",
               "--infinitrain-build", str(build)])
    text = " ".join(capsys.readouterr().out.split())
    summary = json.loads((out / "summary.json").read_text())
    cases = {c["case"]: c for comp in summary["comparisons"] for c in comp["cases"]}
    cert = cases["resumed"]["certificate"]
    print(f"resumed: {cases['resumed']['verdict']}; certificate: {cert['summary']}")
    assert rc == 0, text
    assert cert["available"] and cert["holds"], cert
    assert "step-3 certificate infinitrain vs pytorch on resumed" in text
