"""The infinitrain runner's Qwen3 path: which LLMC version and flags a build's `qwen3` has, asked of
the executable (runners/infinitrain/probe.py), and what follows from the answer -- the file it is
handed, its ZeRO flag, the cases it skips and why. Fake executables answer as the real ones do
(feat/add_Qwen3-8B a3f84f8: version 3, no --save, --use_distributed_optimizer; PR #208: version 4).
The real build's comparison is tests/commands/test_run_families.py's."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.fsutil import sha256_file
from lockstep.models import FAMILIES
from lockstep.models.qwen3.checkpoint_v3 import write_v3
from lockstep.models.qwen3.config import Qwen3Config
from lockstep.runners.base import RunInputs
from lockstep.runners.infinitrain.families import adapter_for
from lockstep.runners.infinitrain.probe import executable_flags, llmc_version_read
from lockstep.runners.infinitrain.runner import InfiniTrainRunner

SMALL = Qwen3Config(max_seq_len=64, vocab_size=151936, num_layers=1, num_heads=4, num_kv_heads=2, channels=32,
                    intermediate_size=96)
A3F84F8_FLAGS = ("batch_size", "device", "llmc_filepath", "num_iteration", "precision_check",
                 "use_distributed_optimizer")


def fake_qwen3(build: Path, version_line: str, flags=A3F84F8_FLAGS) -> Path:
    """A `qwen3` that lists `flags` for --helpfull (gflags' format) and otherwise prints
    `version_line` as its loader's refusal; every call is counted in build/calls."""
    build.mkdir(parents=True, exist_ok=True)
    listing = "\n".join(f"    -{f} (the {f} flag) type: string default: \"\"" for f in flags)
    exe = build / "qwen3"
    exe.write_text(f"""#!/bin/sh
echo "$@" >> "{build}/calls"
if [ "$1" = "--helpfull" ]; then
cat <<'EOF'
qwen3: Warning: SetUsageMessage() never called

  Flags from example/qwen3/main.cc:
{listing}
EOF
exit 1
fi
echo 'F20261202 10:51:58.344971 140456017096768 checkpoint_loader.cc:55] {version_line} ' >&2
exit 134
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def case(steps=2, zero=0, dp=1):
    return CaseSpec(name="qwen3_1", model="qwen3", dtype="float32", micro_batch=1, seq_len=64, total_batch=64 * dp,
                    steps=steps, lr=1e-5, dp=dp, zero=zero).check()


def inputs(tmp_path: Path, device="cpu", checkpoint: Path | None = None) -> RunInputs:
    return RunInputs(checkpoint=checkpoint or tmp_path / "model.bin", tokens=tmp_path / "train.bin", model=SMALL,
                     device=device)


V3_REFUSAL = "Check failed: version == kQwen3FP32Version (0 vs. 3)"


def test_the_probe_reads_flags_and_the_version_the_loader_checks(tmp_path):
    exe = fake_qwen3(tmp_path / "b", V3_REFUSAL)
    assert executable_flags(exe) == frozenset(A3F84F8_FLAGS)
    assert llmc_version_read(exe, 20240804) == 3
    probe_call = (tmp_path / "b" / "calls").read_text().splitlines()[-1]
    assert probe_call.startswith("--llmc_filepath ") and probe_call.endswith("version0.bin --device cpu --num_iteration 1")


def test_a_build_that_names_no_version_is_one_clear_error(tmp_path):
    exe = fake_qwen3(tmp_path / "b", "Segmentation fault")
    with pytest.raises(LockstepError) as e:
        llmc_version_read(exe, 20240804)
    assert str(e.value).startswith(f"cannot tell which LLMC version {exe} reads: given a version-0 header "
                                   "(magic 20240804) it did not refuse it")
    assert str(e.value).endswith("checkpoint_loader.cc:55] Segmentation fault")


def test_a_version_3_build_compares_two_steps_and_says_why_not_more(tmp_path):
    fake_qwen3(tmp_path / "b", V3_REFUSAL)
    runner = InfiniTrainRunner(tmp_path / "b")
    assert runner.skip_reason(case(steps=2), inputs(tmp_path)) is None
    reason = runner.skip_reason(case(steps=10), inputs(tmp_path))
    assert reason == ("this InfiniTrain build's qwen3 (LLMC version 3) hard-codes Adam (beta 0.9/0.95, eps 1e-08, "
                      "bias-corrected, no weight decay), the contract asks for Adam (beta 0.9/0.999, eps 1e-08, "
                      "bias-corrected, no weight decay); Adam's first update does not depend on the betas, so only "
                      "cases of at most 2 steps compare (--steps 2)")
    assert runner.capture_problem(case(steps=2), inputs(tmp_path)) == (
        "this InfiniTrain build's qwen3 has no --save, and its step 1 is captured from the weights it saves")
    # Asked once per runner: --helpfull and one refused header.
    assert len((tmp_path / "b" / "calls").read_text().splitlines()) == 2


def test_a_version_3_builds_beta2_is_adopted_by_the_case_and_then_every_step_compares(tmp_path):
    """SPEC: where a build hard-codes a hyper-parameter, the case's references train with the build's
    value (the plan adopts it, plan.adopt_hard_coded): the case then runs all its steps there."""
    from lockstep.plan import adopt_hard_coded

    fake_qwen3(tmp_path / "b", V3_REFUSAL)
    runner = InfiniTrainRunner(tmp_path / "b")
    fixed = runner.hard_coded(case(steps=10), inputs(tmp_path))
    assert fixed.fields == {"adam_beta2": 0.95}
    assert fixed.why == ("this InfiniTrain build's qwen3 hard-codes Adam (beta 0.9/0.95, eps 1e-08, bias-corrected, "
                         "no weight decay)")
    notes: list[str] = []
    [adopted] = adopt_hard_coded([case(steps=10)], [runner], {"qwen3_1": inputs(tmp_path)}, notes)
    assert adopted.adam_beta2 == 0.95 and adopted.optimizer_of(inputs(tmp_path).family.optimizer).beta2 == 0.95
    assert notes == [f"case qwen3_1: every framework trains with adam_beta2 = 0.95 ({fixed.why}; the contract's is Adam "
                     "(beta 0.9/0.999, eps 1e-08, bias-corrected, no weight decay))"]
    assert runner.skip_reason(adopted, inputs(tmp_path)) is None
    assert runner.hard_coded(adopted, inputs(tmp_path)) is None  # nothing left to adopt


def test_a_version_3_build_gets_zero_1_as_its_distributed_optimizer(tmp_path):
    fake_qwen3(tmp_path / "b", V3_REFUSAL)
    runner = InfiniTrainRunner(tmp_path / "b")
    cmd = runner.training_command(case(zero=1, dp=2), inputs(tmp_path, device="cuda"), threads=2)
    assert "--use_distributed_optimizer=true" in cmd and "--zero_stage" not in cmd
    assert runner.skip_reason(case(zero=2, dp=2), inputs(tmp_path, device="cuda")) == (
        "this InfiniTrain build's qwen3 has only --use_distributed_optimizer (ZeRO-1), not ZeRO stage 2")


def test_a_shape_version_3_cannot_hold_is_skipped(tmp_path):
    fake_qwen3(tmp_path / "b", V3_REFUSAL)
    wide = Qwen3Config(max_seq_len=64, num_layers=1, num_heads=4, num_kv_heads=2, channels=32, intermediate_size=80)
    reason = InfiniTrainRunner(tmp_path / "b").skip_reason(
        case(), RunInputs(checkpoint=tmp_path / "m.bin", tokens=tmp_path / "t.bin", model=wide, device="cpu"))
    assert reason == ("this InfiniTrain build reads Qwen3 LLMC version 3, which cannot hold this shape: the version-3 "
                      "header has no intermediate size: its reader takes I = 96 (and its model builds 96) for C=32, "
                      "but this shape has I=80")


def test_version_4_builds_read_the_case_file_and_other_versions_are_skipped(tmp_path):
    fake_qwen3(tmp_path / "v4", "Check failed: version == kQwen3FP32Version (0 vs. 4)",
               flags=A3F84F8_FLAGS + ("save", "zero_stage"))
    v4 = InfiniTrainRunner(tmp_path / "v4")
    assert v4.skip_reason(case(steps=10), inputs(tmp_path)) is None
    facts = v4.facts("qwen3")
    assert adapter_for("qwen3").checkpoint_for(facts, tmp_path / "model.bin", "", SMALL, tmp_path) == tmp_path / "model.bin"
    fake_qwen3(tmp_path / "v7", "Check failed: version == kQwen3FP32Version (0 vs. 7)")
    assert InfiniTrainRunner(tmp_path / "v7").skip_reason(case(), inputs(tmp_path)) == (
        "this InfiniTrain build's qwen3 reads Qwen3 LLMC version 7; lockstep writes versions 3 (branch "
        "feat/add_Qwen3-8B) and 4 (PR #208)")


def test_a_version_3_build_is_handed_a_version_3_copy_written_once(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {n: rng.standard_normal(s, dtype=np.float32) for n, s in SMALL.tensor_shapes()}
    source = tmp_path / "qwen3_small.bin"
    FAMILIES["qwen3"].write(source, SMALL, tensors)
    fake_qwen3(tmp_path / "b", V3_REFUSAL)
    facts = InfiniTrainRunner(tmp_path / "b").facts("qwen3")
    dest_dir = tmp_path / "run"
    dest_dir.mkdir()
    written = adapter_for("qwen3").checkpoint_for(facts, source, "", SMALL, dest_dir)
    assert written == dest_dir / f"qwen3_small.{sha256_file(source)[:16]}.qwen3-v3.bin"
    write_v3(tmp_path / "direct.bin", SMALL, tensors)
    assert sha256_file(written) == sha256_file(tmp_path / "direct.bin")
    stamp = written.stat().st_mtime_ns
    assert adapter_for("qwen3").checkpoint_for(facts, source, "", SMALL, dest_dir) == written
    assert written.stat().st_mtime_ns == stamp
    # The plan's digest names the copy when it is given (no second hash of a large file).
    given = adapter_for("qwen3").checkpoint_for(facts, source, "ab" * 32, SMALL, dest_dir)
    assert given == dest_dir / f"qwen3_small.{'ab' * 8}.qwen3-v3.bin"
    assert sha256_file(given) == sha256_file(tmp_path / "direct.bin")
