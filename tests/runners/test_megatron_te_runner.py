"""megatron-te: Transformer Engine's layer spec on the megatron runner (runners/megatron/te_spec.py).

TE runs on CUDA only, so here: its parameter names (the norms move into the following fused
linear layers, nothing else changes), and where it is skipped, with the reason. Its GPU run is in
docs/results (gpt2_2_bfloat16 beside pytorch, megatron and megatron-fast).
"""

from __future__ import annotations

from lockstep.models import model_shape
from lockstep.runners.megatron.families.base import ChunkShard
from lockstep.runners.megatron.families.gpt2 import ADAPTER as GPT2
from lockstep.runners.megatron.families.llama3 import ADAPTER as LLAMA3
from lockstep.runners.megatron.te_spec import TESpecAdapter, te_name


def test_norms_move_into_the_fused_linear_layers():
    qkv = "self_attention.linear_qkv"
    assert te_name("decoder.layers.3.input_layernorm.weight") == f"decoder.layers.3.{qkv}.layer_norm_weight"
    assert te_name("decoder.layers.0.input_layernorm.bias") == f"decoder.layers.0.{qkv}.layer_norm_bias"
    assert te_name("decoder.layers.1.pre_mlp_layernorm.weight") == "decoder.layers.1.mlp.linear_fc1.layer_norm_weight"
    assert te_name("decoder.layers.1.pre_mlp_layernorm.bias") == "decoder.layers.1.mlp.linear_fc1.layer_norm_bias"
    for same in ("decoder.final_layernorm.weight", "decoder.layers.2.self_attention.linear_qkv.weight",
                 "decoder.layers.2.self_attention.q_layernorm.weight", "embedding.word_embeddings.weight"):
        assert te_name(same) == same


def _shard(model) -> ChunkShard:
    return ChunkShard(rank=0, tp_rank=0, tp_size=1, pre_process=True, post_process=True,
                      layers=list(range(model.num_layers)), vocab_rows=model.vocab_size)


def test_every_tensor_keeps_its_canonical_source_and_layout():
    for adapter, shape in ((GPT2, "gpt2-tiny"), (LLAMA3, "llama3-tiny")):
        model = model_shape(shape).config
        local = adapter.weight_maps(model, _shard(model))
        te = TESpecAdapter(adapter).weight_maps(model, _shard(model))
        assert [(m.canonical, m.tp_split, m.copy) for m in te] == \
               [(m.canonical, m.tp_split, m.copy) for m in local]
        renamed = {m.megatron for m in te} - {m.megatron for m in local}
        norms_per_layer = 4 if adapter is GPT2 else 2  # LayerNorm's weight and bias; RMSNorm's weight
        assert len(renamed) == norms_per_layer * model.num_layers
        assert not any("input_layernorm" in n or "pre_mlp_layernorm" in n for n in (m.megatron for m in te))
        assert TESpecAdapter(adapter).family == adapter.family  # everything else is the family's


def test_skipped_on_the_cpu_with_the_reason(capsys):
    from lockstep.cli import main

    args = ["run", "--dry-run", "--frameworks", "pytorch,megatron-te", "--cases", "gpt2_1", "--device", "cpu"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "megatron-te/gpt2_1" in out and "Transformer Engine runs on CUDA only" in out


def test_it_records_no_step_1_where_it_trains(monkeypatch):
    """On the H100 a recorded step 1 put the identity TE's spec leaves in the norm's place where the
    reference's ln1 is, and the certificate named a forward difference at ln1[0] that is not there."""
    from lockstep.cases.spec import CaseSpec
    from lockstep.models import SHAPES
    from lockstep.runners import get_runner
    from lockstep.runners.base import RunInputs, capture_problem
    from lockstep.runners.megatron import te_spec

    import torch

    monkeypatch.setattr(te_spec, "transformer_engine_missing", lambda: None)  # as where TE is installed
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # and one GPU
    runner = get_runner("megatron-te", {})
    case = CaseSpec(name="gpt2_2", model="gpt2-tiny", dtype="float32", micro_batch=4, seq_len=64, total_batch=256,
                    steps=1, lr=1e-4)
    inputs = RunInputs(checkpoint="x.bin", tokens="t.bin", model=SHAPES["gpt2-tiny"].config, device="cuda",
                       model_name="gpt2-tiny")
    assert runner.skip_reason(case, inputs) is None
    assert "cannot show its step 1 from inside" in capture_problem(runner, case, inputs)
    assert get_runner("megatron", {}).capture_problem(case, inputs) is None  # megatron's own spec records it
