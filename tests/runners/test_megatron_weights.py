"""LLMC -> megatron-core tensor mapping (numpy only, no megatron-core needed): layout, shards, checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lockstep.errors import LockstepError
from lockstep.models.configs import GPT2Config
from lockstep.runners.megatron.job import megatron_vocab_size
from lockstep.runners.megatron.weights import (ChunkShard, load_chunk, megatron_chunk_tensors,
                                               qkv_rows_per_head)

# Small but with every structural feature: several heads, two layers, padded vocab.
CFG = GPT2Config(max_seq_len=16, vocab_size=50, num_layers=2, num_heads=4, channels=8, padded_vocab_size=64)


def random_tensors(cfg: GPT2Config, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in cfg.tensor_shapes()}


def shard(tp_rank=0, tp=1, pre=True, post=True, layers=(0, 1), cfg=CFG) -> ChunkShard:
    return ChunkShard(rank=tp_rank, tp_rank=tp_rank, tp_size=tp, pre_process=pre, post_process=post,
                      layers=tuple(layers), vocab_rows=megatron_vocab_size(cfg, tp))


def fake_module(shapes: dict[str, tuple[int, ...]]) -> torch.nn.Module:
    """A module whose named_parameters() are exactly `shapes` (megatron-style dotted names)."""
    root = torch.nn.Module()
    for name, shape in shapes.items():
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape)))
    return root


def test_qkv_regrouped_per_head_gives_the_same_q_k_v():
    C, NH = CFG.channels, CFG.num_heads
    hd = C // NH
    t = random_tensors(CFG)
    w, b = t["qkvw"][1], t["qkvb"][1]
    x = np.random.default_rng(1).standard_normal(C).astype(np.float32)
    llmc = w @ x + b  # [Q all heads; K; V]
    mega = (qkv_rows_per_head(w, NH) @ x + qkv_rows_per_head(b, NH)).reshape(NH, 3, hd)  # per head [q, k, v]
    for h in range(NH):
        for j in range(3):
            np.testing.assert_allclose(mega[h, j], llmc[j * C + h * hd:j * C + (h + 1) * hd], rtol=1e-6)


def test_tp1_mapping_is_whole_tensors_with_true_vocab():
    t = random_tensors(CFG)
    m = megatron_chunk_tensors(t, CFG, shard())
    assert m["embedding.word_embeddings.weight"].value.shape == (CFG.vocab_size, CFG.channels)
    np.testing.assert_array_equal(m["embedding.word_embeddings.weight"].value, t["wte"][:CFG.vocab_size])
    np.testing.assert_array_equal(m["decoder.layers.1.mlp.linear_fc2.weight"].value, t["fcprojw"][1])
    np.testing.assert_array_equal(m["decoder.final_layernorm.bias"].value, t["lnfb"])
    assert "output_layer.weight" not in m  # PP=1: the output layer reads the embedding


def test_tp2_shards_reassemble_to_the_whole_tensors():
    t = random_tensors(CFG)
    whole = megatron_chunk_tensors(t, CFG, shard())
    halves = [megatron_chunk_tensors(t, CFG, shard(tp_rank=r, tp=2)) for r in (0, 1)]
    column_parallel = ("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight", "linear_fc1.bias")
    row_parallel = ("linear_proj.weight", "linear_fc2.weight")
    for name, mapped in whole.items():
        parts = [h[name].value for h in halves]
        if name.endswith(column_parallel):
            np.testing.assert_array_equal(np.concatenate(parts, axis=0), mapped.value, err_msg=name)
        elif name.endswith(row_parallel):
            np.testing.assert_array_equal(np.concatenate(parts, axis=1), mapped.value, err_msg=name)
        elif name == "embedding.word_embeddings.weight":
            # TP>1: Megatron's vocab is the padded Vp, split by rows.
            np.testing.assert_array_equal(np.concatenate(parts, axis=0), t["wte"])
        else:  # LayerNorms, row-parallel biases, positions: whole on every TP rank
            for p in parts:
                np.testing.assert_array_equal(p, mapped.value, err_msg=name)
    # Column-parallel qkv gives rank 1 the second half of the heads, each as [q, k, v].
    hd = CFG.channels // CFG.num_heads
    rank1 = halves[1]["decoder.layers.0.self_attention.linear_qkv.weight"].value
    np.testing.assert_array_equal(rank1[:hd], t["qkvw"][0][2 * hd:3 * hd])  # q of head 2


def test_vocab_padded_past_vp_when_tp_does_not_divide_it():
    assert megatron_vocab_size(CFG, 1) == 50 and megatron_vocab_size(CFG, 2) == 64
    cfg3 = GPT2Config(max_seq_len=16, vocab_size=50, num_layers=2, num_heads=3, channels=12, padded_vocab_size=64)
    assert megatron_vocab_size(cfg3, 3) == 66  # 64 rounded up to a multiple of 3
    t = random_tensors(cfg3)
    last = megatron_chunk_tensors(t, cfg3, shard(tp_rank=2, tp=3, cfg=cfg3))["embedding.word_embeddings.weight"].value
    assert last.shape == (22, cfg3.channels)
    np.testing.assert_array_equal(last[:20], t["wte"][44:64])
    assert not last[20:].any()


def test_pipeline_stages_take_their_layers_and_the_last_gets_the_tied_weight():
    t = random_tensors(CFG)
    first = megatron_chunk_tensors(t, CFG, shard(pre=True, post=False, layers=(0,)))
    last = megatron_chunk_tensors(t, CFG, shard(pre=False, post=True, layers=(1,)))
    assert "embedding.position_embeddings.weight" in first and "decoder.final_layernorm.weight" not in first
    assert "output_layer.weight" not in first
    assert "embedding.word_embeddings.weight" not in last and "decoder.final_layernorm.weight" in last
    np.testing.assert_array_equal(last["output_layer.weight"].value, t["wte"][:CFG.vocab_size])
    # The last stage's local layer 0 is global layer 1.
    np.testing.assert_array_equal(last["decoder.layers.0.input_layernorm.weight"].value, t["ln1w"][1])
    assert set(k for k in last if k.startswith("decoder.layers.")) == {
        k.replace("layers.1.", "layers.0.") for k in megatron_chunk_tensors(t, CFG, shard()) if "layers.1." in k}


def test_load_copies_into_matching_parameters():
    t = random_tensors(CFG)
    mapped = megatron_chunk_tensors(t, CFG, shard())
    module = fake_module({name: m.value.shape for name, m in mapped.items()})
    assert load_chunk(module, mapped, rank=0) == sum(m.value.size for m in mapped.values())
    got = dict(module.named_parameters())["decoder.layers.0.self_attention.linear_qkv.weight"]
    np.testing.assert_array_equal(got.detach().numpy(), qkv_rows_per_head(t["qkvw"][0], CFG.num_heads))


def test_shape_disagreement_names_the_tensor_and_rank():
    wide = GPT2Config(max_seq_len=16, vocab_size=50, num_layers=2, num_heads=4, channels=12, padded_vocab_size=64)
    model_shapes = {name: m.value.shape for name, m in megatron_chunk_tensors(random_tensors(wide), wide, shard(cfg=wide)).items()}
    mapped = megatron_chunk_tensors(random_tensors(CFG), CFG, shard())
    module = fake_module(model_shapes)
    with pytest.raises(LockstepError) as e:
        load_chunk(module, mapped, rank=3)
    msg = str(e.value)
    assert msg.startswith("rank 3: tensor embedding.word_embeddings.weight (LLMC wte")
    assert "(50, 8)" in msg and "(50, 12)" in msg
    assert not any(p.detach().any() for p in module.parameters())  # nothing copied before the check


def test_missing_layer_and_unknown_parameter_are_named():
    t = random_tensors(CFG)
    with pytest.raises(LockstepError, match=r"rank 0: decoder.layers.1 is layer 2, but the checkpoint has only 2"):
        megatron_chunk_tensors(t, CFG, shard(layers=(1, 2)))
    mapped = megatron_chunk_tensors(t, CFG, shard())
    shapes = {name: m.value.shape for name, m in mapped.items()}
    shapes["decoder.layers.0.self_attention.q_layernorm.weight"] = (2,)
    with pytest.raises(LockstepError, match="q_layernorm.weight has no LLMC counterpart"):
        load_chunk(fake_module(shapes), mapped, rank=0)
