"""`lockstep convert --from-hf DIR`: a Hugging Face checkpoint as its family's LLMC file.

So that a run can start from pretrained weights (`lockstep run --llmc FILE`) instead of llm.c's
random init, as the seed's GPT-2, Llama 3 and Qwen3 tables do. What each family's conversion
does is in its `models/<family>/hf.py`; the command prints it, and the file's sha256.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lockstep.errors import FormatError
from lockstep.fsutil import format_bytes, sha256_file
from lockstep.models.family import HFOptions
from lockstep.models.hf_convert import convert_hf_checkpoint, convertible_families

DTYPE_WORDS = {"F32": "fp32", "BF16": "bf16", "F16": "fp16", "F64": "fp64"}


def add_parser(subparsers) -> None:
    names = [f.name for f in convertible_families()]
    p = subparsers.add_parser(
        "convert", help="write a Hugging Face checkpoint (safetensors) as an LLMC checkpoint",
        description="Convert a Hugging Face Transformers checkpoint directory (config.json and model.safetensors, or "
                    "shards with model.safetensors.index.json; fp32, bf16 or fp16) into the family's LLMC file, laid "
                    "out as llm.c and InfiniTrain-Test's converters write it. Then: lockstep run --llmc FILE.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-hf", type=Path, metavar="DIR", help="the checkpoint's folder")
    source.add_argument("--from-infinitrain", type=Path, metavar="DIR",
                        help="InfiniTrain's native checkpoint folder (checkpoint_step_NNNNNN/, from --save)")
    p.add_argument("--like", type=Path, metavar="FILE", help="--from-infinitrain: an LLMC file of the same shape "
                                                              "(e.g. the run's init), for the header fields")
    p.add_argument("--model", help="--from-infinitrain: the registered shape instead of --like (GPT-2 needs neither)")
    p.add_argument("--family", choices=names, default=None,
                   help="the model family (default: from config.json's model_type, which must agree)")
    p.add_argument("--out", required=True, type=Path, metavar="FILE",
                   help="LLMC file to write (replaced atomically; a file there that is not an LLMC checkpoint is "
                        "refused, and never one of the checkpoint's own files)")
    p.add_argument("--force", action="store_true",
                   help="--out holds a file that is not an LLMC checkpoint: move it aside "
                        "(<name>.moved-by-lockstep-<UTC time>) instead of refusing; nothing is deleted")
    p.add_argument("--no-rope-scaling", action="store_true",
                   help="Llama 3.1/3.2: write use_scaled_rope 0 although config.json scales RoPE, so that lockstep's "
                        "frameworks can train the file (they implement plain RoPE only)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.from_infinitrain is not None:
        return run_from_infinitrain(args)
    done = convert_hf_checkpoint(args.from_hf, args.out, args.family,
                                 HFOptions(drop_rope_scaling=args.no_rope_scaling), force=args.force)
    fam, config = done.family, done.model.config
    layout = fam.layout(config)
    stored = "one file" if done.shards == 1 else f"{done.shards} shards"
    dtypes = "/".join(DTYPE_WORDS.get(d, d) for d in done.source_dtypes)
    print(f"wrote {done.out}")
    if done.moved_aside is not None:
        print(f"  moved aside {done.out} (not an LLMC checkpoint, --force) -> {done.moved_aside}")
    for t in done.removed_temps:
        print(f"  removed     {t.path} ({format_bytes(t.size)}), left by lockstep process {t.pid}, which ended "
              "mid-write")
    print(f"  from        {done.source} (model_type {done.model_type}; {stored}, {dtypes})")
    print(f"  model       {fam.name}: {config.describe()} maxT={config.max_seq_len}")
    print(f"  format      LLMC {fam.title} version {layout.version} ({layout.dtype})")
    for i, note in enumerate(done.notes):
        print(f"  {'conversion' if i == 0 else '':<10}  {note}")
    print(f"  parameters  {config.num_parameters():,}")
    print(f"  bytes       {layout.file_size:,}")
    print(f"  sha256      {sha256_file(done.out)}")
    print(f"  took        {done.seconds:.1f} s")
    return 0


def run_from_infinitrain(args: argparse.Namespace) -> int:
    from lockstep.runners.infinitrain.convert import convert_infinitrain_checkpoint

    _check_is_folder(args.from_infinitrain)
    done = convert_infinitrain_checkpoint(args.from_infinitrain, args.out, like=args.like, model=args.model)
    print(f"wrote {done.out}")
    print(f"  from        {done.source} (InfiniTrain checkpoint" + (f", step {done.step})" if done.step else ")"))
    print(f"  model       {done.family}: {done.config.describe()} maxT={done.config.max_seq_len}")
    if done.dropped:
        print(f"  left out    {', '.join(done.dropped)} (no LLMC tensor)")
    print(f"  sha256      {sha256_file(done.out)}")
    return 0


def _check_is_folder(path: Path) -> None:
    """Say what --from-infinitrain names when it is no folder at all, before the checkpoint reader
    judges a folder's contents."""
    if not path.exists():
        raise FormatError(path, "no such directory; give InfiniTrain's checkpoint folder (checkpoint_step_NNNNNN/)")
    if not path.is_dir():
        raise FormatError(path, "is a file, not a folder; give InfiniTrain's checkpoint folder "
                                "(checkpoint_step_NNNNNN/, holding model.ckpt and trainer_state.json)")
