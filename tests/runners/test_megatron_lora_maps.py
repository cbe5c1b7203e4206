"""A LoRA case's adapters on megatron-core's layers (runners/megatron/families/lora.py): which linear
holds which adapter, how each is split over TP ranks, and the round trip canonical -> Megatron ->
canonical, numpy only (no megatron-core)."""

from __future__ import annotations

import dataclasses

import numpy as np

from lockstep.cases.spec import LoraSpec
from lockstep.models.family import split_canonical
from lockstep.models.gpt2.config import GPT2Config
from lockstep.models.llama3.config import Llama3Config
from lockstep.models.lora import lora_init_tensors
from lockstep.runners.megatron.families import adapter_of
from lockstep.runners.megatron.families.base import ChunkShard, qkv_per_group
from lockstep.runners.megatron.families.lora import lora_maps
from lockstep.runners.megatron.weights import chunk_tensors

GPT2_CFG = GPT2Config(max_seq_len=16, vocab_size=50, num_layers=2, num_heads=4, channels=8, padded_vocab_size=64)
LLAMA_CFG = Llama3Config(max_seq_len=16, vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, channels=16,
                         ffn_dim_multiplier=1.0, multiple_of=8)
WIDE = LoraSpec(rank=4, alpha=8.0, target_modules=("c_attn", "c_fc", "c_proj"))


def shard(cfg, spec, tp_rank=0, tp=1) -> ChunkShard:
    return ChunkShard(rank=tp_rank, tp_rank=tp_rank, tp_size=tp, pre_process=True, post_process=True, layers=(0, 1),
                      vocab_rows=adapter_of(cfg.family).vocab_rows(cfg, tp), lora=spec)


def lora_init(cfg, spec) -> dict:
    """The init with a nonzero B, so that every row's place is seen."""
    rng = np.random.default_rng(0)
    return {n: (rng.standard_normal(v.shape).astype(np.float32) if n.startswith("lora_B") else v)
            for n, v in lora_init_tensors(cfg.family, cfg, spec, seed=42).items()}


def with_base(cfg, init: dict) -> dict:
    """The adapters beside a base model's canonical tensors (random), as the worker maps them."""
    rng = np.random.default_rng(1)
    base = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in cfg.tensor_shapes()}
    return split_canonical(base, cfg) | init


def test_llama_adapters_sit_on_their_linears_split_as_infinitrain_splits_them():
    maps = {m.megatron: (m.canonical, m.tp_split) for m in lora_maps(adapter_of("llama3"), LLAMA_CFG, shard(LLAMA_CFG, WIDE))}
    p = "decoder.layers.1."
    assert maps[p + "self_attention.linear_qkv.lora_A"] == ("lora_A.qkvw[1]", None)  # replicated
    assert maps[p + "self_attention.linear_qkv.lora_B"] == ("lora_B.qkvw[1]", "rows")
    assert maps[p + "self_attention.linear_proj.lora_A"] == ("lora_A.attprojw[1]", "columns")
    assert maps[p + "self_attention.linear_proj.lora_B"] == ("lora_B.attprojw[1]", None)
    # c_fc is the up half of the gated fc1 only: no gate adapter
    assert maps[p + "mlp.linear_fc1.lora_A_up"] == ("lora_A.fcw[1]", None)
    assert maps[p + "mlp.linear_fc1.lora_B_up"] == ("lora_B.fcw[1]", "rows")
    assert not any("gate" in n for n in maps)
    assert maps[p + "mlp.linear_fc2.lora_A"] == ("lora_A.fcprojw[1]", "columns")
    assert len(maps) == 2 * 8
    assert lora_maps(adapter_of("llama3"), LLAMA_CFG, dataclasses.replace(shard(LLAMA_CFG, WIDE), lora=None)) == []


def test_qkv_b_is_regrouped_like_qkvw_then_split_by_rows():
    for cfg in (GPT2_CFG, LLAMA_CFG):
        adapter, init = adapter_of(cfg.family), lora_init(cfg, WIDE)
        grouped = qkv_per_group(init["lora_B.qkvw[0]"], cfg.num_heads, cfg.num_kv_heads)
        assert not np.array_equal(grouped, init["lora_B.qkvw[0]"])
        for r in range(2):
            got = chunk_tensors(with_base(cfg, init), cfg, shard(cfg, WIDE, r, 2), adapter)
            name = "decoder.layers.0.self_attention.linear_qkv."
            rows = grouped.shape[0] // 2
            assert np.array_equal(got[name + "lora_B"].value, grouped[r * rows:(r + 1) * rows])
            assert np.array_equal(got[name + "lora_A"].value, init["lora_A.qkvw[0]"])  # the same A on every rank
            proj = got["decoder.layers.0.mlp.linear_fc2.lora_A"].value
            cols = init["lora_A.fcprojw[0]"].shape[1] // 2
            assert np.array_equal(proj, init["lora_A.fcprojw[0]"][:, r * cols:(r + 1) * cols])


def test_canonical_round_trip_over_two_tp_ranks():
    from lockstep.runners.megatron.weights import canonical_from_chunk

    for cfg in (GPT2_CFG, LLAMA_CFG):
        adapter, init = adapter_of(cfg.family), lora_init(cfg, WIDE)
        ranks = [{n: m.value for n, m in chunk_tensors(with_base(cfg, init), cfg, shard(cfg, WIDE, r, 2), adapter).items()} for r in (0, 1)]
        by_id = {id(v): n for n, v in ranks[0].items()}
        back = canonical_from_chunk(ranks[0], cfg, shard(cfg, WIDE, 0, 2), adapter,
                                    lambda local: [ranks[r][by_id[id(local)]] for r in (0, 1)])
        assert all(np.array_equal(back[n], v) for n, v in init.items()), cfg.family
