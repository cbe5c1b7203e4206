"""`lockstep init-checkpoint` through `lockstep.cli.main`: the golden file, its printed summary,
bf16 (version 5), and clean failures."""

from __future__ import annotations

import json

import pytest

from lockstep.cli import main
from lockstep.models.gpt2 import FAMILY as GPT2_FAMILY
from lockstep.fsutil import sha256_file
from support.cli_output import printed

# Same digests as tests/models/test_init.py: the CLI must write exactly the library's init.
GOLDEN_TINY_SEED42_FP32 = "21064a2777319609764d67d1fc20f76e930f1cb80854f50e420654979b786839"
GOLDEN_TINY_SEED42_BF16 = "2480cb236f9ea397c369edb16cd38b354345bcf5730934805196fe1b9e3f5df8"


def init_checkpoint(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["init-checkpoint", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_tiny_default_seed(capsys, tmp_path):
    path = tmp_path / "ckpt" / "tiny.bin"  # the parent is created
    rc, out, err = init_checkpoint(capsys, "--model", "gpt2-tiny", "--out", str(path))
    assert (rc, err) == (0, "")
    assert sha256_file(path) == GOLDEN_TINY_SEED42_FP32
    assert printed(out, "sha256") == GOLDEN_TINY_SEED42_FP32
    assert printed(out, "parameters") == "5,151,360"
    assert printed(out, "bytes") == "20,606,464"
    assert printed(out, "format") == "LLMC GPT-2 version 3 (fp32)"
    assert printed(out, "model") == "gpt2-tiny: L=2 NH=12 C=96 V=50257 Vp=50304 maxT=1024"
    assert printed(out, "init") == "llm.c, seed 42"
    assert path.stat().st_size == 20_606_464
    assert [p.name for p in path.parent.iterdir()] == ["tiny.bin"]  # no temporary file left behind


def test_explicit_seed_42_is_the_default_and_other_seeds_differ(capsys, tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    assert init_checkpoint(capsys, "--model", "gpt2-tiny", "--seed", "42", "--out", str(a))[0] == 0
    rc, out, _ = init_checkpoint(capsys, "--model", "gpt2-tiny", "--seed", "7", "--out", str(b))
    assert rc == 0 and printed(out, "init") == "llm.c, seed 7"
    assert sha256_file(a) == GOLDEN_TINY_SEED42_FP32
    assert sha256_file(b) != GOLDEN_TINY_SEED42_FP32


def test_bf16_writes_version_5(capsys, tmp_path):
    path = tmp_path / "tiny_bf16.bin"
    rc, out, _ = init_checkpoint(capsys, "--model", "gpt2-tiny", "--out", str(path), "--bf16")
    assert rc == 0
    assert printed(out, "format") == "LLMC GPT-2 version 5 (bf16)"
    assert printed(out, "bytes") == "10,303,744"
    assert printed(out, "sha256") == sha256_file(path) == GOLDEN_TINY_SEED42_BF16
    assert GPT2_FAMILY.load(path).version == 5


def test_output_is_a_valid_file_for_inspect(capsys, tmp_path):
    path = tmp_path / "tiny.bin"
    init_checkpoint(capsys, "--model", "gpt2-tiny", "--out", str(path))
    assert main(["inspect", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fields"] == {"magic": 20240326, "version": 3, "maxT": 1024, "V": 50257, "L": 2, "NH": 12, "C": 96,
                             "Vp": 50304}


def test_replaces_an_existing_file(capsys, tmp_path):
    path = tmp_path / "tiny.bin"
    path.write_bytes(b"old")
    assert init_checkpoint(capsys, "--model", "gpt2-tiny", "--out", str(path))[0] == 0
    assert sha256_file(path) == GOLDEN_TINY_SEED42_FP32


def test_out_is_a_directory(capsys, tmp_path):
    rc, out, err = init_checkpoint(capsys, "--model", "gpt2-tiny", "--out", str(tmp_path))
    assert rc == 1 and "Traceback" not in err
    assert err == f"lockstep: error: {tmp_path} is a directory; --out needs a file name\n"


def test_unwritable_location(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    rc, _, err = init_checkpoint(capsys, "--model", "gpt2-tiny", "--out", str(blocker / "x.bin"))
    assert rc == 1 and "Traceback" not in err
    assert err == f"lockstep: error: {blocker / 'x.bin'}: cannot write the LLMC checkpoint: {blocker} is not a directory\n"


@pytest.mark.parametrize("argv", [
    ["--model", "gpt3", "--out", "x.bin"],
    ["--model", "gpt2-tiny"],
    ["--out", "x.bin"],
    ["--model", "gpt2-tiny", "--seed", "-1", "--out", "x.bin"],
    ["--model", "gpt2-tiny", "--seed", "forty-two", "--out", "x.bin"],
])
def test_usage_errors_exit_2(capsys, tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["init-checkpoint", *argv])
    assert info.value.code == 2
    assert not (tmp_path / "x.bin").exists()
