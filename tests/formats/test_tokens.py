"""llm.c token streams: exact header and size, byte-exact round trips, byte equality with llm.c's
`write_datafile`, and a FormatError for every lie a file can tell."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from lockstep.errors import FormatError
from lockstep.formats.tokens import HEADER_BYTES, read_token_stream, write_token_stream

TOKENS = [50256, 5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11, 3285, 502, 2740, 13]  # 15 ids


def llm_c_write_datafile(path: Path, toks, model_desc: str = "gpt-2") -> None:
    """llm.c's dev/data/data_common.py `write_datafile`, restated."""
    info = {"gpt-2": (20240520, 1, np.uint16), "llama-3": (20240801, 7, np.uint32)}[model_desc]
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = info[0], info[1], len(toks)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.array(toks, dtype=info[2]).tobytes())


@pytest.fixture
def stream(tmp_path) -> Path:
    path = tmp_path / "tokens.bin"
    write_token_stream(path, TOKENS)
    return path


def set_header_int(path: Path, index: int, value: int) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into("<i", data, 4 * index, value)
    path.write_bytes(bytes(data))


def test_gpt2_stream_header_size_and_round_trip(stream, tmp_path):
    assert stream.stat().st_size == 1024 + 2 * 15 == 1054
    assert np.fromfile(stream, dtype="<i4", count=256).tolist() == [20240520, 1, 15] + [0] * 253
    ts = read_token_stream(stream)
    assert (ts.kind.name, ts.count, len(ts)) == ("gpt2", 15, 15)
    assert ts.tokens.dtype == np.dtype("<u2")
    assert ts.tokens.tolist() == TOKENS
    again = tmp_path / "again.bin"
    write_token_stream(again, ts.tokens, kind=ts.kind.name)
    assert again.read_bytes() == stream.read_bytes()


def test_llama3_stream_is_uint32(tmp_path):
    path = tmp_path / "llama.bin"
    ids = [128000, 0, 128255, 70000]
    write_token_stream(path, ids, kind="llama3")  # the family's name still selects the uint32 kind
    assert path.stat().st_size == 1024 + 4 * 4
    assert np.fromfile(path, dtype="<i4", count=3).tolist() == [20240801, 7, 4]
    ts = read_token_stream(path)
    assert ts.kind.name == "uint32" and ts.tokens.dtype == np.dtype("<u4") and ts.tokens.tolist() == ids
    assert ts.kind.families == ("llama3", "qwen3")


def test_qwen3_ids_fit_the_uint32_kind(tmp_path):
    # Qwen3's model vocabulary is 151,936 rows: its top id is 151,935, above Llama 3's 128,256.
    by_name, by_family = tmp_path / "uint32.bin", tmp_path / "qwen3.bin"
    ids = [151643, 5338, 46217, 510, 151935]
    write_token_stream(by_name, ids, kind="uint32")
    write_token_stream(by_family, ids, kind="qwen3")
    assert by_name.read_bytes() == by_family.read_bytes()
    assert by_name.read_bytes()[:12] == struct.pack("<3i", 20240801, 7, 5)
    assert by_name.read_bytes()[HEADER_BYTES:] == struct.pack("<5I", *ids)
    assert read_token_stream(by_name).tokens.tolist() == ids
    with pytest.raises(FormatError, match=r"token ids must lie in \[0, 151936\) for a uint32 stream"):
        write_token_stream(tmp_path / "x.bin", [151936], kind="qwen3")


def test_uint32_reader_checks_the_callers_vocabulary(tmp_path):
    path = tmp_path / "qwen3.bin"
    write_token_stream(path, [151643, 1, 2], kind="uint32")
    assert read_token_stream(path, vocab_size=151936).count == 3  # a Qwen3 model reads it
    with pytest.raises(FormatError, match="token id 151643 at position 0 is outside the vocabulary of 128256"):
        read_token_stream(path, vocab_size=128256)  # a Llama 3 model must not
    with pytest.raises(FormatError, match=r"token ids must lie in \[0, 128256\) for a uint32 stream"):
        write_token_stream(tmp_path / "x.bin", [151643], kind="llama3", vocab_size=128256)


def test_writer_never_wraps_an_id_past_the_kinds_width(tmp_path):
    with pytest.raises(FormatError, match=r"token ids must lie in \[0, 65536\) for a gpt2 stream"):
        write_token_stream(tmp_path / "x.bin", [65536], kind="gpt2", vocab_size=100_000)


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match="unknown token stream kind 'llama2'"):
        write_token_stream("unused.bin", [1], kind="llama2")


@pytest.mark.parametrize("model_desc,kind", [("gpt-2", "gpt2"), ("llama-3", "llama3"), ("llama-3", "uint32")])
def test_identical_to_llm_c_write_datafile(tmp_path, model_desc, kind):
    theirs, ours = tmp_path / "theirs.bin", tmp_path / "ours.bin"
    llm_c_write_datafile(theirs, TOKENS, model_desc)
    write_token_stream(ours, TOKENS, kind=kind)
    assert ours.read_bytes() == theirs.read_bytes()
    assert read_token_stream(theirs).tokens.tolist() == TOKENS


def test_empty_stream_is_valid(tmp_path):
    path = tmp_path / "empty_stream.bin"
    write_token_stream(path, [])
    assert path.stat().st_size == HEADER_BYTES == 1024
    assert read_token_stream(path).count == 0


def test_highest_valid_id_is_accepted(tmp_path):
    path = tmp_path / "edge.bin"
    write_token_stream(path, [0, 50256])
    assert read_token_stream(path).tokens.tolist() == [0, 50256]


def test_writer_refuses_ids_outside_the_vocabulary(tmp_path):
    with pytest.raises(FormatError, match=r"token ids must lie in \[0, 50257\) for a gpt2 stream"):
        write_token_stream(tmp_path / "x.bin", [1, 50257])
    with pytest.raises(FormatError, match="token ids must lie in"):
        write_token_stream(tmp_path / "x.bin", [-1])
    assert not (tmp_path / "x.bin").exists()


def test_vocab_size_override_and_skipping_the_id_check(stream):
    with pytest.raises(FormatError, match="token id 50256 at position 0 is outside the vocabulary of 1000"):
        read_token_stream(stream, vocab_size=1000)
    assert read_token_stream(stream, vocab_size=1000, check_ids=False).count == 15


def _append(data: bytes):
    return lambda p: p.write_bytes(p.read_bytes() + data)


def _truncate(n: int):
    return lambda p: p.write_bytes(p.read_bytes()[:n])


def _poke_token(position: int, value: int):
    def damage(p: Path) -> None:
        data = bytearray(p.read_bytes())
        struct.pack_into("<H", data, HEADER_BYTES + 2 * position, value)
        p.write_bytes(bytes(data))
    return damage


BAD_STREAMS = {
    "wrong magic": (lambda p: set_header_int(p, 0, 20240326),
                    "wrong magic number 20240326 for a token stream (known: 20240520 (gpt2), 20240801 (uint32))"),
    "unsupported version": (lambda p: set_header_int(p, 1, 2), "unsupported gpt2 token stream version 2 (expected 1)"),
    "count too big": (lambda p: set_header_int(p, 2, 16),
                      "header says 16 tokens but the file holds 15 (30 payload bytes of 2-byte tokens)"),
    "count too small": (lambda p: set_header_int(p, 2, 14),
                        "header says 14 tokens but the file holds 15 (30 payload bytes of 2-byte tokens)"),
    "negative count": (lambda p: set_header_int(p, 2, -1), "header token count -1 is negative"),
    "half a token": (_append(b"\x01"), "header says 15 tokens but the file holds 15.5 (31 payload bytes"),
    "trailing token": (_append(b"\x01\x00"), "header says 15 tokens but the file holds 16"),
    "truncated payload": (_truncate(1024 + 20), "header says 15 tokens but the file holds 10"),
    "id == vocab": (_poke_token(7, 50257), "token id 50257 at position 7 is outside the vocabulary of 50257"),
    "id 65535": (_poke_token(14, 65535), "token id 65535 at position 14 is outside the vocabulary of 50257"),
    "truncated header": (_truncate(1000), "truncated: 1000 bytes is shorter than the 1024-byte header"),
    "empty file": (_truncate(0), "truncated: 0 bytes is shorter than the 1024-byte header"),
    "missing file": (lambda p: p.unlink(), "no such file"),
}


@pytest.mark.parametrize("case", list(BAD_STREAMS))
def test_bad_stream_gives_format_error_naming_it(stream, case):
    damage, problem = BAD_STREAMS[case]
    damage(stream)
    with pytest.raises(FormatError) as info:
        read_token_stream(stream)
    assert info.value.path == str(stream)
    assert str(info.value).startswith(f"{stream}: ")
    assert problem in info.value.problem
    assert "\n" not in str(info.value)


def test_uint32_id_outside_vocabulary(tmp_path):
    path = tmp_path / "llama_bad.bin"
    llm_c_write_datafile(path, [1, 2, 128256], "llama-3")  # llm.c's writer does not check ids
    with pytest.raises(FormatError, match="token id 128256 at position 2 is outside the vocabulary of 128256"):
        read_token_stream(path, vocab_size=128256)
    llm_c_write_datafile(path, [1, 151936, 2], "llama-3")  # above every uint32 family's vocabulary
    with pytest.raises(FormatError, match="token id 151936 at position 1 is outside the vocabulary of 151936"):
        read_token_stream(path)


def test_directory_gives_format_error(tmp_path):
    with pytest.raises(FormatError, match="is a directory, not a token file") as info:
        read_token_stream(tmp_path)
    assert info.value.path == str(tmp_path)
