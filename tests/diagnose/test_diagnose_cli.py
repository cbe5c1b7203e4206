"""`lockstep diagnose` end to end on the CPU, and against a real InfiniTrain build when given."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from lockstep.cli import main
from lockstep.formats.tokens import write_token_stream
from lockstep.models import FAMILIES, SHAPES
from lockstep.models.init import write_initial_checkpoint

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("diag")
    ckpt, tokens = d / "init.bin", d / "tokens.bin"
    write_initial_checkpoint(ckpt, FAMILIES["gpt2"], SHAPES["gpt2-tiny"].config, seed=42)
    write_token_stream(tokens, np.random.default_rng(0).integers(0, 50257, size=6000))
    return ckpt, tokens


def test_pytorch_vs_megatron_from_the_command_line(inputs, tmp_path, capsys):
    ckpt, tokens = inputs
    rc = main(["diagnose", "--case", "gpt2_1", "--frameworks", "pytorch,megatron", "--llmc", str(ckpt), "--data",
               str(tokens), "--device", "cpu", "--out", str(tmp_path), "--no-drift"])
    out = capsys.readouterr().out
    assert rc == 0 and "no divergence" in out and "first diverging module: none" in out
    verdict = json.loads((tmp_path / "diagnose" / "gpt2_1_pytorch_vs_megatron.json").read_text())
    assert verdict["findings"] == [] and verdict["first_diverging_module"] is None
    assert {r["kind"] for r in verdict["ranked"]} == {"forward", "gradient", "optimizer update"}
    assert max(r["rel_error"] for r in verdict["ranked"] if r["kind"] != "optimizer update") < 1e-6
    # The update each optimizer applied in step 1, (w_before - w_after)/lr of all 28 tensors, agrees
    # to within the FP32 rounding of the weights after it (over lr 1e-4).
    updates = verdict["optimizer_updates"]
    print("optimizer updates:", len(updates), max(r["rel_error"] for r in updates))
    assert len(updates) == 28 and max(r["rel_error"] for r in updates) < 1e-3
    # Rows above the stated tensor tolerance that still agree say so, with the allowance each was
    # judged against (its FP32 rounding here), in the JSON and in the table.
    tol = verdict["tensor_tolerance"]
    above = [r for r in verdict["ranked"] if r["rel_error"] > tol]
    assert above and all(not r["differs"] and tol < r["rel_error"] <= r["allowed"] for r in above)
    assert all(r["allowed"] == tol for r in verdict["ranked"] if r["kind"] == "forward")
    from rich.console import Console

    from lockstep.diagnose.render import print_verdict

    console = Console(record=True, width=300)
    print_verdict(console, verdict, rows=len(verdict["ranked"]))
    text = console.export_text()
    table = {(cells[0], cells[1]): cells for cells in ([c.strip() for c in line.split("│")[1:-1]]
                                           for line in text.splitlines() if line.startswith("│"))}
    worst = above[0]
    assert table[worst["tensor"], worst["kind"]][3:6] == [f"{worst['rel_error']:.2e}", f"{worst['allowed']:.2e}",
                                           "agrees (above the tolerance)"]
    assert all(table[r["tensor"], r["kind"]][5] == "agrees" for r in verdict["ranked"] if r["kind"] == "forward")
    assert f"agrees within its allowance (the tensor tolerance {tol:.0e}" in text
    # issue 36, item 18: the captures kept ~210 MB of whole tensors for this 5M-parameter model;
    # once the verdict is written they hold only sketches (every tensor still named), ~1 MB.
    from lockstep.formats.step_capture import StepCapture

    kept = sorted((tmp_path / "diagnose").glob("*.npz"))
    assert [p.name for p in kept] == ["megatron_gpt2_1_step1.npz", "pytorch_gpt2_1_step1.npz"]
    assert "step-1 captures kept as sketches:" in out and "--keep-tensors keeps them whole" in out
    for path in kept:
        assert path.stat().st_size < 2_000_000, path.stat().st_size
        capture = StepCapture.load(path)
        assert not capture.grads and not capture.forward and not capture.output_grads
        assert len(capture.names("grad")) == 28 and len(capture.names("fwd")) == 16
        assert {r["tensor"] for r in verdict["ranked"] if r["kind"] == "gradient"} <= set(capture.names("grad"))


def test_keep_sketches_only_replaces_whole_tensors_by_their_sketches(tmp_path):
    """What a diagnose keeps by default, on a capture of whole tensors; `--keep-tensors` (the
    negative control: the capture as written) keeps them whole."""
    from lockstep.capture.request import make_sketch
    from lockstep.diagnose.run import keep_sketches_only
    from lockstep.formats.step_capture import StepCapture

    rng = np.random.default_rng(1)
    grads = {"wte": rng.standard_normal((500, 96)).astype(np.float32), "lnfb": rng.standard_normal(96).astype(np.float32)}
    forward = {"embedding": rng.standard_normal((4, 64, 96)).astype(np.float32)}
    path = tmp_path / "pytorch_gpt2_1_step1.npz"
    StepCapture("pytorch", loss=10.9, forward=forward, forward_order=["embedding"], grads=grads,
                token_losses=np.ones((1, 8), np.float32)).save(path)
    whole = path.stat().st_size
    assert set(StepCapture.load(path).grads) == {"wte", "lnfb"}  # as written: whole
    keep_sketches_only(path)
    slim = StepCapture.load(path)
    assert path.stat().st_size < whole / 4 and not slim.grads and not slim.forward
    assert slim.loss == 10.9 and slim.forward_order == ["embedding"] and slim.token_losses.shape == (1, 8)
    for kind, tensors in (("grad", grads), ("fwd", forward)):
        for name, array in tensors.items():
            expected, got = make_sketch(array), slim.sketch(kind, name)
            assert got.shape == array.shape and got.norm == expected.norm
            assert np.array_equal(got.values, expected.values)


def test_the_reference_beside_the_other_framework_finds_a_planted_defect(inputs, tmp_path, capsys, monkeypatch):
    """On a GPU that holds both, pytorch's step 1 trains in a thread beside the other framework's
    processes: forced here on the CPU, with megatron's LayerNorm-bias gradients 5% too large in its
    workers, diagnose names exactly those tensors, as it does turn by turn (the clean pair's
    agreement is the test above)."""
    import lockstep.diagnose.run as diagnose_run
    from support import defects

    started = []

    class Recorded(diagnose_run.Background):
        def __init__(self, fn=None, *args, **kwargs):
            started.append(args[0] if args else None)
            super().__init__(fn, *args, **kwargs)

    monkeypatch.setattr(diagnose_run, "beside_fits", lambda plan, extra=0: True)
    monkeypatch.setattr(diagnose_run, "Background", Recorded)
    defects.worker_env("megatron_layernorm_bias_grad_5pct", monkeypatch)
    ckpt, tokens = inputs
    rc = main(["diagnose", "--case", "gpt2_1", "--frameworks", "pytorch,megatron", "--llmc", str(ckpt), "--data",
               str(tokens), "--device", "cpu", "--out", str(tmp_path), "--no-drift"])
    capsys.readouterr()
    assert started == ["pytorch"] and rc == 1
    verdict = json.loads((tmp_path / "diagnose" / "gpt2_1_pytorch_vs_megatron.json").read_text())
    # (The optimizer-update rows are left out: each within its FP32-of-w_after allowance, the 5% Adam
    # hides in step 1's update, g/(|g| + eps), and the gradient finding is the defect's.)
    beyond = {r["tensor"] for r in verdict["ranked"] if r["rel_error"] > 1e-5 and r["kind"] != "optimizer update"}
    assert beyond == {"ln1b[0]", "ln1b[1]", "ln2b[0]", "ln2b[1]", "lnfb"}, beyond
    assert max(r["rel_error"] for r in verdict["ranked"] if r["tensor"] in beyond) == pytest.approx(0.05, rel=1e-3)
    # The reference's FP64 step 1 was made beside, in advance, for a close call; 5% is none: not kept.
    assert "reference's fp64 step 1 (beside)" in verdict["seconds"]
    assert not list((tmp_path / "diagnose").glob("pytorch-fp64_*"))


def gpt2_1_plan(inputs, frameworks, out_dir, **case_fields):
    """A diagnose plan for gpt2_1's shape on gpt2-tiny (CPU), with `case_fields` changed."""
    from lockstep.cases.spec import CaseSpec
    from lockstep.diagnose.run import DiagnosePlan
    from lockstep.runners.base import RunInputs

    ckpt, tokens = inputs
    case = CaseSpec(name="gpt2_1", model="gpt2-tiny", dtype="float32", micro_batch=4, seq_len=64, total_batch=256,
                    steps=10, lr=1e-4).with_overrides(**case_fields)
    return DiagnosePlan(case=case, inputs=RunInputs(checkpoint=ckpt, tokens=tokens, model=SHAPES["gpt2-tiny"].config,
                                                    device="cpu"), frameworks=frameworks, out_dir=out_dir)


def step1_and_drift(plan, fw, out_dir, steps, drift=True):
    from lockstep.capture.request import CaptureRequest
    from lockstep.diagnose.run import step1_and_drift as measure

    out_dir.mkdir(parents=True, exist_ok=True)
    return measure(plan, fw, CaptureRequest(path=str(out_dir / f"{fw}.npz"), full=True, rows=4), drift, steps)


def test_drift_runs_each_lr_on_both_sides(inputs, tmp_path):
    from lockstep.diagnose.run import pair_drift

    plan = gpt2_1_plan(inputs, ["pytorch", "pytorch"], tmp_path)
    capture, losses, note = step1_and_drift(plan, "pytorch", tmp_path, steps=2)
    runs = pair_drift(plan, {"pytorch": losses}, "pytorch", "pytorch")
    assert note == "" and [r.lr for r in runs] == [1e-12, 1e-5, 1e-4]
    assert all(len(r.steps) == 2 and r.max_abs_diff == 0.0 for r in runs)
    assert runs[0].steps[0].ref == runs[2].steps[0].ref  # step 1 is before any update
    assert runs[0].steps[1].ref != runs[2].steps[1].ref  # step 2 sees lr 1e-12's weights vs lr 1e-4's
    assert capture.loss == runs[2].steps[0].ref and "qkvw[0]" in capture.grads  # step 1, whole tensors


def test_drift_of_a_pipeline_case_runs_the_reference_on_one_device_and_a_side_that_cannot_run_leaves_a_note(
        inputs, tmp_path):
    from lockstep.diagnose.run import pair_drift

    pp2 = gpt2_1_plan(inputs, ["pytorch", "pytorch"], tmp_path / "pp", name="gpt2_pp2", micro_batch=2, pp=2)
    _, losses, note = step1_and_drift(pp2, "pytorch", tmp_path / "pp", steps=1)
    assert note == "" and [len(r.steps) for r in pair_drift(pp2, {"pytorch": losses}, "pytorch", "pytorch")] == [1, 1, 1]
    bf16 = gpt2_1_plan(inputs, ["pytorch", "megatron"], tmp_path / "bf16", name="gpt2_1_bfloat16", dtype="bfloat16")
    from lockstep.diagnose.run import step1_and_drift as measure
    from lockstep.errors import LockstepError

    with pytest.raises(LockstepError, match="diagnose cannot look inside megatron on case gpt2_1_bfloat16: megatron-core"):
        measure(bf16, "megatron", None, True, 1)


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed")
def test_megatrons_step1_and_drift_share_one_worker_group(inputs, tmp_path):
    from lockstep.diagnose.run import pair_drift
    from lockstep.formats.run_record import read_run_record

    plan = gpt2_1_plan(inputs, ["pytorch", "megatron"], tmp_path)
    _, ref_losses, _ = step1_and_drift(plan, "pytorch", tmp_path, steps=1)
    capture, losses, note = step1_and_drift(plan, "megatron", tmp_path, steps=1)
    runs = pair_drift(plan, {"pytorch": ref_losses, "megatron": losses}, "pytorch", "megatron")
    assert note == "" and [r.lr for r in runs] == [1e-12, 1e-5, 1e-4]
    assert max(r.max_abs_diff for r in runs) < 1e-6
    assert capture.framework == "megatron" and "qkvw[0]" in capture.grads
    names = ["gpt2_1_step1"] + [f"gpt2_1_lr{lr:g}" for lr in (1e-12, 1e-5, 1e-4)]
    groups = [read_run_record(tmp_path / "drift" / "megatron" / f"{n}.jsonl").meta["persistent_worker"] for n in names]
    assert len({g["group_started_at"] for g in groups}) == 1 and [g["position"] for g in groups] == [1, 2, 3, 4]


def test_hint_names_the_command():
    from lockstep.diagnose import hint

    assert hint("gpt2_1", "pytorch", "infinitrain", "runs/x") == \
        "lockstep diagnose runs/x --case gpt2_1 --frameworks pytorch,infinitrain"


@pytest.mark.skipif(not os.environ.get("LOCKSTEP_INFINITRAIN_BUILD"),
                    reason="set LOCKSTEP_INFINITRAIN_BUILD to an InfiniTrain build (CPU build) to run this")
def test_infinitrain_cpu_build_has_no_defect_beyond_its_loss_sum(inputs, tmp_path):
    ckpt, tokens = inputs
    main(["diagnose", "--case", "gpt2_1", "--frameworks", "pytorch,infinitrain", "--llmc", str(ckpt), "--data",
          str(tokens), "--device", "cpu", "--out", str(tmp_path), "--no-drift"])
    verdict = json.loads((tmp_path / "diagnose" / "gpt2_1_pytorch_vs_infinitrain.json").read_text())
    assert verdict["gradient_source"] == "sgd-recovered"
    assert all(f["kind"] == "logging precision only" for f in verdict["findings"]), verdict["findings"]
    # Its forward from its own --precision_check dumps: every module output of the reference but the
    # attention core (InfiniTrain hooks modules, and that is no module), within 1e-6 (measured 5.1e-7).
    forward = {d["tensor"]: d["rel_error"] for d in verdict["forward"]}
    assert len(forward) == 13 and "logits" in forward and "ln1[1]" in forward, sorted(forward)
    assert max(forward.values()) < 1e-6 and verdict["first_diverging_module"] is None
    # The gradients arriving at those outputs (its backward dumps), in backward order: measured 8.1e-7.
    arriving = {d["tensor"]: d["rel_error"] for d in verdict["output_gradients"]}
    assert set(arriving) == set(forward) and max(arriving.values()) < 1e-5
    assert verdict["first_diverging_output_gradient"] is None


@pytest.mark.skipif(not os.environ.get("LOCKSTEP_INFINITRAIN_BUILD"),
                    reason="set LOCKSTEP_INFINITRAIN_BUILD to an InfiniTrain build (CPU build) to run this")
def test_infinitrains_adam_gradients_come_whole_from_its_first_moment(tmp_path):
    """Llama 3 trains with Adam; InfiniTrain's saved optimizer state after its first step holds m = (1 - beta1)·g,
    so its gradients compare whole, not as the signs of its update (measured on b24d92f's CPU build, llama3-tiny:
    every one of the 31 within 1.1e-6 of the reference's)."""
    ckpt, tokens = tmp_path / "llama3.bin", tmp_path / "tokens.bin"
    write_initial_checkpoint(ckpt, FAMILIES["llama3"], SHAPES["llama3-tiny"].config, seed=42)
    write_token_stream(tokens, np.random.default_rng(0).integers(0, 128000, size=6000), kind="llama3")
    main(["diagnose", "--case", "llama3_1", "--matrix", "llama3", "--frameworks", "pytorch,infinitrain", "--llmc",
          str(ckpt), "--data", str(tokens), "--device", "cpu", "--out", str(tmp_path), "--no-drift"])
    verdict = json.loads((tmp_path / "diagnose" / "llama3_1_pytorch_vs_infinitrain.json").read_text())
    assert verdict["gradient_source"] == "adam-moment" and verdict["findings"] == [], verdict["findings"]
    grads = {d["tensor"]: d for d in verdict["gradients"]}
    assert len(grads) == 31 and all(d["kind"] == "gradient" for d in grads.values())
    assert max(d["rel_error"] for d in grads.values()) < 1e-5


def test_run_dir_plan_takes_the_case_inputs_the_failed_pair_and_the_build(inputs, tmp_path, monkeypatch):
    from lockstep.diagnose.run import DiagnoseRequest, plan_diagnose
    from lockstep.errors import LockstepError
    from lockstep.formats.run_record import RunRecord, write_run_record

    ckpt, tokens = inputs
    case = {"name": "gpt2_2", "model": "gpt2-tiny", "dtype": "float32", "micro_batch": 80, "seq_len": 64,
            "total_batch": 5120, "steps": 10, "lr": 1e-4, "dp": 1, "tp": 1, "pp": 1, "vpp": 1, "sp": False}
    model = {"name": "gpt2-tiny", "checkpoint": str(ckpt), "data": str(tokens), "checkpoint_sha256": "", "data_sha256": ""}
    (tmp_path / "run.json").write_text(json.dumps({"schema": "lockstep.run/1", "cases": [case],
                                                   "frameworks": ["pytorch", "megatron", "infinitrain"],
                                                   "baseline": "pytorch", "device": "cpu", "model": model,
                                                   "models": [model]}))
    (tmp_path / "summary.json").write_text(json.dumps({"comparisons": [
        {"test_framework": "megatron", "cases": [{"case": "gpt2_2", "passed": True}]},
        {"test_framework": "infinitrain", "cases": [{"case": "gpt2_2", "passed": False}]}]}))
    monkeypatch.delenv("LOCKSTEP_INFINITRAIN_BUILD", raising=False)
    with pytest.raises(LockstepError, match="no InfiniTrain build given"):  # said before any capture starts
        plan_diagnose(DiagnoseRequest(case="gpt2_2", run_dir=str(tmp_path)))
    build = tmp_path / "build"
    build.mkdir()
    (build / "gpt2").write_text("#!/bin/sh\n")
    (build / "gpt2").chmod(0o755)
    (tmp_path / "infinitrain").mkdir()
    write_run_record(tmp_path / "infinitrain" / "gpt2_2.jsonl",
                     RunRecord(framework="infinitrain", case="gpt2_2", meta={"infinitrain_build": str(build)}))
    plan = plan_diagnose(DiagnoseRequest(case="gpt2_2", run_dir=str(tmp_path)))
    assert plan.frameworks == ["pytorch", "infinitrain"]
    assert plan.options["infinitrain"].build_dir == str(build)  # the build the run used, from its record
    assert plan.case.total_batch == 5120 and plan.inputs.checkpoint == ckpt and plan.inputs.device == "cpu"
    assert plan.out_dir == tmp_path / "diagnose"


def test_the_disk_a_diagnose_needs_is_checked_before_any_capture(inputs, tmp_path, monkeypatch, capsys):
    """Per side: FP32 gradients, or int8 Adam update signs where every test shows only its update
    (InfiniTrain on Adam families); plus the FP32 checkpoint a recovering framework saves its step
    into; and a quarter more. A disk without that much free says so before anything runs."""
    import dataclasses

    import lockstep.fsutil as fsutil
    from lockstep.diagnose.run import diagnose_scratch_bytes

    plan = gpt2_1_plan(inputs, ["pytorch", "megatron"], tmp_path)
    n = SHAPES["gpt2-tiny"].config.num_parameters()
    assert diagnose_scratch_bytes(plan, ["megatron"]) == (4 * n + 4 * n) * 5 // 4
    plan.options["infinitrain"] = {"build_dir": str(tmp_path)}
    assert diagnose_scratch_bytes(plan, ["infinitrain"]) == (4 * n + 4 * n + 4 * n) * 5 // 4  # GPT-2: SGD
    llama = SHAPES["llama3-tiny"].config
    adam = dataclasses.replace(plan, inputs=dataclasses.replace(plan.inputs, model=llama))
    m = llama.num_parameters()
    # Adam: InfiniTrain's gradients whole from its saved first moment, so FP32 on both sides, and its save holds
    # the weights and both moments
    assert diagnose_scratch_bytes(adam, ["infinitrain"]) == (4 * m + 4 * m + 12 * m) * 5 // 4
    assert diagnose_scratch_bytes(adam, ["infinitrain", "megatron"]) == (4 * m + 4 * m + 4 * m + 12 * m) * 5 // 4

    monkeypatch.setattr(fsutil, "free_bytes", lambda directory: 1000)
    ckpt, tokens = inputs
    rc = main(["diagnose", "--case", "gpt2_1", "--frameworks", "pytorch,megatron", "--llmc", str(ckpt), "--data",
               str(tokens), "--device", "cpu", "--out", str(tmp_path / "o"), "--no-drift"])
    err = capsys.readouterr().err
    assert rc != 0 and "no space left on device for the lockstep diagnose's step-1 captures" in err, err
    assert "Traceback" not in err and not list((tmp_path / "o" / "diagnose").glob("*.npz"))


def test_the_drift_runs_while_a_background_capture_is_still_being_read(inputs, tmp_path, monkeypatch):
    """A runner whose capture ends in lockstep reading what its framework wrote (InfiniTrain's
    saved weights) hands that reading to a thread: the drift's runs start before it is done, and
    the capture is the one read. Here the reading waits for the drift to start, so reading first
    would never end."""
    import threading

    import lockstep.diagnose.run as diagnose_run
    from lockstep.capture.request import CaptureRequest
    from lockstep.runners.base import Background
    from lockstep.runners.pytorch import PyTorchRunner

    drift_started = threading.Event()

    class Reading(PyTorchRunner):
        def start_capture(self, case, inputs, work_dir, request):
            def read():
                assert drift_started.wait(60), "the drift did not start while the capture was read"
                return self.capture(case, inputs, work_dir, request)

            return Background(read, name="reading")

        def run_many(self, pairs, out_dirs, **kwargs):
            drift_started.set()
            return super().run_many(pairs, out_dirs, **kwargs)

    monkeypatch.setattr(diagnose_run, "get_runner", lambda name, **kw: Reading())
    plan = gpt2_1_plan(inputs, ["pytorch", "pytorch"], tmp_path)
    seconds = {}
    request = CaptureRequest(path=str(tmp_path / "pytorch.npz"), full=True, rows=4)
    capture, losses, note = diagnose_run.step1_and_drift(plan, "pytorch", request, True, 1, seconds)
    assert note == "" and sorted(losses) == [1e-12, 1e-5, 1e-4] and capture.names("grad")
    assert set(seconds) == {"capture", "drift", "capture reading"}


def test_named_builds_get_verdicts_of_their_own_names(inputs, tmp_path, capsys):
    """Two builds of one runner (`infinitrain@NAME`, fake InfiniTrains that show their step 1): each
    verdict is written under the plan's name for it. Their captures once said only `infinitrain`, so
    a second build's verdict overwrote the first's file."""
    from support.fake_framework import LN_BIAS_GRAD_DEFECT, write_fake_build

    ckpt, tokens = inputs
    good = write_fake_build(tmp_path / "good")
    planted = write_fake_build(tmp_path / "planted", ln_bias_grad_scale=LN_BIAS_GRAD_DEFECT)
    rc = main(["diagnose", "--case", "gpt2_1", "--frameworks", "pytorch,infinitrain@good,infinitrain@planted",
               "--infinitrain-build", f"good={good}", "--infinitrain-build", f"planted={planted}", "--llmc", str(ckpt),
               "--data", str(tokens), "--device", "cpu", "--out", str(tmp_path / "o"), "--no-drift"])
    out = capsys.readouterr().out
    verdicts = {name: json.loads((tmp_path / "o" / "diagnose" / f"gpt2_1_pytorch_vs_infinitrain@{name}.json").read_text())
                for name in ("good", "planted")}
    assert rc == 1 and verdicts["planted"]["test"] == "infinitrain@planted", out
    assert not (tmp_path / "o" / "diagnose" / "gpt2_1_pytorch_vs_infinitrain.json").exists()
    planted_where = {f["where"] for f in verdicts["planted"]["findings"]}
    assert any(w.startswith("ln1b") or w.startswith("lnfb") for w in planted_where), verdicts["planted"]["findings"]
    assert not any(w.startswith("ln1b") for f in verdicts["good"]["findings"] for w in [f["where"]])
