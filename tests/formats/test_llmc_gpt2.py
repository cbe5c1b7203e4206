"""LLMC GPT-2 checkpoints: exact header ints and sizes, byte-exact round trips, bf16 rounding as
torch does it, byte equality with llm.c's own writer, and a FormatError for every bad file."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from lockstep.errors import FormatError
from lockstep.formats.llmc import HEADER_BYTES, bf16_bits_to_fp32, fp32_to_bf16_bits
from lockstep.models import FAMILIES, SHAPES
from lockstep.models.gpt2 import FAMILY as GPT2_FAMILY
from lockstep.models.gpt2.checkpoint import GPT2_MAGIC
from lockstep.models.gpt2.config import GPT2Config


def gpt2_file_size(config: GPT2Config, version: int = 3) -> int:
    return GPT2_FAMILY.layout(config, bf16=version == 5).file_size


def read_gpt2_header(path: Path):
    layout = GPT2_FAMILY.read_layout(path)
    return layout.version, layout.config


load_llmc_gpt2 = GPT2_FAMILY.load

# A shape small enough to write in microseconds: 592 parameters.
SMALL = GPT2Config(max_seq_len=8, vocab_size=10, num_layers=2, num_heads=2, channels=4, padded_vocab_size=16)
SMALL_PARAMS = 592  # 16*4 + 8*4 + 2*(12*16 + 13*4) + 2*4
SMALL_FP32_BYTES = 1024 + 4 * 592  # 3392
SMALL_BF16_BYTES = 1024 + 2 * 592  # 2208


def random_tensors(config: GPT2Config, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in config.tensor_shapes()}


def header_ints(path: Path) -> list[int]:
    return np.fromfile(path, dtype="<i4", count=256).tolist()


def rewrite_header(path: Path, **fields: int) -> None:
    index = {"magic": 0, "version": 1, "maxT": 2, "V": 3, "L": 4, "NH": 5, "C": 6, "Vp": 7}
    data = bytearray(path.read_bytes())
    for name, value in fields.items():
        struct.pack_into("<i", data, 4 * index[name], value)
    path.write_bytes(bytes(data))


@pytest.fixture
def small_ckpt(tmp_path) -> Path:
    path = tmp_path / "small.bin"
    GPT2_FAMILY.write(path, SMALL, random_tensors(SMALL))
    return path


# --- sizes and header ---------------------------------------------------------------------------

def test_parameter_counts_and_file_sizes():
    assert SMALL.num_parameters() == SMALL_PARAMS
    assert gpt2_file_size(SMALL) == SMALL_FP32_BYTES
    assert gpt2_file_size(SMALL, 5) == SMALL_BF16_BYTES
    tiny, gpt2 = SHAPES["gpt2-tiny"].config, SHAPES["gpt2"].config
    assert tiny.num_parameters() == 5_151_360
    assert gpt2_file_size(tiny) == 20_606_464
    assert gpt2_file_size(tiny, 5) == 10_303_744
    assert gpt2.num_parameters() == 124_475_904
    assert gpt2_file_size(gpt2) == 497_904_640  # docs/reference/formats.md#gpt-2-magic-20240326, llm.c's gpt2_124M.bin
    assert gpt2_file_size(gpt2, 5) == 248_952_832  # llm.c's gpt2_124M_bf16.bin


def test_header_is_256_little_endian_int32(small_ckpt):
    raw = small_ckpt.read_bytes()
    assert len(raw) == SMALL_FP32_BYTES
    assert raw[:4] == struct.pack("<i", 20240326) == bytes.fromhex("c6d73401")
    assert header_ints(small_ckpt) == [20240326, 3, 8, 10, 2, 2, 4, 16] + [0] * 248
    assert read_gpt2_header(small_ckpt) == (3, SMALL)


# --- round trips --------------------------------------------------------------------------------

def test_fp32_round_trip_is_byte_exact(small_ckpt, tmp_path):
    tensors = random_tensors(SMALL)
    ckpt = GPT2_FAMILY.load(small_ckpt)
    assert (ckpt.version, ckpt.config) == (3, SMALL)
    assert list(ckpt.tensors) == [name for name, _ in SMALL.tensor_shapes()]
    for name, t in tensors.items():
        assert ckpt.tensors[name].dtype == np.float32
        assert np.array_equal(ckpt.tensors[name], t), name
    again = tmp_path / "again.bin"
    GPT2_FAMILY.write(again, ckpt.config, ckpt.tensors, bf16=ckpt.version == 5)
    assert again.read_bytes() == small_ckpt.read_bytes()


def test_payload_is_tensors_in_llmc_order(small_ckpt):
    tensors = random_tensors(SMALL)
    expected = b"".join(tensors[name].astype("<f4").tobytes() for name, _ in SMALL.tensor_shapes())
    assert small_ckpt.read_bytes()[HEADER_BYTES:] == expected
    # spot-check the order: wte first, lnfb last
    payload = np.frombuffer(small_ckpt.read_bytes()[HEADER_BYTES:], dtype="<f4")
    assert np.array_equal(payload[:64], tensors["wte"].ravel())
    assert np.array_equal(payload[-4:], tensors["lnfb"])


def test_bf16_round_trip_is_byte_exact(tmp_path):
    path, again = tmp_path / "bf16.bin", tmp_path / "again.bin"
    GPT2_FAMILY.write(path, SMALL, random_tensors(SMALL), bf16=True)
    assert path.stat().st_size == SMALL_BF16_BYTES
    assert header_ints(path)[:8] == [20240326, 5, 8, 10, 2, 2, 4, 16]
    ckpt = GPT2_FAMILY.load(path)
    assert ckpt.version == 5
    GPT2_FAMILY.write(again, ckpt.config, ckpt.tensors, bf16=True)
    assert again.read_bytes() == path.read_bytes()


def test_bf16_values_are_rounded_like_torch(tmp_path):
    tensors = random_tensors(SMALL, seed=3)
    path = tmp_path / "bf16.bin"
    GPT2_FAMILY.write(path, SMALL, tensors, bf16=True)
    ckpt = GPT2_FAMILY.load(path)
    for name, x in tensors.items():
        expected = torch.tensor(x).to(torch.bfloat16).float().numpy()
        assert ckpt.tensors[name].dtype == np.float32
        assert np.array_equal(ckpt.tensors[name].view(np.uint32), expected.view(np.uint32)), name


def _bits(*patterns: int) -> np.ndarray:
    return np.array(patterns, dtype=np.uint32).view(np.float32)


def test_bf16_rounding_edge_cases_match_torch():
    x = np.concatenate([
        _bits(0x3F808000, 0x3F818000,  # ties: to even (down), to even (up)
              0x3F807FFF, 0x3F808001,  # just below / above a tie
              0x7F7FFFFF, 0xFF7FFFFF,  # largest finite values: round to +-inf
              0x7F800000, 0xFF800000,  # +-inf
              0x00000001, 0x80000001, 0x007FFFFF, 0x00008000, 0x00018000,  # subnormals and their ties
              0x00000000, 0x80000000),  # +-0
        np.float32([1.0, -1.0, 0.02, -0.02, 1 / 3, 65504.0, 1e-30, 3.0e38]),
        np.random.default_rng(7).standard_normal(10_000).astype(np.float32) * 0.02,
    ])
    ours = bf16_bits_to_fp32(fp32_to_bf16_bits(x))
    theirs = torch.tensor(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    assert fp32_to_bf16_bits(_bits(0x3F808000, 0x3F818000)).tolist() == [0x3F80, 0x3F82]
    assert np.isinf(ours[4]) and ours[4] > 0


def test_bf16_nan_stays_nan():
    x = _bits(0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF)
    bits = fp32_to_bf16_bits(x)
    assert bits.tolist() == [0x7FC0] * 4  # c10::BFloat16's canonical NaN
    assert np.isnan(bf16_bits_to_fp32(bits)).all()
    # torch's vectorised cast writes 0xFFFF instead: also a NaN, so only NaN-ness is comparable.
    assert torch.tensor(x).to(torch.bfloat16).float().isnan().all()


def test_identical_to_llm_c_writer(tmp_path):
    """Bytes equal to what llm.c's train_gpt2.py `write_model` writes (torch header, per-layer
    tensors concatenated across layers, bf16 via `.to(torch.bfloat16).view(torch.int16)`)."""
    tensors = random_tensors(SMALL, seed=11)
    for version, dtype in ((3, "float32"), (5, "bfloat16")):
        header = torch.zeros(256, dtype=torch.int32)
        header[:8] = torch.tensor([20240326, version, 8, 10, 2, 2, 4, 16])
        blobs = [header.numpy().tobytes()]
        for name, _ in SMALL.tensor_shapes():
            t = torch.tensor(tensors[name])
            layers = [t] if t.shape[0] != SMALL.num_layers or name in ("wte", "wpe") else list(t)
            t = torch.cat([layer.reshape(-1) for layer in layers])
            if dtype == "bfloat16":
                blobs.append(t.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
            else:
                blobs.append(t.to(torch.float32).numpy().tobytes())
        ours = tmp_path / f"v{version}.bin"
        GPT2_FAMILY.write(ours, SMALL, tensors, bf16=version == 5)
        assert ours.read_bytes() == b"".join(blobs), dtype


def test_write_is_atomic_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "sub" / "ckpt.bin"
    GPT2_FAMILY.write(path, SMALL, random_tensors(SMALL))
    bad = random_tensors(SMALL)
    bad["qkvw"] = bad["qkvw"][:, :-1]
    with pytest.raises(FormatError, match=r"tensor qkvw has shape \(2, 11, 4\), the header needs \(2, 12, 4\)"):
        GPT2_FAMILY.write(path, SMALL, bad)
    assert path.stat().st_size == SMALL_FP32_BYTES  # the old file is untouched
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt.bin"]


def test_write_refuses_inconsistent_shape_and_version(tmp_path):
    with pytest.raises(FormatError, match="channels C=4 is not divisible by heads NH=3"):
        GPT2_FAMILY.write(tmp_path / "x.bin", GPT2Config(8, 10, 2, 3, 4, 16), {})
    with pytest.raises(FormatError, match="Llama 3 checkpoints have no bf16 layout"):
        FAMILIES["llama3"].layout(SHAPES["llama3-tiny"].config, bf16=True)
    assert not (tmp_path / "x.bin").exists()


# --- bad files ----------------------------------------------------------------------------------

def _wrong_magic(p: Path) -> None:
    rewrite_header(p, magic=20240327)


def _truncate(n: int):
    return lambda p: p.write_bytes(p.read_bytes()[:n])


BAD_FILES = {
    "wrong magic": (_wrong_magic, "wrong magic number 20240327 for a GPT-2 checkpoint (expected 20240326)"),
    "unsupported version": (lambda p: rewrite_header(p, version=4),
                            "unsupported GPT-2 checkpoint version 4 (supported: 3 = fp32, 5 = bf16)"),
    "Vp < V": (lambda p: rewrite_header(p, Vp=5),
               "header fields disagree: padded vocab Vp=5 is smaller than vocab V=10"),
    "C % NH != 0": (lambda p: rewrite_header(p, NH=3),
                    "header fields disagree: channels C=4 is not divisible by heads NH=3"),
    "zero layers": (lambda p: rewrite_header(p, L=0), "header fields disagree: num_layers is 0, must be positive"),
    "negative C": (lambda p: rewrite_header(p, C=-4), "header fields disagree: channels is -4, must be positive"),
    "truncated payload": (_truncate(SMALL_FP32_BYTES - 4),
                          f"truncated: {SMALL_FP32_BYTES - 4} bytes, but the header (L=2 NH=2 C=4 V=10 Vp=16, version 3) "
                          f"needs {SMALL_FP32_BYTES}"),
    "trailing bytes": (lambda p: p.write_bytes(p.read_bytes() + b"\0\0\0\0\0"),
                       f"5 trailing bytes after the last tensor (file is {SMALL_FP32_BYTES + 5} bytes, header needs "
                       f"{SMALL_FP32_BYTES})"),
    "bf16 payload labelled fp32": (_truncate(SMALL_BF16_BYTES),
                                   f"truncated: {SMALL_BF16_BYTES} bytes, but the header (L=2 NH=2 C=4 V=10 Vp=16, version 3)"),
    "fp32 payload labelled bf16": (lambda p: rewrite_header(p, version=5),
                                   f"{SMALL_FP32_BYTES - SMALL_BF16_BYTES} trailing bytes after the last tensor"),
    "truncated header": (_truncate(100), "truncated: 100 bytes is shorter than the 1024-byte header"),
    "empty file": (_truncate(0), "truncated: 0 bytes is shorter than the 1024-byte header"),
    "missing file": (lambda p: p.unlink(), "no such file"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
@pytest.mark.parametrize("reader", [read_gpt2_header, load_llmc_gpt2], ids=["header", "load"])
def test_bad_file_gives_format_error_naming_it(small_ckpt, case, reader):
    damage, problem = BAD_FILES[case]
    damage(small_ckpt)
    with pytest.raises(FormatError) as info:
        reader(small_ckpt)
    assert info.value.path == str(small_ckpt)
    assert str(info.value).startswith(f"{small_ckpt}: ")
    assert problem in info.value.problem
    assert "\n" not in str(info.value)  # one sentence


@pytest.mark.parametrize("reader", [read_gpt2_header, load_llmc_gpt2], ids=["header", "load"])
def test_directory_gives_format_error(tmp_path, reader):
    with pytest.raises(FormatError, match="is a directory, not a checkpoint file") as info:
        reader(tmp_path)
    assert info.value.path == str(tmp_path)


def test_magic_constant():
    assert GPT2_MAGIC == 20240326 and HEADER_BYTES == 1024
