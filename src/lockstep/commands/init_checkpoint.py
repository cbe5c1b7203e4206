"""`lockstep init-checkpoint`: write llm.c's seeded GPT-2 init as an LLMC checkpoint.

Every framework in a comparison starts from this file (InfiniTrain reads it directly), so the
command prints its sha256: two machines that print the same digest start from the same weights.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from lockstep.errors import LockstepError
from lockstep.formats.llmc_gpt2 import VERSION_BF16, VERSION_FP32, gpt2_file_size
from lockstep.fsutil import sha256_file
from lockstep.models.configs import MODEL_SHAPES, model_shape
from lockstep.models.init import write_initial_checkpoint


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; a seed is a non-negative integer")
    return value


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "init-checkpoint", help="write llm.c's seeded GPT-2 init as an LLMC checkpoint",
        description="Write a GPT-2 checkpoint in llm.c's format with llm.c's init (weights N(0, 0.02), residual "
                    "projections N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1, padding rows 0). The same "
                    "seed writes the same bytes on every machine.")
    p.add_argument("--model", required=True, choices=sorted(MODEL_SHAPES), help="model shape")
    p.add_argument("--seed", type=_seed, default=42, help="random seed (default 42)")
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help="checkpoint to write (replaced atomically)")
    p.add_argument("--bf16", action="store_true",
                   help="store bf16 tensors (version 5, rounded to nearest even) instead of fp32 (version 3); "
                        "InfiniTrain reads only version 3")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = model_shape(args.model)
    version = VERSION_BF16 if args.bf16 else VERSION_FP32
    out: Path = args.out
    if out.is_dir():
        raise LockstepError(f"{out} is a directory; --out needs a file name")
    started = time.perf_counter()
    try:
        write_initial_checkpoint(out, config, args.seed, version=version)
    except OSError as e:
        raise LockstepError(f"cannot write {out}: {e.strerror or e}") from None
    seconds = time.perf_counter() - started
    size = out.stat().st_size
    expected = gpt2_file_size(config, version)
    if size != expected:  # cannot happen unless the writer is broken; never hand out such a file
        raise LockstepError(f"{out} is {size} bytes but a version {version} {args.model} checkpoint is {expected}")
    dtype = "bf16" if version == VERSION_BF16 else "fp32"
    print(f"wrote {out}")
    print(f"  model       {args.model}: maxT={config.max_seq_len} V={config.vocab_size} L={config.num_layers} "
          f"NH={config.num_heads} C={config.channels} Vp={config.padded_vocab_size}")
    print(f"  init        llm.c, seed {args.seed}")
    print(f"  format      LLMC GPT-2 version {version} ({dtype})")
    print(f"  parameters  {config.num_parameters():,}")
    print(f"  bytes       {size:,}")
    print(f"  sha256      {sha256_file(out)}")
    print(f"  took        {seconds:.1f} s")
    return 0
