"""`lockstep init-checkpoint`: write llm.c's seeded init of a registered model as an LLMC checkpoint.

Every framework in a comparison starts from this file (InfiniTrain reads it directly), so the
command prints its sha256: two machines that print the same digest start from the same weights.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from lockstep.commands.arguments import seed_argument
from lockstep.errors import LockstepError
from lockstep.fsutil import sha256_file, write_error
from lockstep.models import SHAPES, family, model_shape
from lockstep.models.init import write_initial_checkpoint


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "init-checkpoint", help="write llm.c's seeded init of a model as an LLMC checkpoint",
        description="Write a checkpoint in the model family's LLMC format with llm.c's init (matrices N(0, 0.02), "
                    "residual projections N(0, 0.02/sqrt(2L)), biases 0, norm weights 1, padding rows 0). The same "
                    "seed writes the same bytes on every machine.")
    p.add_argument("--model", required=True, choices=list(SHAPES), help="registered model shape")
    p.add_argument("--seed", type=seed_argument, default=42, help="random seed (default 42)")
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help="checkpoint to write (replaced atomically)")
    p.add_argument("--bf16", action="store_true",
                   help="GPT-2 only: store bf16 tensors (version 5, rounded to nearest even) instead of fp32 "
                        "(version 3); InfiniTrain reads only version 3")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    shape = model_shape(args.model)
    fam = family(shape.family)
    if args.bf16 and fam.bf16_version is None:
        raise LockstepError(f"--bf16: {fam.title} checkpoints have no bf16 layout (only GPT-2's version 5)")
    config, layout = shape.config, fam.layout(shape.config, bf16=args.bf16)
    out: Path = args.out
    if out.is_dir():
        raise LockstepError(f"{out} is a directory; --out needs a file name")
    started = time.perf_counter()
    try:
        write_initial_checkpoint(out, fam, config, args.seed, bf16=args.bf16)
    except OSError as e:  # atomic_write names its own failures; this is anything else on the way
        raise write_error(out, e, "llm.c init checkpoint") from None
    seconds = time.perf_counter() - started
    size = out.stat().st_size
    if size != layout.file_size:  # cannot happen unless the writer is broken; never hand out such a file
        out.unlink(missing_ok=True)
        raise LockstepError(f"{out} is {size} bytes but a version {layout.version} {args.model} checkpoint is "
                            f"{layout.file_size}")
    print(f"wrote {out}")
    print(f"  model       {args.model}: {config.describe()} maxT={config.max_seq_len}")
    print(f"  init        llm.c, seed {args.seed}")
    print(f"  format      LLMC {fam.title} version {layout.version} ({layout.dtype})")
    print(f"  parameters  {config.num_parameters():,}")
    print(f"  bytes       {size:,}")
    print(f"  sha256      {sha256_file(out)}")
    print(f"  took        {seconds:.1f} s")
    return 0
