"""`lockstep inspect FILE` through `lockstep.cli.main`: what the file is, its header, validity;
exit 0 when valid, exit 1 with the FormatError sentence (and no traceback) when not."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from lockstep.cli import main
from lockstep.models.gpt2 import FAMILY as GPT2_FAMILY
from lockstep.formats.tokens import write_token_stream
from lockstep.models.gpt2.config import GPT2Config

SMALL = GPT2Config(max_seq_len=8, vocab_size=10, num_layers=2, num_heads=2, channels=4, padded_vocab_size=16)
SMALL_BYTES = 1024 + 4 * 592


def small_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = {name: (0.02 * rng.standard_normal(shape)).astype(np.float32) for name, shape in SMALL.tensor_shapes()}
    t["wte"][SMALL.vocab_size :] = 0.0  # padding rows, as llm.c writes them
    return t


def f32_bits(x: float) -> int:
    return int(np.array([x], dtype="<f4").view("<i4")[0])


def write_llama3_header_file(path: Path) -> int:
    """Llama 3 LLMC file: C=48, L=2, NH=4, kv=2, V=256, ffn 192 -> 93,936 fp32 parameters."""
    header = np.zeros(256, dtype="<i4")
    header[:16] = [20240803, 3, 64, 256, 2, 4, 2, 48, f32_bits(1.3), 32, f32_bits(1e-5), f32_bits(500000.0), 1, 4, 3, 2]
    path.write_bytes(header.tobytes() + np.zeros(93_936, dtype="<f4").tobytes())
    return 1024 + 4 * 93_936


def inspect(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def ckpt(tmp_path) -> Path:
    path = tmp_path / "small.bin"
    GPT2_FAMILY.write(path, SMALL, small_tensors())
    return path


@pytest.fixture
def tokens(tmp_path) -> Path:
    path = tmp_path / "tokens.bin"
    write_token_stream(path, [50256, 464, 3290, 13])
    return path


# --- valid files --------------------------------------------------------------------------------

def test_gpt2_checkpoint(capsys, ckpt):
    rc, out, err = inspect(capsys, str(ckpt))
    assert (rc, err) == (0, "")
    assert "llmc-gpt2 checkpoint" in out and "3,392 bytes" in out and "valid" in out
    for field, value in (("magic", "20240326"), ("version", "3"), ("maxT", "8"), ("Vp", "16"),
                         ("dtype", "fp32"), ("parameters", "592"), ("head_dim", "2")):
        assert any(field in line and value in line for line in out.splitlines()), field


def test_gpt2_checkpoint_json(capsys, ckpt):
    rc, out, _ = inspect(capsys, str(ckpt), "--json", "--tensors")
    assert rc == 0
    doc = json.loads(out)
    assert doc["valid"] is True and doc["format"] == "llmc-gpt2" and doc["kind"] == "checkpoint"
    assert doc["fields"] == {"magic": 20240326, "version": 3, "maxT": 8, "V": 10, "L": 2, "NH": 2, "C": 4, "Vp": 16}
    assert doc["derived"] == {"dtype": "fp32", "head_dim": 2, "parameters": 592, "bytes": SMALL_BYTES}
    assert doc["file_bytes"] == SMALL_BYTES and doc["notes"] == []
    tensors = {t["name"]: t for t in doc["tensors"]}
    assert list(tensors) == [name for name, _ in SMALL.tensor_shapes()]
    assert tensors["qkvw"]["shape"] == [2, 12, 4]
    assert tensors["wte"]["zeros"] == 6 * 4  # the padding rows


def test_tensor_table(capsys, ckpt):
    rc, out, _ = inspect(capsys, str(ckpt), "--tensors")
    assert rc == 0
    assert "fcprojw" in out and "2×4×16" in out


def test_bf16_checkpoint(capsys, tmp_path):
    path = tmp_path / "bf16.bin"
    GPT2_FAMILY.write(path, SMALL, small_tensors(), bf16=True)
    rc, out, _ = inspect(capsys, str(path), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["fields"]["version"] == 5 and doc["derived"]["dtype"] == "bf16"
    assert doc["file_bytes"] == doc["derived"]["bytes"] == 1024 + 2 * 592


def test_token_stream(capsys, tokens):
    rc, out, err = inspect(capsys, str(tokens))
    assert (rc, err) == (0, "")
    assert "tokens-gpt2 token stream" in out and "1,032 bytes" in out and "valid" in out
    rc, out, _ = inspect(capsys, str(tokens), "--json")
    doc = json.loads(out)
    assert doc["fields"] == {"magic": 20240520, "version": 1, "count": 4}
    assert doc["derived"] == {"dtype": "uint16", "vocab_limit": 50257, "max_id": 50256, "bytes": 1032}


def test_llm_c_written_token_file(capsys, tmp_path):
    """A file made the way llm.c's write_datafile makes it (its own numpy code, not lockstep's)."""
    path = tmp_path / "tiny_shakespeare_val.bin"
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, 3
    path.write_bytes(header.tobytes() + np.array([50256, 5962, 22307], dtype=np.uint16).tobytes())
    rc, out, _ = inspect(capsys, str(path), "--json")
    assert rc == 0 and json.loads(out)["fields"]["count"] == 3


def test_llama3_checkpoint_is_recognised(capsys, tmp_path):
    path = tmp_path / "llama3.bin"
    size = write_llama3_header_file(path)
    rc, out, err = inspect(capsys, str(path))
    assert (rc, err) == (0, "")
    flat = " ".join(out.split())  # the line wraps where the tmp path is long (e.g. under pytest-xdist)
    assert "llmc-llama3 checkpoint" in flat and f"{size:,} bytes" in flat
    rc, out, _ = inspect(capsys, str(path), "--json")
    doc = json.loads(out)
    assert doc["format"] == "llmc-llama3"
    assert doc["fields"]["family"] == "llama3" and doc["fields"]["ffn_hidden"] == 192
    assert doc["fields"]["num_kv_heads"] == 2 and doc["derived"]["parameters"] == 93_936


def test_nonzero_padding_is_a_note_not_an_error(capsys, tmp_path):
    path = tmp_path / "padded.bin"
    t = small_tensors()
    t["wte"][12, 1] = 0.5
    GPT2_FAMILY.write(path, SMALL, t)
    rc, out, _ = inspect(capsys, str(path))
    assert rc == 0
    assert "wte padding rows 10..15 hold 1 non-zero values" in out


# --- invalid files: exit 1, one sentence, no traceback ------------------------------------------

def _set_int(index: int, value: int):
    def damage(p: Path) -> None:
        data = bytearray(p.read_bytes())
        struct.pack_into("<i", data, 4 * index, value)
        p.write_bytes(bytes(data))
    return damage


def _truncate(n: int):
    return lambda p: p.write_bytes(p.read_bytes()[:n])


def _nan_in_qkvw(p: Path) -> None:
    t = small_tensors()
    t["qkvw"][1, 3, 2] = np.nan
    t["qkvw"][1, 5, 0] = np.inf
    GPT2_FAMILY.write(p, SMALL, t)


BAD_CHECKPOINTS = {
    "wrong magic": (_set_int(0, 20240327), "unknown magic number 20240327"),
    "unsupported version": (_set_int(1, 4), "unsupported GPT-2 checkpoint version 4"),
    "Vp < V": (_set_int(7, 9), "header fields disagree: padded vocab Vp=9 is smaller than vocab V=10"),
    "C % NH": (_set_int(5, 3), "header fields disagree: channels C=4 is not divisible by heads NH=3"),
    "truncated payload": (_truncate(SMALL_BYTES - 1), f"truncated: {SMALL_BYTES - 1} bytes, but the header"),
    "trailing bytes": (lambda p: p.write_bytes(p.read_bytes() + b"\0" * 8), "8 trailing bytes after the last tensor"),
    "truncated header": (_truncate(512), "truncated: 512 bytes is shorter than the 1024-byte header"),
    "empty file": (_truncate(0), "truncated: 0 bytes, too short to hold a magic number"),
    "missing file": (lambda p: p.unlink(), "no such file"),
    "non-finite values": (_nan_in_qkvw, "tensor qkvw holds 2 non-finite values (the first, nan, at flat index 62)"),
}

BAD_STREAMS = {
    "count too big": (_set_int(2, 5), "header says 5 tokens but the file holds 4"),
    "count too small": (_set_int(2, 3), "header says 3 tokens but the file holds 4"),
    "id >= vocab": (lambda p: p.write_bytes(p.read_bytes()[:-2] + struct.pack("<H", 50257)),
                    "token id 50257 at position 3 is outside the vocabulary of 50257"),
    "stream version": (_set_int(1, 7), "unsupported gpt2 token stream version 7 (expected 1)"),
    "truncated header": (_truncate(1000), "truncated: 1000 bytes is shorter than the 1024-byte header"),
}


def _check_failure(capsys, path: Path, problem: str) -> None:
    rc, out, err = inspect(capsys, str(path))
    assert rc == 1
    assert "Traceback" not in err and "Traceback" not in out
    assert err.startswith(f"lockstep: error: {path}: ")  # the FormatError names the file
    assert problem in err
    assert err.count("\n") == 1  # one sentence, one line
    assert "valid" not in out
    # --json says the same, machine-readably, and still exits 1
    rc, out, err = inspect(capsys, str(path), "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["valid"] is False and doc["path"] == str(path) and problem in doc["error"]
    assert "Traceback" not in err


@pytest.mark.parametrize("case", list(BAD_CHECKPOINTS))
def test_bad_checkpoint(capsys, ckpt, case):
    damage, problem = BAD_CHECKPOINTS[case]
    damage(ckpt)
    _check_failure(capsys, ckpt, problem)


@pytest.mark.parametrize("case", list(BAD_STREAMS))
def test_bad_token_stream(capsys, tokens, case):
    damage, problem = BAD_STREAMS[case]
    damage(tokens)
    _check_failure(capsys, tokens, problem)


def test_bad_llama3_checkpoint(capsys, tmp_path):
    path = tmp_path / "llama3.bin"
    write_llama3_header_file(path)
    path.write_bytes(path.read_bytes()[:-4])
    _check_failure(capsys, path, "truncated: 376764 bytes, but the header (L=2 NH=4 kv=2 C=48 FFN=192 V=256, version 3) needs 376768")


def test_directory_is_not_a_file(capsys, tmp_path):
    _check_failure(capsys, tmp_path, "is a directory")


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["inspect"])
    assert info.value.code == 2


def _run_dir_with_records(tmp_path: Path) -> Path:
    from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record

    run = tmp_path / "run"
    for framework, last in (("pytorch", 10.7), ("infinitrain", 10.7)):
        write_run_record(run / framework / "gpt2_1.jsonl",
                         RunRecord(framework, "gpt2_1", [StepRecord(1, 10.9), StepRecord(2, 10.8), StepRecord(3, last)],
                                   meta={"dtype": "float32"}))
    return run


def test_a_run_record_is_named_with_its_framework_case_steps_and_status(tmp_path, capsys):
    record = _run_dir_with_records(tmp_path) / "infinitrain" / "gpt2_1.jsonl"
    assert main(["inspect", str(record)]) == 0
    out = capsys.readouterr().out
    assert f"{record}: run record" in out and "valid" in out
    for word in ("infinitrain", "gpt2_1", "steps", "3", "status", "ok", "10.7"):
        assert word in out
    assert main(["inspect", str(record), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "run record" and doc["fields"]["framework"] == "infinitrain"
    assert doc["fields"]["case"] == "gpt2_1" and doc["fields"]["steps"] == 3 and doc["fields"]["status"] == "ok"


def test_a_runs_summary_and_run_json_are_named(tmp_path, capsys):
    from lockstep.compare.run_dir import compare_run_dir
    from lockstep.formats.run_manifest import write_manifest

    run = _run_dir_with_records(tmp_path)
    compare_run_dir(run)
    write_manifest(run, {"status": "finished", "cases": [{"name": "gpt2_1"}], "frameworks": ["pytorch", "infinitrain"],
                         "baseline": "pytorch", "device": "cpu"})
    assert main(["inspect", str(run / "summary.json"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["kind"] == "run summary (summary.json)" and summary["fields"]["verdict"] == "PASS"
    assert summary["derived"]["cases"] == 1
    assert main(["inspect", str(run / "run.json")]) == 0
    out = capsys.readouterr().out
    assert "run manifest (run.json)" in out and "finished" in out and "pytorch, infinitrain" in out


def test_json_that_lockstep_did_not_write_is_one_sentence(tmp_path, capsys):
    other = tmp_path / "package.json"
    other.write_text('{"name": "left-pad"}\n')
    assert main(["inspect", str(other)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is JSON, but not a file lockstep wrote" in err and "magic" not in err
