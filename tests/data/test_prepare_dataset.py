"""llm.c's tokenization and split, `lockstep prepare`, and the cached `ensure_prepared`."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest

from lockstep.cli import main
from lockstep.data.corpus import TINY_SHAKESPEARE, cached_tiny_shakespeare_path
from lockstep.data.prepare import VAL_TOKENS, ensure_prepared, prepare_dataset, tokenize_like_llmc
from lockstep.data.tokenizer import gpt2_tokenizer
from lockstep.errors import LockstepError
from lockstep.formats.tokens import read_token_stream

# SPEC section 3: llm.c's files for Tiny Shakespeare.
VAL_SHA256 = "fe99db720dc7c83e694806d4e047a952909411da1daccde4ccc2e55f40882a62"
TRAIN_SHA256 = "8a70606be574040c26d225694f5f9759973b419852d22f7fe5c118e1b359dcc8"
VAL_BYTES, TRAIN_BYTES = 66_560, 611_544
TRAIN_TOKENS = 305_260


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tokenize_like_llmc_emits_eot_before_each_section():
    enc = gpt2_tokenizer()
    tokens = tokenize_like_llmc("Hello world\n\nSpeak, speak.\n\nEnd", enc)
    expected = ([50256] + enc.encode_ordinary("Hello world\n\n")
                + [50256] + enc.encode_ordinary("Speak, speak.\n\n")
                + [50256] + enc.encode_ordinary("End"))  # no "\n\n" after the last section
    assert tokens.tolist() == expected
    assert tokens.dtype == np.uint16


def test_cli_prepare_tiny_shakespeare_is_byte_exact(shared_text, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["prepare", "--text", str(shared_text), "--out", str(out)]) == 0
    val, train = out / "tiny_shakespeare_val.bin", out / "tiny_shakespeare_train.bin"
    assert val.stat().st_size == VAL_BYTES and train.stat().st_size == TRAIN_BYTES
    assert sha256(val) == VAL_SHA256 and sha256(train) == TRAIN_SHA256
    assert read_token_stream(val).count == VAL_TOKENS and read_token_stream(train).count == TRAIN_TOKENS
    printed = capsys.readouterr().out
    for fact in (TINY_SHAKESPEARE, VAL_SHA256, TRAIN_SHA256, "305,260", "32,768", str(train)):
        assert fact in printed


def test_cli_missing_text_is_one_sentence_and_exit_1(tmp_path, capsys):
    missing = tmp_path / "missing.txt"
    assert main(["prepare", "--text", str(missing), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert str(missing) in err and "not found" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_too_short_text_is_rejected(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("To be, or not to be.\n\nThat is the question.\n")
    with pytest.raises(LockstepError, match="needs more than 32,768"):
        prepare_dataset(tmp_path / "out", short)


def test_other_text_gets_files_named_after_it(shared_text, tmp_path):
    text = tmp_path / "My Plays.txt"
    text.write_bytes(shared_text.read_bytes() + b"\n\nEPILOGUE:\nThe end.\n")
    prepared = prepare_dataset(tmp_path / "out", text)
    assert prepared.corpus_name.startswith("text_my_plays_")
    assert prepared.train_path.name == f"{prepared.corpus_name}_train.bin"
    assert prepared.val_path.name == f"{prepared.corpus_name}_val.bin"
    assert sha256(prepared.val_path) == VAL_SHA256  # same first 32,768 tokens as Tiny Shakespeare
    assert prepared.train_sha256 == sha256(prepared.train_path) != TRAIN_SHA256


def test_ensure_prepared_reuses_matching_files_and_repairs_others(shared_text, isolated_data_env):
    cached = cached_tiny_shakespeare_path()
    cached.parent.mkdir(parents=True)
    shutil.copy(shared_text, cached)

    first = ensure_prepared()
    assert not first.reused and first.corpus_name == TINY_SHAKESPEARE
    assert first.train_path.is_relative_to(isolated_data_env)
    assert (first.train_sha256, first.val_sha256) == (TRAIN_SHA256, VAL_SHA256)
    mtime = first.train_path.stat().st_mtime_ns

    second = ensure_prepared()
    assert second.reused and second.train_path.stat().st_mtime_ns == mtime
    assert second.to_record() == first.to_record()

    with open(first.train_path, "r+b") as f:  # a damaged token file no longer matches the manifest
        f.seek(2000)
        f.write(b"\x00\x00")
    third = ensure_prepared()
    assert not third.reused and sha256(third.train_path) == TRAIN_SHA256


def test_cli_prepare_without_out_fills_the_cache(shared_text, isolated_data_env, capsys):
    assert main(["prepare", "--text", str(shared_text)]) == 0
    assert "written" in capsys.readouterr().out
    assert main(["prepare", "--text", str(shared_text)]) == 0
    assert "reused" in capsys.readouterr().out
    assert sha256(isolated_data_env / "prepared" / "tiny_shakespeare_train.bin") == TRAIN_SHA256
