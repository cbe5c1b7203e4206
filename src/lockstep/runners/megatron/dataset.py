"""The token stream as megatron-core data: an indexed dataset read through GPTDataset.

The llm.c token file is converted once into a megatron-core indexed dataset (`.bin/.idx`
written by `IndexedDatasetBuilder`, int32, the whole stream as ONE document,
docs/reference/formats.md#megatron-indexed-dataset),
cached next to the token file in `<tokens>.megatron/<key>/` where the key is the file's
sha256 (or its size and mtime when the sha256 is not known). It is read through megatron-core's
own `GPTDataset`, configured as Megatron-LM's `pretrain_gpt.py` would be for this data but
without any EOD handling (no position/mask reset, no EOD loss mask). With one document, sample i
is the contiguous window tokens[i*T : i*T+T+1] (tokens = [:-1], labels = [1:]).

GPTDataset shuffles its samples with a seeded permutation; lockstep replaces that shuffle
index by the identity, so that the data order is the contract's (docs/reference/training-contract.md#data): micro step m
of step s on DP rank r reads samples (s*accum + m)*DP*B + r*B + b, b = 0..B-1, which is token
window p = ((s*accum + m)*DP + r)*B*T -- `lockstep.data.loader.TokenBatches`' order.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.formats.tokens import read_token_stream

CACHE_SUFFIX = ".megatron"  # <tokens>.megatron/<key>/
PREFIX_NAME = "tokens"  # <key>/tokens.bin, <key>/tokens.idx
GPT2_EOD = 50256  # <|endoftext|>; with no EOD handling configured GPTDataset never acts on it


@dataclass(frozen=True)
class IndexedTokens:
    """A converted token stream: megatron-core's path prefix (without .bin/.idx) and its size."""

    prefix: str
    num_tokens: int

    @property
    def cache_dir(self) -> Path:
        return Path(self.prefix).parent


def cache_key(tokens_path: Path, tokens_sha256: str = "") -> str:
    if tokens_sha256:
        return f"sha256-{tokens_sha256[:16]}"
    st = tokens_path.stat()
    return f"size{st.st_size}-mtime{st.st_mtime_ns}"


def cache_dir_for(tokens_path: str | os.PathLike, tokens_sha256: str = "") -> Path:
    """`<tokens>.megatron/<key>`, or a per-user cache when the token file's folder is read-only."""
    tokens_path = Path(tokens_path).resolve()
    key = cache_key(tokens_path, tokens_sha256)
    beside = tokens_path.parent / (tokens_path.name + CACHE_SUFFIX)
    if os.access(tokens_path.parent, os.W_OK) or beside.is_dir() and os.access(beside, os.W_OK):
        return beside / key
    user_cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lockstep" / "megatron-datasets"
    where = hashlib.sha256(str(tokens_path).encode()).hexdigest()[:12]
    return user_cache / f"{tokens_path.name}-{where}" / key


def ensure_indexed_dataset(tokens_path: str | os.PathLike, tokens_sha256: str = "") -> IndexedTokens:
    """Convert the token stream once (atomically: built aside, then renamed into place)."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    tokens_path = Path(tokens_path)
    stream = read_token_stream(tokens_path, check_ids=False)
    final = cache_dir_for(tokens_path, tokens_sha256)
    if _is_complete(final, len(stream)):
        return IndexedTokens(str(final / PREFIX_NAME), len(stream))
    stream = read_token_stream(tokens_path)  # ids checked once, before they are converted
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=final.parent))
    os.chmod(staging, 0o755)  # mkdtemp's 0700 would keep the cache private to this user
    try:
        prefix = staging / PREFIX_NAME
        builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.int32)
        # One document holding the whole stream: GPTDataset then cuts contiguous windows.
        builder.add_document(np.asarray(stream.tokens, dtype=np.int32), [len(stream)])
        builder.finalize(str(prefix) + ".idx")
        if final.exists() and not _is_complete(final, len(stream)):
            shutil.rmtree(final, ignore_errors=True)  # a damaged cache entry
        try:
            os.rename(staging, final)
        except OSError:
            if not _is_complete(final, len(stream)):  # another process won the race with a good copy: fine
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return IndexedTokens(str(final / PREFIX_NAME), len(stream))


def _is_complete(cache_dir: Path, num_tokens: int) -> bool:
    bin_path, idx_path = cache_dir / f"{PREFIX_NAME}.bin", cache_dir / f"{PREFIX_NAME}.idx"
    return idx_path.is_file() and bin_path.is_file() and bin_path.stat().st_size == 4 * num_tokens


class StreamTokenizer:
    """The little of a tokenizer GPTDatasetConfig reads: EOD id, vocab size, no pad token.

    `pad` is -1 on purpose: GPTDataset zeroes the loss mask of labels equal to the pad id and
    rewrites such tokens to 0, so a pad id that is a real token would silently change the data.
    """

    def __init__(self, vocab_size: int, eod: int = GPT2_EOD):
        self.vocab_size = vocab_size
        self.eod = eod
        self.pad = -1
        self.unique_identifiers = {"class": "lockstep.StreamTokenizer", "vocab_size": vocab_size, "eod": eod}


def build_gpt_dataset(indexed: IndexedTokens, seq_len: int, num_samples: int, vocab_size: int, seed: int = 1234):
    """megatron-core's GPTDataset over the whole stream, its shuffle index set to the identity."""
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import Split

    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_len,
        blend=([indexed.prefix], None),
        split="100,0,0",
        path_to_cache=str(indexed.cache_dir / "gpt_dataset_indices"),
        tokenizer=StreamTokenizer(vocab_size),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=True,
        mmap_bin_files=True,
    )
    low_level = IndexedDataset(indexed.prefix, multimodal=False, mmap=True)
    if low_level.sequence_lengths.shape[0] != 1 or int(low_level.sequence_lengths[0]) != indexed.num_tokens:
        raise LockstepError(f"{indexed.prefix}.idx: expected one document of {indexed.num_tokens} tokens, found "
                            f"{low_level.sequence_lengths.shape[0]} document(s); delete {indexed.cache_dir} to rebuild it")
    documents = np.arange(1, dtype=np.int32)  # the one document, as megatron's split indices (int32)
    dataset = GPTDataset(low_level, indexed.prefix, documents, num_samples, Split.train, config)
    # The identity instead of GPTDataset's seeded permutation: sample i is window i.
    dataset.shuffle_index = np.arange(dataset.shuffle_index.shape[0], dtype=np.int64)
    check_contiguous_samples(dataset, num_samples, seq_len)
    return dataset


def check_contiguous_samples(dataset, num_samples: int, seq_len: int) -> None:
    """Sample i must start at token i*T of the one document; megatron's sample index says where."""
    rows = np.asarray(dataset.sample_index[: num_samples + 1])
    want = np.arange(num_samples + 1, dtype=np.int64) * seq_len
    if rows.shape[0] < num_samples + 1 or np.any(rows[:, 0] != 0) or np.any(rows[:, 1].astype(np.int64) != want):
        raise LockstepError("megatron-core's GPTDataset did not cut the stream into contiguous windows of "
                            f"{seq_len} tokens, so the contract's data order cannot be kept")


def samples_needed(case: CaseSpec) -> int:
    return case.steps * case.accum * case.dp * case.micro_batch


def sample_indices(case: CaseSpec, step: int, micro_step: int, dp_rank: int) -> list[int]:
    """GPTDataset sample indices of a micro batch (step and micro step 0-based), in the contract's data order
    (docs/reference/training-contract.md#data)."""
    first = ((step * case.accum + micro_step) * case.dp + dp_rank) * case.micro_batch
    return list(range(first, first + case.micro_batch))


class MicroBatches:
    """Batched GPTDataset samples of one DP rank, on the training device.

    The causal attention mask is the same for every sample (no EOD resets), so it is taken from
    the dataset once, moved to the device once, and expanded (a view) to the batch.
    """

    def __init__(self, dataset, case: CaseSpec, dp_rank: int, device: torch.device):
        self.dataset = dataset
        self.case = case
        self.dp_rank = dp_rank
        self.device = device
        first = dataset[0]
        mask = first["attention_mask"].to(device)  # (1, T, T), True = masked
        self.attention_mask = mask.unsqueeze(0).expand(case.micro_batch, *mask.shape)

    def micro_batch(self, step: int, micro_step: int) -> dict[str, torch.Tensor]:
        samples = [self.dataset[i] for i in sample_indices(self.case, step, micro_step, self.dp_rank)]
        batch = {key: torch.stack([s[key] for s in samples]).to(self.device, non_blocking=True)
                 for key in ("tokens", "labels", "loss_mask", "position_ids")}
        batch["attention_mask"] = self.attention_mask
        return batch
