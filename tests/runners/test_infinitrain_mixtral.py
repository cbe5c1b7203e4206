"""The infinitrain runner's Mixtral path: InfiniTrain's `tiny_mixtral` (branch feat/support_moe, b7e0760).

Its flags (its own: --micro_batch_size, --global_batch_size in sequences, --log_interval), the shape
compiled into a build asked of its loader's refusals (runners/infinitrain/families/mixtral.py), the
cases it skips and why (another shape, any parallel layout, no executable, another LLMC version),
its stdout step line parsed, and MFU over the active (top-k) parameters. A fake `tiny_mixtral`
answers as b7e0760's does: gflags' --helpfull listing of main.cc's flags, gflags' refusal of an unknown
flag, glog's CHECK_EQ lines of checkpoint_loader.cc, std::cout step lines of main.cc:141-143.
The tests at the end ask a real build (LOCKSTEP_INFINITRAIN_BUILD with a tiny_mixtral) its flags,
version and compiled-in shape; none trains it (b7e0760's shape needs ~13 GB in FP32 with Adam).
"""

from __future__ import annotations

import json
import os
import stat
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.compare.throughput import throughput_of
from lockstep.errors import FormatError, LockstepError
from lockstep.formats.logs import parse_infinitrain_log, parse_log_file
from lockstep.formats.run_record import RunRecord
from lockstep.formats.tokens import write_token_stream
from lockstep.models import FAMILIES, SHAPES
from lockstep.models.family import OptimizerSpec
from lockstep.models.mixtral.checkpoint import encode_header
from lockstep.formats.llmc import CheckpointLayout
from lockstep.models.mixtral.config import MixtralConfig
from lockstep.runners.base import RunInputs
from lockstep.runners.infinitrain.families import adapter_for
from lockstep.runners.infinitrain.families.mixtral import NO_BUILD_HAS_F, compiled_shape
from lockstep.runners.infinitrain.probe import executable_flags, llmc_version_read
from lockstep.runners.infinitrain.runner import InfiniTrainRunner

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

B7E0760 = SHAPES["mixtral-l32-c512"].config
TINY = SHAPES["mixtral-tiny"].config
SMALL = MixtralConfig(max_seq_len=64, vocab_size=96, num_layers=2, num_heads=4, num_kv_heads=1, channels=32,
                      num_experts=4, router_topk=2, moe_ffn_hidden_size=40)
# example/tiny_mixtral/main.cc:24-35 at b7e0760.
MAIN_CC_FLAGS = ("input_bin", "micro_batch_size", "global_batch_size", "sequence_length", "num_iteration",
                 "learning_rate", "llmc_filepath", "device", "dtype", "log_interval", "print_timing")

# A fake tiny_mixtral (Python, run by this interpreter). Its compiled-in shape is compiled.json beside it
# (header words 2..16 as the loader reads them); every call's argv, and the header words 2..16 of the
# file it was given, are appended to `calls`.
FAKE = r'''
import json, os, struct, sys
here = os.path.dirname(os.path.abspath(__file__))
FLAGS = __FLAGS__
def log(msg):
    sys.stderr.write("F20261203 10:51:58.344971 140456017096768 checkpoint_loader.cc:34] " + msg + "\n*** Check failure stack trace: ***\n")
    sys.exit(134)
args, i, opts = sys.argv[1:], 0, {}
with open(os.path.join(here, "calls"), "a") as f:
    f.write(" ".join(args) + "\n")
if args == ["--helpfull"]:
    print("tiny_mixtral: Warning: SetUsageMessage() never called\n\n  Flags from example/tiny_mixtral/main.cc:")
    for name in FLAGS:
        print(f"    -{name} (the {name} flag) type: string default: \"\"")
    sys.exit(1)
while i < len(args):
    key = args[i][2:]
    if "=" in key:
        key, value = key.split("=", 1); i += 1
    else:
        value = args[i + 1]; i += 2
    if key not in FLAGS:
        sys.stderr.write(f"ERROR: unknown command line flag '{key}'\n"); sys.exit(1)
    opts[key] = value
compiled = json.load(open(os.path.join(here, "compiled.json")))
path = opts["llmc_filepath"]
raw = open(path, "rb").read()
w = struct.unpack("<256i", raw[:1024])
with open(os.path.join(here, "calls"), "a") as f:
    f.write("header " + " ".join(map(str, w[2:17])) + "\n")
if w[0] != 20260513:
    log(f"Check failed: infini_train::BytesToType<int32_t>(header, 0 * sizeof(int32_t)) == kTinyMixtralLLMCMagic ({w[0]} vs. 20260513) ")
if w[1] != 2:
    log(f"Check failed: infini_train::BytesToType<int32_t>(header, 1 * sizeof(int32_t)) == kTinyMixtralLLMCVersion ({w[1]} vs. 2) ")
f32 = lambda word: struct.unpack("<f", struct.pack("<i", word))[0]
got = {"block_size": w[2], "vocab_size": w[3], "original_vocab_size": w[3], "n_layer": w[4], "n_head": w[5],
       "n_kv_head": w[6], "n_embd": w[7], "ffn_expansion_ratio": f32(w[9]), "norm_eps": f32(w[12]),
       "rope_theta": f32(w[13]), "use_scaled_rope": w[14], "num_experts": w[8], "router_topk": w[15],
       "moe_ffn_hidden_size": w[16]}
for name, want in compiled.items():
    if got[name] != want:
        a, b = ("%g" % got[name], "%g" % want) if isinstance(want, float) else (got[name], want)
        log(f"Check failed: checkpoint_value == runtime_value ({a} vs. {b}) {name} value from checkpoint ({a}) "
            f"is not equal to runtime config value ({b}) ")
if len(raw) != int(open(os.path.join(here, "size")).read()):
    log("Check failed: ifs Failed to read tensor transformer.wte.weight ")
steps, T = int(opts["num_iteration"]), int(opts["sequence_length"])
tokens = int(opts["global_batch_size"]) * T
for step in range(steps):
    ms = 100.0 + step
    print("step {:4d}/{} | train loss {:.6f} | norm -1.0000 | lr {:.2e} | ({:.2f} ms | {:.0f} tok/s)".format(
        step + 1, steps, 4.5 - 0.125 * step, float(opts["learning_rate"]), ms, tokens / (ms / 1e3)), flush=True)
print("final {} iters avg: {:.3f}ms".format(steps - 1, 101.5))
'''


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def fake_tiny_mixtral(build: Path, compiled: MixtralConfig = B7E0760, flags=MAIN_CC_FLAGS) -> Path:
    build.mkdir(parents=True, exist_ok=True)
    c = compiled
    (build / "compiled.json").write_text(json.dumps({
        "block_size": c.max_seq_len, "vocab_size": c.vocab_size, "original_vocab_size": c.vocab_size,
        "n_layer": c.num_layers, "n_head": c.num_heads, "n_kv_head": c.num_kv_heads, "n_embd": c.channels,
        "ffn_expansion_ratio": f32(c.ffn_expansion_ratio), "norm_eps": f32(c.norm_eps),
        "rope_theta": f32(c.rope_theta), "use_scaled_rope": 0, "num_experts": c.num_experts,
        "router_topk": c.router_topk, "moe_ffn_hidden_size": c.moe_ffn_hidden_size}))
    (build / "size").write_text(str(1024 + 4 * c.num_parameters()))
    (build / "fake.py").write_text(FAKE.replace("__FLAGS__", repr(tuple(flags))))
    exe = build / "tiny_mixtral"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{build / "fake.py"}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def calls(build: Path) -> list[str]:
    return (build / "calls").read_text().splitlines()


def mixtral_case(name="mixtral_1", B=4, T=64, total=256, steps=10, dp=1, ep=1, tp=1, sp=False, zero=0,
                 dtype="float32") -> CaseSpec:
    return CaseSpec(name=name, model="mixtral-l32-c512", dtype=dtype, micro_batch=B, seq_len=T, total_batch=total,
                    steps=steps, lr=1e-4, dp=dp, ep=ep, tp=tp, sp=sp, zero=zero).check()


def mixtral_inputs(tmp_path: Path, model: MixtralConfig = B7E0760, device="cpu", checkpoint: Path | None = None,
                   tokens: Path | None = None) -> RunInputs:
    return RunInputs(checkpoint=checkpoint or tmp_path / "mixtral.bin", tokens=tokens or tmp_path / "train.bin",
                     model=model, device=device)


# ---------------------------------------------------------------------- flags


def test_flags_are_tiny_mixtral_s_own(tmp_path):
    """mixtral_accum2: B=4, 512 tokens a step of T=64 = 8 sequences, accumulation 2."""
    fake_tiny_mixtral(tmp_path / "b")
    runner = InfiniTrainRunner(tmp_path / "b")
    cmd = runner.training_command(mixtral_case(total=512), mixtral_inputs(tmp_path, device="cuda"), threads=1)
    assert cmd == [str(tmp_path / "b" / "tiny_mixtral"), "--input_bin", str(tmp_path / "train.bin"),
                   "--llmc_filepath", str(tmp_path / "mixtral.bin"), "--device", "cuda", "--dtype", "float32",
                   "--sequence_length", "64", "--num_iteration", "10", "--learning_rate", "0.0001",
                   "--micro_batch_size", "4", "--global_batch_size", "8", "--log_interval", "1"]
    # Every flag is one main.cc defines; gpt2's batch and world flags would stop it (gflags).
    assert {a[2:] for a in cmd[1::2]} <= set(MAIN_CC_FLAGS)
    bf16 = runner.training_command(mixtral_case(dtype="bfloat16"), mixtral_inputs(tmp_path), threads=1)
    assert bf16[bf16.index("--dtype") + 1] == "bfloat16" and bf16[bf16.index("--global_batch_size") + 1] == "4"


def test_the_fake_refuses_a_flag_main_cc_lacks_as_gflags_does(tmp_path):
    """Control for the end-to-end run below: the gpt2 example's --batch_size stops tiny_mixtral."""
    import subprocess

    exe = fake_tiny_mixtral(tmp_path / "b")
    done = subprocess.run([str(exe), "--batch_size", "4"], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr == "ERROR: unknown command line flag 'batch_size'\n"


# ---------------------------------------------------------------------- what the build is asked


def test_the_probe_reads_main_cc_s_flags_and_loader_version_2(tmp_path):
    exe = fake_tiny_mixtral(tmp_path / "b")
    assert executable_flags(exe) == frozenset(MAIN_CC_FLAGS)
    assert llmc_version_read(exe, 20260513) == 2  # from `... == kTinyMixtralLLMCVersion (0 vs. 2)`
    assert calls(tmp_path / "b")[-1] == "header " + " ".join(["0"] * 15)
    # Negative control: a refused magic names no version (magic 0 here: `... == kTinyMixtralLLMCMagic`).
    with pytest.raises(LockstepError, match="did not refuse it with a `Check failed: version"):
        llmc_version_read(exe, 0)


def test_a_b7e0760_build_states_its_shape_in_one_refusal(tmp_path):
    exe = fake_tiny_mixtral(tmp_path / "b")
    assert compiled_shape(exe) == B7E0760
    headers = [c for c in calls(tmp_path / "b") if c.startswith("header ")]
    # The probe's F is one no build has, so the loader stops at its last comparison, never allocates.
    assert headers == ["header 32768 128256 32 4 1 512 8 1080033280 0 0 925353388 1232348160 0 2 2147483647"]
    assert NO_BUILD_HAS_F == 2147483647


def test_another_compiled_shape_is_learned_field_by_field(tmp_path):
    """A build of another shape: one run per field that differs from b7e0760's, then the last field."""
    exe = fake_tiny_mixtral(tmp_path / "b", compiled=SMALL)
    assert compiled_shape(exe) == SMALL
    headers = [c.split()[1:] for c in calls(tmp_path / "b") if c.startswith("header ")]
    # block_size, vocab, n_layer, n_embd, num_experts differ (n_head, n_kv_head, k agree), then F.
    assert len(headers) == 6
    assert headers[-1] == ["64", "96", "2", "4", "1", "32", "4", "1080033280", "0", "0", "925353388", "1232348160",
                           "0", "2", "2147483647"]
    # Negative control: a build whose float field differs is learned too (the %g values read back).
    odd = MixtralConfig(rope_theta=500000.0, norm_eps=1e-6)
    assert compiled_shape(fake_tiny_mixtral(tmp_path / "odd", compiled=odd)) == odd != B7E0760


def test_a_build_that_answers_no_refusal_is_one_clear_error(tmp_path):
    build = tmp_path / "b"
    build.mkdir()
    exe = build / "tiny_mixtral"
    exe.write_text("#!/bin/sh\necho 'Segmentation fault' >&2\nexit 139\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(LockstepError) as e:
        compiled_shape(exe)
    assert str(e.value) == (f"cannot tell which Mixtral shape {exe} has compiled in: given a header-only file it did "
                            "not refuse a field with `... value from checkpoint (a) is not equal to runtime config "
                            "value (b)`; its output ended: Segmentation fault")


# ---------------------------------------------------------------------- skips, each with its reason


def test_only_the_compiled_shape_runs_and_another_is_skipped_naming_it(tmp_path):
    fake_tiny_mixtral(tmp_path / "b")
    runner = InfiniTrainRunner(tmp_path / "b")
    assert runner.skip_reason(mixtral_case(), mixtral_inputs(tmp_path)) is None
    assert runner.skip_reason(mixtral_case(), mixtral_inputs(tmp_path, model=TINY)) == (
        "this InfiniTrain build's tiny_mixtral trains only the shape compiled into it (example/tiny_mixtral/config.h), "
        "mixtral-l32-c512 (L=32 NH=4 kv=1 C=512 E=8 top-2 F=1792 V=128256, max T 32768); this model differs in "
        "max_seq_len 1024 (build: 32768), num_layers 2 (build: 32), channels 64 (build: 512), "
        "moe_ffn_hidden_size 224 (build: 1792)")
    # One field off is named alone.
    theta = MixtralConfig(rope_theta=500000.0)
    assert runner.skip_reason(mixtral_case(), mixtral_inputs(tmp_path, model=theta)).endswith(
        "this model differs in rope_theta 500000 (build: 1e+06)")
    wide = MixtralConfig(vocab_size=1_234_567)  # counts in full, not as %g's 1.23457e+06
    assert runner.skip_reason(mixtral_case(), mixtral_inputs(tmp_path, model=wide)).endswith(
        "this model differs in vocab_size 1234567 (build: 128256)")
    # Asked once per runner: --helpfull, the version-0 header, one shape header.
    assert len([c for c in calls(tmp_path / "b") if not c.startswith("header ")]) == 3


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("layout,label", [
    (dict(dp=2, total=512), "DP=2"),
    (dict(dp=2, ep=2, total=512), "DP=2 EP=2"),
    (dict(tp=2, sp=True), "DP=1 TP=2+SP"),
    (dict(dp=2, zero=1, total=512), "DP=2 ZeRO-1"),
])
def test_parallel_cases_are_skipped_on_any_device(tmp_path, device, layout, label):
    fake_tiny_mixtral(tmp_path / "b")
    reason = InfiniTrainRunner(tmp_path / "b").skip_reason(mixtral_case(**layout), mixtral_inputs(tmp_path,
                                                                                                   device=device))
    assert reason == (f"InfiniTrain's tiny_mixtral trains on one device only, not {label}: its main.cc fixes one "
                      "thread, TP=1 and PP=1 (InitAllEnv(1, 1, false, 1, 1)) and config.h CHECKs EP=1; it has no "
                      "parallel flag")
    assert not (tmp_path / "b" / "calls").exists()  # decided without asking the build


def test_a_build_without_tiny_mixtral_skips_its_cases_and_is_not_refused(tmp_path):
    build = tmp_path / "b"
    build.mkdir()
    runner = InfiniTrainRunner(build)
    inputs = mixtral_inputs(tmp_path)
    runner.preflight(inputs)
    assert runner.skip_reason(mixtral_case(), inputs) == (
        "this InfiniTrain build has no tiny_mixtral executable (only InfiniTrain's branch feat/support_moe "
        "(b7e0760) has one)")
    fake_tiny_mixtral(build)  # control: with one, the case runs
    assert InfiniTrainRunner(build).skip_reason(mixtral_case(), inputs) is None


def test_a_loader_of_another_version_is_skipped(tmp_path):
    exe = fake_tiny_mixtral(tmp_path / "b")
    exe.write_text("#!/bin/sh\n[ \"$1\" = --helpfull ] && { echo '    -llmc_filepath (x) type: string'; exit 1; }\n"
                   "echo 'F1203 checkpoint_loader.cc:46] Check failed: infini_train::BytesToType<int32_t>(header, "
                   "1 * sizeof(int32_t)) == kTinyMixtralLLMCVersion (0 vs. 3) ' >&2\nexit 134\n")
    assert InfiniTrainRunner(tmp_path / "b").skip_reason(mixtral_case(), mixtral_inputs(tmp_path)) == (
        "this InfiniTrain build's tiny_mixtral reads Mixtral LLMC version 3; lockstep writes version 2 "
        "(branch feat/support_moe, b7e0760)")


def test_no_certificate_since_it_has_no_save(tmp_path):
    fake_tiny_mixtral(tmp_path / "b")
    runner = InfiniTrainRunner(tmp_path / "b")
    assert runner.capture_problem(mixtral_case(), mixtral_inputs(tmp_path)) == (
        "this InfiniTrain build's tiny_mixtral has no --save, and its step 1 is captured from the weights it saves")
    # Control: a build that had --save would be captured.
    fake_tiny_mixtral(tmp_path / "s", flags=MAIN_CC_FLAGS + ("save",))
    assert InfiniTrainRunner(tmp_path / "s").capture_problem(mixtral_case(), mixtral_inputs(tmp_path)) is None


def test_its_optimizer_is_the_contract_s_adam():
    adapter = adapter_for("mixtral")
    adapter.preflight(B7E0760, Path("m.bin"), FAMILIES["mixtral"].optimizer)
    with pytest.raises(LockstepError) as e:
        adapter.preflight(B7E0760, Path("m.bin"), OptimizerSpec("adam", beta1=0.9, beta2=0.95, eps=1e-8,
                                                                weight_decay=0.0))
    assert str(e.value) == ("InfiniTrain's tiny_mixtral hard-codes Adam (beta 0.9/0.999, eps 1e-08, bias-corrected, "
                            "no weight decay), the contract asks for Adam (beta 0.9/0.95, eps 1e-08, bias-corrected, "
                            "no weight decay)")


# ---------------------------------------------------------------------- its step line


# main.cc:141-143's std::format, as b7e0760 prints it to stdout (no glog prefix).
REAL_LINE = "step    1/10 | train loss 11.771182 | norm -1.0000 | lr 1.00e-04 | (14567.44 ms | 18 tok/s)"


def test_its_stdout_step_line_parses_to_exact_numbers():
    text = f"[COMMAND] /b/tiny_mixtral --input_bin t.bin\n{REAL_LINE}\nfinal 1 iters avg: 14567.440ms\n"
    rec = parse_infinitrain_log(text, "mixtral_1.log", glog=False)
    assert rec.framework == "infinitrain" and rec.case == "mixtral_1" and len(rec.steps) == 1
    s = rec.steps[0]
    assert (s.step, s.loss, s.lr, s.step_ms, s.tokens_per_s) == (1, 11.771182, 1e-4, 14567.44, 18.0)
    assert rec.meta["steps_planned"] == 10 and rec.meta["loss_quantum"] == 1e-6
    # Negative control: read as glog lines (gpt2/llama3's), the same text holds no step.
    with pytest.raises(FormatError, match="holds no InfiniTrain step lines"):
        parse_infinitrain_log(text, "mixtral_1.log")


def test_a_run_of_the_fake_trains_reads_its_steps_and_records_the_command(tmp_path):
    """End to end through execute(): the flags the fake accepts, its stdout lines as the steps."""
    rng = np.random.default_rng(0)
    ckpt = tmp_path / "small.bin"
    FAMILIES["mixtral"].write(ckpt, SMALL, {n: rng.standard_normal(s).astype(np.float32)
                                            for n, s in SMALL.tensor_shapes()})
    tokens = tmp_path / "train.bin"
    write_token_stream(tokens, [i % 96 for i in range(3 * 512 + 64)])
    fake_tiny_mixtral(tmp_path / "b", compiled=SMALL)
    case = CaseSpec(name="mixtral_accum2", model="small", dtype="float32", micro_batch=4, seq_len=64, total_batch=512,
                    steps=3, lr=1e-4).check()
    inputs = mixtral_inputs(tmp_path, model=SMALL, device="cpu", checkpoint=ckpt, tokens=tokens)
    runner = InfiniTrainRunner(tmp_path / "b")
    assert runner.skip_reason(case, inputs) is None
    rec = runner.run(case, inputs, tmp_path / "out")
    assert rec.ok, rec.error
    assert [(s.step, s.loss, s.step_ms, s.tokens_per_s) for s in rec.steps] == [
        (1, 4.5, 100.0, 5120.0), (2, 4.375, 101.0, 5069.0), (3, 4.25, 102.0, 5020.0)]
    log = tmp_path / "out" / "infinitrain" / "mixtral_accum2.log"
    assert log.read_text().startswith(f"[COMMAND] {tmp_path / 'b' / 'tiny_mixtral'} --input_bin ")
    assert "--micro_batch_size 4 --global_batch_size 8 --log_interval 1" in rec.meta["worker_command"]
    # MFU's FLOPs from the record's model: the active parameters (2 of 4 experts here).
    flops = throughput_of(rec).flops_per_token
    assert flops == SMALL.flops_per_token(64) == 6 * SMALL.matmul_parameters() + 12 * 2 * 64 * 32
    assert SMALL.matmul_parameters() == SMALL.num_parameters() - 96 * 32 - 2 * 2 * 3 * 32 * 40
    # `lockstep compare` of the native log alone reads it as llm.c step lines (no glog prefix).
    assert [s.loss for s in parse_log_file(log).steps] == [4.5, 4.375, 4.25]


# ---------------------------------------------------------------------- MFU over active parameters


def test_b7e0760_shape_counts_active_parameters_for_mfu():
    """config.h's shape: 857,113,088 parameters, 262,963,712 of them multiply a token (2 of 8 experts
    per layer, wte not counted). MFU = (6·N_active + 12·L·T·NH·hd) · tok/s / peak."""
    C, V, L, F, E, k, hd = 512, 128256, 32, 1792, 8, 2, 128
    per_layer = C + (4 + 2) * hd * C + C * C + C + E * C  # norms, qkv, attention out, router
    assert B7E0760.num_parameters() == L * (per_layer + E * 3 * C * F) + 2 * V * C + C == 857_113_088
    assert B7E0760.matmul_parameters() == L * (per_layer + k * 3 * C * F) + V * C + C == 262_963_712
    assert B7E0760.flops_per_token(64) == 6 * 262_963_712 + 12 * L * 64 * 4 * hd == 1_590_365_184
    rec = RunRecord(framework="infinitrain", case="mixtral_1",
                    steps=parse_infinitrain_log("\n".join(
                        f"step {i:4d}/4 | train loss 11.0 | norm -1.0000 | lr 1.00e-04 | (25.60 ms | 10000 tok/s)"
                        for i in range(1, 5)), "mixtral_1.log", glog=False).steps,
                    meta={"model": B7E0760.to_dict(), "case_spec": {"seq_len": 64, "dtype": "float32"},
                          "device": "cuda"})
    t = throughput_of(rec, peak_tflops=100.0)
    assert t.flops_per_token == 1_590_365_184 and t.mfu == pytest.approx(0.1590365184, rel=1e-12)
    # Negative control: counting all 8 experts (dense) would claim 3.0x the model FLOPs, and MFU.
    dense = 6 * (B7E0760.num_parameters() - V * C) + 12 * L * 64 * 4 * hd
    assert dense == 4_761_259_008 and dense / t.flops_per_token == pytest.approx(2.99381, abs=1e-5)


def test_the_probe_header_is_the_loader_s_word_for_word():
    """checkpoint_loader.cc:45-66 reads words 0-16; the probe writes them through the family's codec."""
    words = encode_header(CheckpointLayout(2, B7E0760, "fp32")).tolist()
    bits = lambda x: struct.unpack("<i", struct.pack("<f", x))[0]  # noqa: E731
    assert words[:17] == [20260513, 2, 32768, 128256, 32, 4, 1, 512, 8, bits(3.5), 0, 0, bits(1e-5), bits(1e6), 0, 2,
                          1792]
    assert not any(words[17:])


# ---------------------------------------------------------------------- a real build


REAL_BUILD = os.environ.get("LOCKSTEP_INFINITRAIN_BUILD")
real_tiny_mixtral = pytest.mark.skipif(
    not (REAL_BUILD and (Path(REAL_BUILD) / "tiny_mixtral").is_file()),
    reason="set LOCKSTEP_INFINITRAIN_BUILD to an InfiniTrain build with a tiny_mixtral executable (branch "
           "feat/support_moe, b7e0760)")


@real_tiny_mixtral
def test_a_real_tiny_mixtral_answers_the_probes():
    runner = InfiniTrainRunner(REAL_BUILD)
    facts = runner.facts("mixtral")
    assert set(MAIN_CC_FLAGS) <= facts.flags and not facts.has_flag("save")
    assert facts.llmc_version == 2
    assert facts.compiled_model == B7E0760


@real_tiny_mixtral
def test_a_real_tiny_mixtral_skips_mixtral_tiny_naming_its_shape(tmp_path):
    reason = InfiniTrainRunner(REAL_BUILD).skip_reason(mixtral_case(), mixtral_inputs(tmp_path, model=TINY,
                                                                                      device="cpu"))
    assert reason.startswith("this InfiniTrain build's tiny_mixtral trains only the shape compiled into it "
                             "(example/tiny_mixtral/config.h), mixtral-l32-c512 (")
