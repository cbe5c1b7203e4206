"""The small Adam case both `diagnose --at-step` test files run (a 2,048-token vocabulary keeps a diagnose to
seconds; llama3-tiny's 128,256 rows take minutes), written in memory: no ../shared needed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lockstep.cli import main
from lockstep.formats.tokens import write_token_stream
from lockstep.models import FAMILIES
from lockstep.models.init import write_initial_checkpoint
from lockstep.models.llama3.config import Llama3Config

SMALL_LLAMA = Llama3Config(max_seq_len=64, vocab_size=2048, num_layers=2, num_heads=4, num_kv_heads=2, channels=64)
MATRIX = """
[defaults]
model = "llama3"
dtype = "float32"
micro_batch = 2
seq_len = 32
total_batch = 64
steps = 6
lr = 1e-4

[[case]]
name = "adam"
"""


def write_inputs(d: Path) -> tuple[Path, Path, Path]:
    """(LLMC init, token stream, matrix) of the case `adam`, in `d`."""
    ckpt, tokens, matrix = d / "llama_small.bin", d / "tokens.bin", d / "adam.toml"
    write_initial_checkpoint(ckpt, FAMILIES["llama3"], SMALL_LLAMA, seed=42)
    write_token_stream(tokens, np.random.default_rng(0).integers(0, SMALL_LLAMA.vocab_size, size=4000))
    matrix.write_text(MATRIX)
    return ckpt, tokens, matrix


def diagnose(inputs: tuple[Path, Path, Path], out: Path, frameworks: str, *extra: str) -> int:
    """`lockstep diagnose` of case `adam` on the CPU, without the drift, as the CLI runs it."""
    ckpt, tokens, matrix = inputs
    return main(["diagnose", "--case", "adam", "--matrix", str(matrix), "--frameworks", frameworks, "--llmc", str(ckpt),
                 "--data", str(tokens), "--device", "cpu", "--out", str(out), "--no-drift", *extra])
