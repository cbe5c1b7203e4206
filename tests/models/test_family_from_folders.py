"""A model family is only its folders: a toy family, `nanogpt` (GPT-2's math under its own name and
LLMC magic number), written by this test into a package of its own outside lockstep, is found
through LOCKSTEP_FAMILY_PACKAGES, planned, trained on pytorch and megatron on a CPU (megatron's
torchrun workers find it through the environment they inherit) and judged, with no lockstep file
edited (docs/contributing.md#adding-a-model-family)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

FILES = {
    "__init__.py": "",
    "nanogpt/__init__.py": '''
        """nanogpt: GPT-2's math under its own name, magic number and shapes."""
        from lockstep.models.family import ModelFamily, ModelShape, OptimizerSpec
        from lockstep.models.gpt2 import init_rule
        from toyfams.nanogpt import checkpoint
        from toyfams.nanogpt.config import NanoGPTConfig

        FAMILY = ModelFamily(
            name="nanogpt", title="nanoGPT", config_type=NanoGPTConfig, magic=checkpoint.MAGIC, tokenizer="gpt2",
            optimizer=OptimizerSpec("sgd"), decode_header=checkpoint.decode_header,
            encode_header=checkpoint.encode_header, fp32_version=3, bf16_version=5, init_rule=init_rule,
            cpu_shape="nanogpt-tiny", reference="toyfams.nanogpt.model:NanoGPT",
            padding_rows=lambda config: {"wte": config.vocab_size},
            unsupported_runners={"infinitrain": "no InfiniTrain example trains nanogpt"})
        SHAPES = (ModelShape("nanogpt-tiny", "nanogpt", NanoGPTConfig(num_layers=2, num_heads=4, channels=64),
                             "nanoGPT L2 NH4 C64"),)
        ''',
    "nanogpt/config.py": '''
        from dataclasses import dataclass
        from typing import ClassVar

        from lockstep.models.gpt2.config import GPT2Config


        @dataclass(frozen=True)
        class NanoGPTConfig(GPT2Config):
            family: ClassVar[str] = "nanogpt"
        ''',
    "nanogpt/checkpoint.py": '''
        import dataclasses

        import numpy as np

        from lockstep.errors import FormatError
        from lockstep.models.gpt2 import checkpoint as gpt2
        from toyfams.nanogpt.config import NanoGPTConfig

        MAGIC = 20991231


        def decode_header(header, path):
            if int(header[0]) != MAGIC:
                raise FormatError(path, f"wrong magic number {int(header[0])} for a nanoGPT checkpoint")
            words = np.array(header, copy=True)
            words[0] = gpt2.GPT2_MAGIC
            layout = gpt2.decode_header(words, path)
            config = NanoGPTConfig(**dataclasses.asdict(layout.config))
            return dataclasses.replace(layout, config=config)


        def encode_header(layout):
            header = gpt2.encode_header(layout)
            header[0] = MAGIC
            return header
        ''',
    "nanogpt/model.py": '''
        from lockstep.models.gpt2.model import GPT2


        class NanoGPT(GPT2):
            """GPT-2's reference module, unchanged."""
        ''',
    "nanogpt/megatron.py": '''
        from lockstep.runners.megatron.families.gpt2 import GPT2Adapter


        class NanoGPTAdapter(GPT2Adapter):
            family = "nanogpt"


        ADAPTER = NanoGPTAdapter()
        ''',
}

MATRIX = """
[defaults]
model = "nanogpt-tiny"
seq_len = 32
steps = 3
lr = 1e-4

[[case]]
name = "nanogpt_1"
dtype = "float32"
dp = 1
micro_batch = 2
total_batch = 128
"""


def write_package(root: Path) -> None:
    for rel, text in FILES.items():
        path = root / "toyfams" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


def lockstep(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(root)]), "LOCKSTEP_FAMILY_PACKAGES": "toyfams"}
    return subprocess.run([sys.executable, "-m", "lockstep", *args], env=env, capture_output=True, text=True,
                          timeout=1200)


@pytest.mark.integration
def test_a_family_added_as_folders_only_plans_trains_and_passes(tmp_path, tiny_shakespeare_train):
    pytest.importorskip("megatron.core")
    root = tmp_path / "pkg"
    write_package(root)
    matrix = tmp_path / "nanogpt.toml"
    matrix.write_text(MATRIX, encoding="utf-8")
    common = ["run", "--matrix", str(matrix), "--frameworks", "pytorch,megatron", "--data", str(tiny_shakespeare_train),
              "--device", "cpu"]

    dry = lockstep(root, *common, "--dry-run", "--out", str(tmp_path / "dry"))
    assert dry.returncode == 0, dry.stderr
    assert "nanogpt_1" in dry.stdout and "Traceback" not in dry.stderr

    real = lockstep(root, *common, "--out", str(tmp_path / "o"))
    assert real.returncode == 0, real.stdout + real.stderr
    assert "model nanogpt-tiny (L=2 NH=4 C=64" in real.stdout
    assert "megatron/nanogpt_1: ok, 3 steps" in real.stdout
    assert "PASS: 1 PASS, 0 PASS within logging precision, 0 FAIL" in real.stdout and "0 skipped" in real.stdout
    run = json.loads((tmp_path / "o" / "run.json").read_text(encoding="utf-8"))
    assert "nanogpt-tiny" in json.dumps(run)
