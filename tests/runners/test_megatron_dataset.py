"""The megatron runner's data: indexed dataset cache and GPTDataset in the contract's order.

The order test has negative controls: a contract order (or a GPTDataset order) one micro batch
late must be found, with the place of the first disagreement. They need no ../shared: the
tokens are the offline corpus's where the text is absent.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from lockstep.cases.spec import CaseSpec
from lockstep.data.loader import TokenBatches
from lockstep.formats.tokens import read_token_stream, write_token_stream
from support import defects

pytest.importorskip("megatron.core")

from lockstep.runners.megatron import dataset as mdata  # noqa: E402


def case(B=4, T=64, total=1024, dp=2, steps=3) -> CaseSpec:
    return CaseSpec(name="d", model="gpt2", dtype="float32", micro_batch=B, seq_len=T, total_batch=total, steps=steps,
                    lr=1e-4, dp=dp)


@pytest.fixture
def train_tokens(tmp_path, training_tokens):
    path = tmp_path / "train.bin"  # a private copy: the cache goes next to it
    shutil.copy(training_tokens, path)
    return path


def first_disagreement(train_tokens, c: CaseSpec):
    """(dp_rank, step, micro, what) of the first micro batch where GPTDataset and the contract's
    TokenBatches disagree, or None when every one agrees."""
    indexed = mdata.ensure_indexed_dataset(train_tokens)
    dataset = mdata.build_gpt_dataset(indexed, c.seq_len, mdata.samples_needed(c), vocab_size=50257)
    tokens = read_token_stream(train_tokens).tokens
    for dp_rank in range(c.dp):
        ours = mdata.MicroBatches(dataset, c, dp_rank, torch.device("cpu"))
        contract = TokenBatches(tokens, c, dp_rank=dp_rank)
        for step in range(c.steps):
            for micro in range(c.accum):
                batch = ours.micro_batch(step, micro)
                x, y = contract.micro_batch(step, micro)
                for what, a, b in (("tokens", batch["tokens"], x), ("labels", batch["labels"], y)):
                    if not torch.equal(a, b):
                        return dp_rank, step, micro, what
                assert batch["loss_mask"].eq(1).all()  # no EOD loss masking
                assert torch.equal(batch["position_ids"], torch.arange(c.seq_len).expand(c.micro_batch, -1))
    return None


def test_gpt_dataset_batches_equal_the_contract_token_batches(train_tokens):
    c = case()  # DP=2, B=4, T=64, 1024 tokens/step -> accum 2
    assert c.accum == 2
    assert first_disagreement(train_tokens, c) is None
    indexed = mdata.ensure_indexed_dataset(train_tokens)
    dataset = mdata.build_gpt_dataset(indexed, c.seq_len, mdata.samples_needed(c), vocab_size=50257)
    ours = mdata.MicroBatches(dataset, c, 1, torch.device("cpu"))
    # Sample index formula: micro step m of step s on DP rank r -> (s*accum+m)*DP*B + r*B + b.
    assert mdata.sample_indices(c, step=2, micro_step=1, dp_rank=1) == [(2 * 2 + 1) * 2 * 4 + 4 + b for b in range(4)]
    # The causal mask: True above the diagonal (masked), the same for every sample.
    mask = ours.attention_mask
    assert mask.shape == (c.micro_batch, 1, c.seq_len, c.seq_len)
    assert torch.equal(mask[0, 0], torch.ones(c.seq_len, c.seq_len, dtype=torch.bool).triu(1))


def test_order_check_finds_a_contract_order_one_micro_batch_late(train_tokens, monkeypatch):
    defects.inject("data_order_off_by_one", monkeypatch)  # TokenBatches' window_start
    assert first_disagreement(train_tokens, case()) == (0, 0, 0, "tokens")


def test_order_check_finds_a_gpt_dataset_order_one_micro_batch_late(train_tokens, monkeypatch):
    right = mdata.sample_indices

    def late(c, step, micro_step, dp_rank):
        return [i + c.micro_batch for i in right(c, step, micro_step, dp_rank)]

    monkeypatch.setattr(mdata, "sample_indices", late)
    assert first_disagreement(train_tokens, case()) == (0, 0, 0, "tokens")


def test_indexed_dataset_is_one_int32_document_cached_by_content(train_tokens):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    first = mdata.ensure_indexed_dataset(train_tokens)
    assert first.cache_dir.parent == train_tokens.parent / "train.bin.megatron"
    n = read_token_stream(train_tokens).count
    low = IndexedDataset(first.prefix, multimodal=False, mmap=True)
    assert low.sequence_lengths.tolist() == [n] and low.index.dtype == np.int32
    np.testing.assert_array_equal(low.get(0, offset=100, length=5), read_token_stream(train_tokens).tokens[100:105])
    bin_mtime = (first.cache_dir / "tokens.bin").stat().st_mtime_ns
    again = mdata.ensure_indexed_dataset(train_tokens)
    assert again == first and (first.cache_dir / "tokens.bin").stat().st_mtime_ns == bin_mtime  # reused
    # A known sha256 keys the cache by content; a different file gets its own entry.
    by_sha = mdata.ensure_indexed_dataset(train_tokens, tokens_sha256="ab" * 32)
    assert by_sha.cache_dir.name == "sha256-" + "ab" * 8
    write_token_stream(train_tokens, np.arange(5000) % 50257)
    other = mdata.ensure_indexed_dataset(train_tokens)
    assert other.cache_dir != first.cache_dir and other.num_tokens == 5000
