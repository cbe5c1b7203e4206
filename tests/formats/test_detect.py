"""Format detection by magic number and `inspect_file`: every known file is recognised with its
exact header fields and sizes (GPT-2, Llama 3, Qwen3 checkpoints; GPT-2 and Llama 3 token
streams), and anything else is a FormatError naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lockstep.errors import FormatError
from lockstep.formats.detect import detect, inspect_file
from lockstep.formats.tokens import write_token_stream
from lockstep.models import FAMILIES
from lockstep.models.gpt2 import FAMILY as GPT2_FAMILY
from lockstep.models.gpt2.config import GPT2Config

SMALL = GPT2Config(max_seq_len=8, vocab_size=10, num_layers=2, num_heads=2, channels=4, padded_vocab_size=16)


def read_llama_header(path: Path):
    layout = FAMILIES["llama3"].read_layout(path)
    return layout.version, layout.config


def f32_bits(x: float) -> int:
    return int(np.array([x], dtype="<f4").view("<i4")[0])


def write_llama3(path: Path, *, C=48, L=2, NH=4, kv=2, V=256, maxT=64, multiplier=1.3, multiple_of=32,
                 version=3, extra_bytes=0) -> None:
    """A Llama 3 LLMC file laid out as llm.c's llama3 branch writes it (header, then fp32 tensors)."""
    header = np.zeros(256, dtype="<i4")
    header[:16] = [20240803, version, maxT, V, L, NH, kv, C, f32_bits(multiplier), multiple_of, f32_bits(1e-5),
                   f32_bits(500000.0), 1, 4, 3, 2]
    hd = C // NH
    hidden = int(np.floor(float(np.float32(multiplier)) * (2 * 4 * C / 3) + 0.5))
    ffn = multiple_of * -(-hidden // multiple_of) if multiple_of > 0 else hidden
    qkv = C + 2 * kv * hd
    n = V * C + L * C + L * qkv * C + L * C * C + L * C + 3 * L * ffn * C + C + V * C
    path.write_bytes(header.tobytes() + np.zeros(n, dtype="<f4").tobytes() + b"\0" * extra_bytes)


def write_qwen3(path: Path, *, C=32, L=2, NH=4, kv=2, V=128, maxT=64, intermediate=80) -> None:
    header = np.zeros(256, dtype="<i4")
    header[:12] = [20240804, 4, maxT, V, L, NH, kv, C, intermediate, 0, f32_bits(1e-6), f32_bits(1_000_000.0)]
    hd = C // NH
    n = (V * C + L * C + 2 * L * hd + L * (C + 2 * kv * hd) * C + L * C * C + L * C + 3 * L * intermediate * C
         + C + V * C)
    path.write_bytes(header.tobytes() + np.zeros(n, dtype="<f4").tobytes())


def test_gpt2_checkpoint_fields_and_sizes(tmp_path):
    path = tmp_path / "ckpt.bin"
    zeros = {name: np.zeros(shape, np.float32) for name, shape in SMALL.tensor_shapes()}
    GPT2_FAMILY.write(path, SMALL, zeros, bf16=True)
    assert detect(path) == "llmc-gpt2"
    info = inspect_file(path)
    assert (info.format, info.kind, info.path) == ("llmc-gpt2", "checkpoint", str(path))
    assert info.fields == {"magic": 20240326, "version": 5, "maxT": 8, "V": 10, "L": 2, "NH": 2, "C": 4, "Vp": 16}
    assert info.derived == {"dtype": "bf16", "head_dim": 2, "parameters": 592, "bytes": 1024 + 2 * 592}


def test_token_streams(tmp_path):
    gpt2, llama = tmp_path / "gpt2_tokens.bin", tmp_path / "llama_tokens.bin"
    write_token_stream(gpt2, [3, 50256, 7])
    write_token_stream(llama, [128000, 1], kind="llama3")
    info = inspect_file(gpt2)
    assert (info.format, info.kind) == ("tokens-gpt2", "token stream")
    assert info.fields == {"magic": 20240520, "version": 1, "count": 3}
    assert info.derived == {"dtype": "uint16", "vocab_limit": 50257, "max_id": 50256, "bytes": 1030}
    info = inspect_file(llama)
    assert (info.format, info.kind) == ("tokens-uint32", "token stream")
    assert info.fields == {"magic": 20240801, "version": 7, "count": 2}
    assert info.derived == {"dtype": "uint32", "vocab_limit": 151936, "max_id": 128000, "bytes": 1032}


def test_llama3_checkpoint_is_recognised(tmp_path):
    path = tmp_path / "llama3.bin"
    write_llama3(path)
    assert path.stat().st_size == 1024 + 4 * 93_936
    assert detect(path) == "llmc-llama3"
    info = inspect_file(path)
    assert (info.format, info.kind) == ("llmc-llama3", "checkpoint")
    # ffn: llround(1.3 * 2*4*48/3) = llround(166.4) = 166, rounded up to a multiple of 32 = 192
    assert info.fields["ffn_hidden"] == 192
    assert {k: info.fields[k] for k in ("version", "family", "max_seq_len", "vocab_size", "num_layers", "num_heads",
                                        "num_kv_heads", "channels")} == {
        "version": 3, "family": "llama3", "max_seq_len": 64, "vocab_size": 256, "num_layers": 2, "num_heads": 4,
        "num_kv_heads": 2, "channels": 48}
    assert info.fields["norm_eps"] == pytest.approx(1e-5) and info.fields["rope_theta"] == 500000.0
    assert info.derived == {"dtype": "fp32", "head_dim": 12, "parameters": 93_936, "bytes": 1024 + 4 * 93_936}


def test_llama3_ffn_rounds_halves_away_from_zero(tmp_path):
    # 0.53125 * int(2*4*6/3) = 8.5 exactly: llround gives 9 (Python's round() would give 8).
    path = tmp_path / "half.bin"
    write_llama3(path, C=6, NH=1, kv=1, V=4, maxT=2, multiplier=0.53125, multiple_of=1)
    assert read_llama_header(path)[1].ffn_hidden == 9


def test_qwen3_checkpoint_is_recognised(tmp_path):
    path = tmp_path / "qwen3.bin"
    write_qwen3(path)
    info = inspect_file(path)
    assert (info.format, info.fields["family"], info.fields["version"], info.fields["intermediate_size"]) == (
        "llmc-qwen3", "qwen3", 4, 80)
    assert info.derived["parameters"] == 128 * 32 * 2 + 2 * 32 + 2 * 2 * 8 + 2 * 64 * 32 + 2 * 32 * 32 + 2 * 32 \
        + 3 * 2 * 80 * 32 + 32


@pytest.mark.parametrize("damage,problem", [
    (lambda p: write_llama3(p, extra_bytes=8), "8 trailing bytes after the last tensor"),
    (lambda p: p.write_bytes(p.read_bytes()[:-4]), "truncated: 376764 bytes, but the header (L=2 NH=4 kv=2 C=48 FFN=192 V=256, version 3) needs 376768"),
    (lambda p: write_llama3(p, version=5), "unsupported Llama 3 checkpoint version 5 (supported: 3 = fp32)"),
    (lambda p: write_llama3(p, C=50), "header fields disagree: channels C=50 is not divisible by heads NH=4"),
    (lambda p: write_llama3(p, kv=3), "header fields disagree: heads NH=4 is not divisible by kv heads 3"),
    (lambda p: write_llama3(p, multiple_of=0), "header fields disagree: multiple_of is 0, must be positive"),
    (lambda p: p.unlink(), "no such file"),
], ids=["trailing", "truncated", "version", "C%NH", "NH%kv", "multiple_of", "missing"])
def test_bad_llama3_files(tmp_path, damage, problem):
    path = tmp_path / "llama3.bin"
    write_llama3(path)
    damage(path)
    for reader in (inspect_file, read_llama_header):
        with pytest.raises(FormatError) as info:
            reader(path)
        assert info.value.path == str(path) and problem in info.value.problem


@pytest.mark.parametrize("content,problem", [
    (b"", "truncated: 0 bytes, too short to hold a magic number"),
    (b"\xc6\xd7\x34", "truncated: 3 bytes, too short to hold a magic number"),
    (np.array([20240325, 3], dtype="<i4").tobytes(), "unknown magic number 20240325; known: 20240326 (llmc-gpt2)"),
    (b"PK\x03\x04" + b"\0" * 2000, "unknown magic number 67324752"),  # a zip (torch.save) file
])
def test_unknown_or_short_files(tmp_path, content, problem):
    path = tmp_path / "mystery.bin"
    path.write_bytes(content)
    with pytest.raises(FormatError) as info:
        inspect_file(path)
    assert info.value.path == str(path) and problem in info.value.problem


def test_missing_file_and_directory(tmp_path):
    for path, problem in ((tmp_path / "absent.bin", "no such file"), (tmp_path, "is a directory")):
        with pytest.raises(FormatError, match=problem) as info:
            detect(path)
        assert info.value.path == str(path)


def test_detection_reads_the_magic_even_when_the_rest_is_bad(tmp_path):
    """A file with a known magic but a bad body is reported by that format's own check."""
    path = tmp_path / "bad_gpt2.bin"
    path.write_bytes(np.array([20240326, 9], dtype="<i4").tobytes() + b"\0" * 1016)
    assert detect(path) == "llmc-gpt2"
    with pytest.raises(FormatError, match="unsupported GPT-2 checkpoint version 9"):
        inspect_file(path)
