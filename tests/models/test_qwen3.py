"""The Qwen3 LLMC checkpoint (magic 20240804, version 4: InfiniTrain PR #208's layout) and its init.

Exact header words and file size, a byte-exact write/read round trip, `lockstep init-checkpoint
--model qwen3-tiny`'s golden sha256, the init rule checked against docs/reference/training-contract.md#inputs by the test's
own statistics (q_norm/k_norm weights included), a v3 file and a Llama 3 file refused in one
sentence, and `lockstep inspect` in full.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest

from lockstep.cli import main
from lockstep.errors import FormatError
from lockstep.fsutil import sha256_file
from lockstep.models import FAMILIES, SHAPES, load_checkpoint
from lockstep.models.qwen3.config import Qwen3Config

FAMILY = FAMILIES["qwen3"]
TINY = SHAPES["qwen3-tiny"].config
# `lockstep init-checkpoint --model qwen3-tiny` (seed 42, pcg64-polar-v1); change on purpose only.
GOLDEN_TINY_SEED42 = "9aabde53d99d01feb67d2904a182d886bf81f69a2fa6a3198fed2f13ab3831d0"
SMALL = Qwen3Config(max_seq_len=32, vocab_size=96, num_layers=2, num_heads=4, num_kv_heads=2, channels=32,
                    intermediate_size=48)


def f32_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def expected_shapes(c: Qwen3Config) -> list[tuple[str, tuple[int, ...]]]:
    """docs/reference/formats.md#qwen3-magic-20240804-version-4's header, written out here, not taken from the config."""
    L, C, V, I, NH, kv = c.num_layers, c.channels, c.vocab_size, c.intermediate_size, c.num_heads, c.num_kv_heads
    hd = C // NH
    return [("wte", (V, C)), ("ln1w", (L, C)), ("qknormw", (L, 2, hd)), ("qkvw", (L, (NH + 2 * kv) * hd, C)),
            ("attprojw", (L, C, NH * hd)), ("ln2w", (L, C)), ("fcw2", (L, I, C)), ("fcw", (L, I, C)),
            ("fcprojw", (L, C, I)), ("lnfw", (C,)), ("lm_head", (V, C))]


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3") / "qwen3_tiny.bin"
    assert main(["init-checkpoint", "--model", "qwen3-tiny", "--out", str(path)]) == 0
    return path


def test_tiny_header_words_and_size(tiny_init):
    words = np.fromfile(tiny_init, dtype="<i4", count=256)
    # 20240804, 4, maxT, V, L, NH, kv, C, I, 1, eps bits, theta bits, 0, 4, 1, 0
    # (docs/reference/formats.md#qwen3-magic-20240804-version-4)
    assert words[:16].tolist() == [20240804, 4, 1024, 151936, 4, 8, 4, 128, 384, 1, f32_bits(1e-6), f32_bits(1e6),
                                   0, 4, 1, 0]
    assert not words[16:].any()
    shapes = expected_shapes(TINY)
    assert shapes == TINY.tensor_shapes()
    n = sum(math.prod(s) for _, s in shapes)
    assert n == 39_683_328
    assert tiny_init.stat().st_size == 1024 + 4 * n == 158_734_336


def test_init_checkpoint_golden_sha256(tiny_init):
    assert sha256_file(tiny_init) == GOLDEN_TINY_SEED42


def test_init_rule_holds_tensor_by_tensor(tiny_init):
    """docs/reference/training-contract.md#inputs: matrices N(0, 0.02), o_proj and down N(0, 0.02/sqrt(2L)),
    every RMSNorm weight 1, q/k norms too."""
    from test_llama3 import check_init

    ckpt = load_checkpoint(tiny_init)
    residual = 0.02 / math.sqrt(2 * TINY.num_layers)
    rule = {"wte": 0.02, "ln1w": "ones", "qknormw": "ones", "qkvw": 0.02, "attprojw": residual, "ln2w": "ones",
            "fcw2": 0.02, "fcw": 0.02, "fcprojw": residual, "lnfw": "ones", "lm_head": 0.02}
    assert list(ckpt.tensors) == list(rule)
    check_init(ckpt.tensors, rule, per_layer=set(TINY.PER_LAYER))


def test_write_read_round_trip_is_byte_exact(tmp_path):
    rng = np.random.default_rng(11)
    tensors = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in expected_shapes(SMALL)}
    path = tmp_path / "small.bin"
    FAMILY.write(path, SMALL, tensors)
    raw = path.read_bytes()
    assert np.frombuffer(raw[:64], "<i4").tolist() == [20240804, 4, 32, 96, 2, 4, 2, 32, 48, 1, f32_bits(1e-6),
                                                      f32_bits(1e6), 0, 4, 1, 0]
    assert raw[1024:] == b"".join(tensors[name].astype("<f4").tobytes() for name, _ in expected_shapes(SMALL))
    back = load_checkpoint(path)
    assert back.family == "qwen3" and back.version == 4 and back.config == SMALL
    for name, t in tensors.items():
        np.testing.assert_array_equal(back.tensors[name], t)
    again = tmp_path / "again.bin"
    FAMILY.write(again, back.config, back.tensors)
    assert again.read_bytes() == raw


def one_sentence(e: pytest.ExceptionInfo, path) -> str:
    text = str(e.value)
    assert text.startswith(f"{path}: ") and "\n" not in text
    return text[len(f"{path}: "):]


def test_a_v3_file_is_refused_in_one_sentence(tiny_init, tmp_path):
    raw = bytearray(tiny_init.read_bytes())
    raw[4:8] = struct.pack("<i", 3)  # a version 3 header: the layout with no intermediate size
    bad = tmp_path / "qwen3_v3.bin"
    bad.write_bytes(bytes(raw))
    with pytest.raises(FormatError) as e:
        FAMILY.load(bad)
    assert one_sentence(e, bad) == ("unsupported Qwen3 checkpoint version 3: lockstep reads version 4 (InfiniTrain "
                                    "PR #208's layout, which stores the intermediate size)")
    assert main(["inspect", str(bad)]) == 1


def test_a_llama3_file_given_as_qwen3_is_refused_in_one_sentence(tmp_path):
    llama = tmp_path / "llama.bin"
    cfg = SHAPES["llama3-tiny"].config
    FAMILIES["llama3"].write(llama, cfg, {n: np.zeros(s, np.float32) for n, s in cfg.tensor_shapes()})
    with pytest.raises(FormatError) as e:
        FAMILY.load(llama)
    assert one_sentence(e, llama) == ("wrong magic number 20240803 for a Qwen3 checkpoint (expected 20240804) "
                                      "(that is a Llama 3 checkpoint)")


def test_sizes_must_match_exactly(tiny_init, tmp_path):
    raw = tiny_init.read_bytes()
    for what, data, message in [("short", raw[:-4], "truncated: 158734332 bytes, but the header"),
                                ("long", raw + b"\0" * 4, "4 trailing bytes after the last tensor")]:
        bad = tmp_path / f"{what}.bin"
        bad.write_bytes(data)
        with pytest.raises(FormatError) as e:
            FAMILY.load(bad)
        assert one_sentence(e, bad).startswith(message)


def test_inspect_shows_it_in_full(tiny_init, capsys):
    assert main(["inspect", "--json", "--tensors", str(tiny_init)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["valid"] and got["kind"] == "checkpoint" and got["format"] == "llmc-qwen3"
    assert got["fields"] == {"magic": 20240804, "version": 4, "family": "qwen3", "max_seq_len": 1024,
                             "vocab_size": 151936, "num_layers": 4, "num_heads": 8, "num_kv_heads": 4, "channels": 128,
                             "intermediate_size": 384, "norm_eps": float(np.float32(1e-6)), "rope_theta": 1e6}
    assert got["derived"] == {"dtype": "fp32", "head_dim": 16, "parameters": 39_683_328, "bytes": 158_734_336}
    assert [(t["name"], tuple(t["shape"])) for t in got["tensors"]] == expected_shapes(TINY)
    assert all(t["min"] == t["max"] == 1.0 for t in got["tensors"] if t["name"] in ("ln1w", "qknormw", "ln2w", "lnfw"))
    assert main(["inspect", str(tiny_init)]) == 0
    out = capsys.readouterr().out
    assert "llmc-qwen3 checkpoint, 158,734,336 bytes — valid" in out
    for word in ("20240804", "151,936", "intermediate_size", "384", "head_dim"):
        assert word in out
