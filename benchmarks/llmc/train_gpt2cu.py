"""llm.c's CUDA trainer (`train_gpt2cu`) as a command-runner trainer: GPT-2's hand-tuned speed anchor.

    lockstep run --command-runner benchmarks/llmc/train_gpt2cu.toml --command-build ~/llm.c \\
        --frameworks pytorch,megatron,llmc-cuda --cases gpt2_2_bfloat16

It starts train_gpt2cu (built with llm.c's default BF16 precision) from the case's LLMC checkpoint,
re-written as llm.c's BF16 checkpoint (version 5: the same tensors rounded to bfloat16, as llm.c's
own BF16 files are), on the case's token file with the case's batch, sequence length, steps and lr,
and writes the step lines it prints as JSON step records (`--steps-file`) with its own ms and tok/s.

train_gpt2cu trains its own recipe (shuffled data, AdamW with beta2 0.95, gradient clipping at 1.0),
so lockstep reads its tok/s only: the TOML declares it a `speed_anchor`.

It runs with lockstep's interpreter ({python}) and reads and writes the checkpoint with lockstep's own
LLMC code; llm.c's sources are not needed, only the built binary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# train_gpt2.cu's step line:
# "step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s"
STEP_LINE = re.compile(r"^step\s+(\d+)/(\d+) \| loss (\S+) \(.*?\)\| norm \S+ \(.*?\)\| lr (\S+) \| ([\d.]+) ms \| "
                       r"(-?[\d.]+)% bf16 MFU \| (\d+) tok/s")


class Refused(Exception):
    """A problem with the inputs, said in one sentence."""


def to_bf16_checkpoint(src: Path, dst: Path) -> None:
    """llm.c's FP32 GPT-2 checkpoint (version 3) as its BF16 one (version 5), through lockstep's own
    reader and writer: every float rounded to nearest even bfloat16, as torch's .to(bfloat16) does."""
    from lockstep.errors import FormatError
    from lockstep.models import FAMILIES, load_checkpoint

    gpt2 = FAMILIES["gpt2"]
    try:
        ckpt = load_checkpoint(src)
    except FormatError as e:
        raise Refused(str(e)) from None
    if ckpt.family != gpt2.name or ckpt.version != gpt2.fp32_version:
        raise Refused(f"{src} is a {ckpt.family} checkpoint of version {ckpt.version}, not GPT-2's float32 "
                      f"(version {gpt2.fp32_version}), which train_gpt2cu starts from")
    gpt2.write(dst, ckpt.config, ckpt.tensors, bf16=True)


def step_records(text: str) -> list[dict]:
    """train_gpt2cu's step lines as lockstep's JSON step records (step, loss, step_ms, tokens_per_s)."""
    out = []
    for line in text.splitlines():
        m = STEP_LINE.match(line.strip())
        if m:
            out.append({"step": int(m.group(1)), "loss": float(m.group(3)), "step_ms": float(m.group(5)),
                        "tokens_per_s": float(m.group(7))})
    return out


def cuda_library_dirs() -> list[str]:
    """The CUDA libraries (cuBLAS, cuBLASLt, cudart) of the NVIDIA wheels torch was installed with,
    for a binary built against them: every `nvidia/*/lib` beside this interpreter's packages."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    return sorted(str(p) for root in roots for p in Path(root).glob("*/lib") if p.is_dir())


def command(args, model: Path) -> list[str]:
    binary = Path(args.build) / "train_gpt2cu"
    if not os.access(binary, os.X_OK):
        raise Refused(f"{binary} is not an executable train_gpt2cu (build llm.c with `make train_gpt2cu`)")
    # -v/-m: one validation batch (train_gpt2cu always validates at step 0 and at the end); -s 0: no sampling.
    return [str(binary), "-i", args.tokens, "-j", args.tokens, "-e", str(model), "-b", str(args.B), "-t", str(args.T),
            "-d", str(args.total_batch), "-x", str(args.steps), "-l", args.lr, "-u", "0", "-q", "1.0", "-c", "0.0",
            "-v", str(args.steps + 1), "-m", "1", "-s", "0", "-n", "0"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", required=True, help="llm.c's directory holding the built train_gpt2cu")
    p.add_argument("--llmc", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("-B", type=int, required=True)
    p.add_argument("-T", type=int, required=True)
    p.add_argument("--total-batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", required=True)
    p.add_argument("--steps-file", required=True)
    args = p.parse_args(argv)
    try:
        model = Path(args.out) / "model_bf16.bin"
        cmd = command(args, model)  # the binary is checked before 250 MB are written for it
        to_bf16_checkpoint(Path(args.llmc), model)
    except (Refused, OSError) as e:
        print(f"train_gpt2cu.py: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*cuda_library_dirs(), env.get("LD_LIBRARY_PATH", "")]).strip(os.pathsep)
    print("[train_gpt2cu]", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    sys.stdout.write(proc.stdout)
    with open(args.steps_file, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in step_records(proc.stdout))
    model.unlink(missing_ok=True)  # 250 MB for GPT-2 124M, rewritten each run
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
