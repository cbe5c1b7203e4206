"""Canonical LLMC tensors <-> megatron-core parameters, for every family: layouts, TP shards, the
reverse map, and the real GPTModel (built on the CPU) holding exactly the mapped parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lockstep.errors import LockstepError
from lockstep.models import SHAPES
from lockstep.models.family import split_canonical
from lockstep.models.gpt2.config import GPT2Config
from lockstep.models.llama3.config import Llama3Config
from lockstep.models.qwen3.config import Qwen3Config
from lockstep.runners.megatron.families import adapter_of
from lockstep.runners.megatron.families.base import ChunkShard, qkv_from_groups, qkv_per_group
from lockstep.runners.megatron.weights import canonical_from_chunk, chunk_tensors, load_chunk

# Small but with every structural feature: several heads, GQA groups, two layers, padded vocab.
GPT2_CFG = GPT2Config(max_seq_len=16, vocab_size=50, num_layers=2, num_heads=4, channels=8, padded_vocab_size=64)
LLAMA_CFG = Llama3Config(max_seq_len=16, vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, channels=16,
                         ffn_dim_multiplier=1.0, multiple_of=8)
QWEN_CFG = Qwen3Config(max_seq_len=16, vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, channels=16,
                       intermediate_size=24)
CONFIGS = {"gpt2": GPT2_CFG, "llama3": LLAMA_CFG, "qwen3": QWEN_CFG}


def random_tensors(cfg, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in cfg.tensor_shapes()}


def shard(cfg, tp_rank=0, tp=1, pre=True, post=True, layers=(0, 1)) -> ChunkShard:
    return ChunkShard(rank=tp_rank, tp_rank=tp_rank, tp_size=tp, pre_process=pre, post_process=post,
                      layers=tuple(layers), vocab_rows=adapter_of(cfg.family).vocab_rows(cfg, tp))


def test_qkv_per_group_is_megatron_order_and_inverts():
    NH, kv, hd, C = 4, 2, 3, 5
    qkv = np.arange((NH + 2 * kv) * hd * C, dtype=np.float32).reshape(-1, C)
    grouped = qkv_per_group(qkv, NH, kv)
    # group 0 = [q heads 0,1; k0; v0], group 1 = [q heads 2,3; k1; v1]
    q, k, v = qkv[: NH * hd], qkv[NH * hd : (NH + kv) * hd], qkv[(NH + kv) * hd :]
    expect = np.concatenate([q[: 2 * hd], k[:hd], v[:hd], q[2 * hd :], k[hd:], v[hd:]])
    np.testing.assert_array_equal(grouped, expect)
    np.testing.assert_array_equal(qkv_from_groups(grouped, NH, kv), qkv)


def test_gpt2_qkv_per_head_gives_the_same_q_k_v():
    C, NH = GPT2_CFG.channels, GPT2_CFG.num_heads
    hd = C // NH
    t = random_tensors(GPT2_CFG)
    w, b = t["qkvw"][1], t["qkvb"][1]
    x = np.random.default_rng(1).standard_normal(C).astype(np.float32)
    llmc = w @ x + b  # [Q all heads; K; V]
    mega = (qkv_per_group(w, NH, NH) @ x + qkv_per_group(b, NH, NH)).reshape(NH, 3, hd)  # per head [q, k, v]
    for h in range(NH):
        for j in range(3):
            np.testing.assert_allclose(mega[h, j], llmc[j * C + h * hd:j * C + (h + 1) * hd], rtol=1e-6)


def test_gpt2_tp1_whole_tensors_with_true_vocab():
    t = random_tensors(GPT2_CFG)
    m = chunk_tensors(split_canonical(t, GPT2_CFG), GPT2_CFG, shard(GPT2_CFG), adapter_of("gpt2"))
    assert m["embedding.word_embeddings.weight"].value.shape == (GPT2_CFG.vocab_size, GPT2_CFG.channels)
    np.testing.assert_array_equal(m["embedding.word_embeddings.weight"].value, t["wte"][:GPT2_CFG.vocab_size])
    np.testing.assert_array_equal(m["decoder.layers.1.mlp.linear_fc2.weight"].value, t["fcprojw"][1])
    assert "output_layer.weight" not in m  # PP=1: the output layer reads the embedding


def test_llama_fc1_is_gate_then_up_and_tp_ranks_hold_both_halves():
    t = random_tensors(LLAMA_CFG)
    canon = split_canonical(t, LLAMA_CFG)
    whole = chunk_tensors(canon, LLAMA_CFG, shard(LLAMA_CFG), adapter_of("llama3"))
    fc1 = whole["decoder.layers.1.mlp.linear_fc1.weight"].value
    F = LLAMA_CFG.ffn_hidden
    np.testing.assert_array_equal(fc1[:F], t["fcw2"][1])  # gate
    np.testing.assert_array_equal(fc1[F:], t["fcw"][1])  # up
    r1 = chunk_tensors(canon, LLAMA_CFG, shard(LLAMA_CFG, tp_rank=1, tp=2), adapter_of("llama3"))
    part = r1["decoder.layers.1.mlp.linear_fc1.weight"].value
    np.testing.assert_array_equal(part, np.concatenate([t["fcw2"][1][F // 2:], t["fcw"][1][F // 2:]]))
    assert whole["output_layer.weight"].value is not None  # untied: the last stage has its own head


@pytest.mark.parametrize("family", ["gpt2", "llama3", "qwen3"])
@pytest.mark.parametrize("tp", [1, 2])
def test_reverse_map_returns_every_canonical_tensor(family, tp):
    cfg = CONFIGS[family]
    t = random_tensors(cfg)
    canon = split_canonical(t, cfg)
    adapter = adapter_of(family)
    ranks = [chunk_tensors(canon, cfg, shard(cfg, tp_rank=r, tp=tp), adapter) for r in range(tp)]
    params = {name: ranks[0][name].value for name in ranks[0]}

    def gather(local):  # what an all-gather over the TP group returns, from the ranks' own shards
        name = next(n for n, v in params.items() if v is local)
        return [r[name].value for r in ranks]

    back = canonical_from_chunk(params, cfg, shard(cfg, tp=tp), adapter, gather)
    expected = dict(canon)
    if family == "gpt2":  # Megatron holds V rows at TP=1 (Vp at TP=2); the padding rows come back as 0
        expected["wte"] = np.concatenate([t["wte"][: adapter.vocab_rows(cfg, tp)],
                                          np.zeros((64 - adapter.vocab_rows(cfg, tp), cfg.channels), np.float32)])
    assert set(back) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_pipeline_stages_take_their_layers_and_the_last_gets_the_tied_weight():
    t = random_tensors(GPT2_CFG)
    canon = split_canonical(t, GPT2_CFG)
    first = chunk_tensors(canon, GPT2_CFG, shard(GPT2_CFG, post=False, layers=(0,)), adapter_of("gpt2"))
    last = chunk_tensors(canon, GPT2_CFG, shard(GPT2_CFG, pre=False, layers=(1,)), adapter_of("gpt2"))
    assert "embedding.position_embeddings.weight" in first and "decoder.final_layernorm.weight" not in first
    assert "output_layer.weight" not in first and "embedding.word_embeddings.weight" not in last
    np.testing.assert_array_equal(last["output_layer.weight"].value, t["wte"][:GPT2_CFG.vocab_size])
    np.testing.assert_array_equal(last["decoder.layers.0.input_layernorm.weight"].value, t["ln1w"][1])


def test_vocab_padded_past_vp_when_tp_does_not_divide_it():
    cfg3 = GPT2Config(max_seq_len=16, vocab_size=50, num_layers=2, num_heads=3, channels=12, padded_vocab_size=64)
    assert adapter_of("gpt2").vocab_rows(cfg3, 1) == 50 and adapter_of("gpt2").vocab_rows(cfg3, 3) == 66
    t = random_tensors(cfg3)
    last = chunk_tensors(split_canonical(t, cfg3), cfg3, shard(cfg3, tp_rank=2, tp=3),
                         adapter_of("gpt2"))["embedding.word_embeddings.weight"].value
    assert last.shape == (22, cfg3.channels)
    np.testing.assert_array_equal(last[:20], t["wte"][44:64])
    assert not last[20:].any()


def test_missing_layer_is_named():
    canon = split_canonical(random_tensors(GPT2_CFG), GPT2_CFG)
    with pytest.raises(LockstepError, match=r"rank 0: decoder.layers.1.* is layer 2, but the checkpoint has only 2"):
        chunk_tensors(canon, GPT2_CFG, shard(GPT2_CFG, layers=(1, 2)), adapter_of("gpt2"))


# --- the real megatron-core GPTModel, built on the CPU -------------------------------------------

@pytest.fixture(scope="module")
def megatron_world(tmp_path_factory):
    """A one-process gloo world with megatron's parallel state (TP=PP=1), torn down after."""
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        store = tmp_path_factory.mktemp("dist") / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    from lockstep.runners.megatron.cpu_shims import apply_cpu_shims

    apply_cpu_shims()
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.mark.parametrize("model", ["gpt2-tiny", "llama3-tiny", "qwen3-tiny"])
def test_real_gptmodel_holds_exactly_the_mapped_parameters(megatron_world, model):
    from lockstep.cases.spec import CaseSpec
    from lockstep.runners.megatron import model as mmodel

    cfg = SHAPES[model].config
    adapter = adapter_of(cfg.family)
    case = CaseSpec(name="c", model=model, dtype="float32", micro_batch=1, seq_len=8, total_batch=8, steps=1, lr=1e-4)
    precision = mmodel.Precision.for_case(case, native_bf16=False)
    config = mmodel.transformer_config(case, cfg, adapter, precision, on_cpu=True)

    class Layout:  # one rank, one stage
        vpp = 1

    (chunk,) = mmodel.build_model_chunks(config, cfg, adapter, Layout(), adapter.vocab_rows(cfg, 1))
    t = random_tensors(cfg, seed=3)
    canon = split_canonical(t, cfg)
    sh = shard(cfg, layers=mmodel.chunk_layers(chunk))
    mapped = chunk_tensors(canon, cfg, sh, adapter)
    assert set(mapped) == {n for n, _ in chunk.named_parameters()}  # nothing unmapped, nothing extra
    assert load_chunk(chunk, mapped, rank=0) == sum(p.numel() for p in chunk.parameters())
    params = {n: p.detach().numpy() for n, p in chunk.named_parameters()}
    back = canonical_from_chunk(params, cfg, sh, adapter, lambda local: [local])
    for name, value in canon.items():
        if cfg.family == "gpt2" and name == "wte":
            value = value[: cfg.vocab_size]
            np.testing.assert_array_equal(back[name][: cfg.vocab_size], value)
            continue
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_shape_disagreement_names_the_tensor_and_rank(megatron_world):
    from lockstep.cases.spec import CaseSpec
    from lockstep.runners.megatron import model as mmodel

    cfg = SHAPES["gpt2-tiny"].config
    adapter = adapter_of("gpt2")
    case = CaseSpec(name="c", model="gpt2-tiny", dtype="float32", micro_batch=1, seq_len=8, total_batch=8, steps=1,
                    lr=1e-4)
    config = mmodel.transformer_config(case, cfg, adapter, mmodel.Precision.for_case(case, False), on_cpu=True)

    class Layout:
        vpp = 1

    (chunk,) = mmodel.build_model_chunks(config, cfg, adapter, Layout(), adapter.vocab_rows(cfg, 1))
    wide = GPT2Config(num_layers=2, num_heads=12, channels=108)
    mapped = chunk_tensors(split_canonical(random_tensors(wide), wide), wide, shard(wide), adapter)
    before = [p.detach().clone() for p in chunk.parameters()]
    with pytest.raises(LockstepError) as e:
        load_chunk(chunk, mapped, rank=3)
    assert str(e.value).startswith("rank 3: tensor embedding.word_embeddings.weight (LLMC wte")
    assert "(50257, 108)" in str(e.value) and "(50257, 96)" in str(e.value)
    # nothing copied before the check (compared as bits: megatron leaves unloaded memory uninitialised)
    assert all(torch.equal(a.view(torch.int32), b.detach().view(torch.int32)) for a, b in zip(before, chunk.parameters()))
