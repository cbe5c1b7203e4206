"""LoRA on the reference models: InfiniTrain's contract (docs/reference/lora.md), checked against
peft on GPT-2, where both express the same model, with negative controls that must differ."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

from lockstep.cases.spec import LoraSpec
from lockstep.errors import CaseError, FormatError
from lockstep.models import FAMILIES
from lockstep.models.lora import LoRALinear, apply_lora, lora_file_bytes, lora_init, read_lora_file, write_lora_file

ATTN = LoraSpec(rank=8, alpha=16.0, target_modules=("c_attn", "attn.c_proj"))  # InfiniTrain's 1_lora
WIDE = LoraSpec(rank=4, alpha=8.0, target_modules=("c_attn", "c_fc", "c_proj"))  # its 4_lora


def gpt2_reference(gpt2_tiny):
    config, tensors = gpt2_tiny
    return FAMILIES["gpt2"].reference_class().from_llmc(tensors, config), config


def batch(config, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, config.vocab_size, (2, 16), generator=g)
    return idx, torch.roll(idx, -1, dims=1)


def test_targets_frozen_base_and_the_init(gpt2_tiny):
    model, config = gpt2_reference(gpt2_tiny)
    adapters = apply_lora(model, WIDE)
    assert list(adapters.layers) == [f"h.{i}.{m}" for i in range(config.num_layers)
                                     for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    assert list(apply_lora(gpt2_reference(gpt2_tiny)[0], ATTN).layers) == ["h.0.attn.c_attn", "h.0.attn.c_proj",
                                                                          "h.1.attn.c_attn", "h.1.attn.c_proj"]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == [f"h.{i}.{m}.lora_{ab}" for i in range(config.num_layers)
                         for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj") for ab in "AB"]
    assert "qkvw[0]" in model.llmc_parameters()  # the base weights keep their LLMC names
    init = lora_init(adapters, seed=42)
    a = init["transformer.h.0.mlp.c_proj.lora_A"]
    assert a.shape == (4, 4 * config.channels) and np.abs(a).max() <= 1 / math.sqrt(4 * config.channels)
    assert np.abs(a).max() > 0.9 / math.sqrt(4 * config.channels)  # the whole range is used
    assert all(not v.any() for k, v in init.items() if k.endswith("lora_B"))
    again = lora_init(apply_lora(gpt2_reference(gpt2_tiny)[0], WIDE), seed=42)
    assert all(np.array_equal(init[k], again[k]) for k in init)  # seeded: the same init every time
    other = lora_init(apply_lora(gpt2_reference(gpt2_tiny)[0], WIDE), seed=43)
    assert not np.array_equal(init["transformer.h.0.mlp.c_proj.lora_A"], other["transformer.h.0.mlp.c_proj.lora_A"])


def test_b_zero_starts_at_the_base_model_and_only_adapters_train(gpt2_tiny):
    base, config = gpt2_reference(gpt2_tiny)
    model, _ = gpt2_reference(gpt2_tiny)
    adapters = apply_lora(model, ATTN)
    lora_init(adapters, seed=1)
    idx, tgt = batch(config)
    assert torch.equal(model(idx, tgt)[1], base(idx, tgt)[1])
    before = {n: p.detach().clone() for n, p in model.llmc_parameters().items()}
    opt = torch.optim.SGD(adapters.parameters(), lr=0.1)
    model(idx, tgt)[1].backward()
    assert all(p.grad is None for p in model.llmc_parameters().values())
    opt.step()
    assert all(torch.equal(before[n], p) for n, p in model.llmc_parameters().items())  # frozen: not one bit moved
    layer = adapters.layers["h.0.attn.c_attn"]
    assert layer.lora_B.abs().sum() > 0  # B receives the gradient first (A's is zero while B is)


def test_a_target_naming_nothing_is_refused(gpt2_tiny):
    with pytest.raises(CaseError, match="LoRA target\\(s\\) c_fc2 name no linear layer of the model"):
        apply_lora(gpt2_reference(gpt2_tiny)[0], LoraSpec(rank=4, alpha=8.0, target_modules=("c_fc2",)))


def test_lora_file_is_infinitraiins_layout_and_round_trips(tmp_path):
    tensors = {"transformer.h.0.attn.c_attn.lora_A": np.arange(6, dtype=np.float32).reshape(2, 3),
               "transformer.h.0.attn.c_attn.lora_B": np.zeros((4, 2), dtype=np.float32)}
    raw = lora_file_bytes(tensors)
    name_a = b"transformer.h.0.attn.c_attn.lora_A"
    assert raw[:12] == struct.pack("<III", 0x4C4F5241, 1, 2) and raw[:4] == b"AROL"
    assert raw[12:16 + len(name_a) + 4 + 16] == (struct.pack("<I", len(name_a)) + name_a + struct.pack("<I", 2)
                                                  + struct.pack("<qq", 2, 3))
    assert len(raw) == 12 + 2 * (4 + len(name_a) + 4 + 16) + 4 * (6 + 8)
    path = tmp_path / "lora.bin"
    write_lora_file(path, tensors)
    assert path.read_bytes() == raw
    back = read_lora_file(path)
    assert list(back) == list(tensors) and all(np.array_equal(back[k], tensors[k]) for k in tensors)
    path.write_bytes(raw[:-4])
    with pytest.raises(FormatError, match="truncated: tensor transformer.h.0.attn.c_attn.lora_B needs 32 bytes"):
        read_lora_file(path)
    path.write_bytes(b"LORA" + raw[4:])
    with pytest.raises(FormatError, match="wrong magic number"):
        read_lora_file(path)


def test_loading_an_init_checks_every_name_and_shape(gpt2_tiny):
    adapters = apply_lora(gpt2_reference(gpt2_tiny)[0], ATTN)
    init = lora_init(adapters, seed=0)
    short = dict(init)
    short.pop("transformer.h.1.attn.c_proj.lora_B")
    with pytest.raises(FormatError, match="has no transformer.h.1.attn.c_proj.lora_B, which the case's LoRA needs"):
        adapters.load(short, "x.bin")
    with pytest.raises(FormatError, match="holds transformer.h.0.mlp.c_fc.lora_A, which no adapter of the case has"):
        adapters.load({**init, "transformer.h.0.mlp.c_fc.lora_A": np.zeros((8, 96), np.float32)}, "x.bin")


def peft_model(gpt2_tiny, spec: LoraSpec):
    peft = pytest.importorskip("peft")
    model, _ = gpt2_reference(gpt2_tiny)
    cfg = peft.LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.target_modules),
                          lora_dropout=0.0, bias="none", init_lora_weights=True)
    return peft.get_peft_model(model, cfg)


def same_adapters(ours, theirs, seed=5):
    """Our seeded init with a non-zero B (so the branch shows in the forward), copied into peft's."""
    g = torch.Generator().manual_seed(seed)
    mods = dict(theirs.named_modules())
    for path, layer in ours.layers.items():
        with torch.no_grad():
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g) * 0.02)
            peft_layer = mods[f"base_model.model.{path}"]
            peft_layer.lora_A["default"].weight.copy_(layer.lora_A)
            peft_layer.lora_B["default"].weight.copy_(layer.lora_B)


@pytest.mark.parametrize("spec", [ATTN, WIDE], ids=["1_lora", "4_lora"])
def test_same_forward_and_gradients_as_peft(gpt2_tiny, spec):
    theirs = peft_model(gpt2_tiny, spec)
    model, config = gpt2_reference(gpt2_tiny)
    ours = apply_lora(model, spec)
    lora_init(ours, seed=42)
    same_adapters(ours, theirs)
    mods = dict(theirs.named_modules())
    assert sorted(n for n, p in theirs.named_parameters() if p.requires_grad) == sorted(
        f"base_model.model.{path}.lora_{ab}.default.weight" for path in ours.layers for ab in "AB")
    idx, tgt = batch(config)
    loss_ours, loss_theirs = model(idx, tgt)[1], theirs(idx, tgt)[1]
    assert torch.equal(loss_ours, loss_theirs)
    loss_ours.backward()
    loss_theirs.backward()
    for path, layer in ours.layers.items():
        peft_layer = mods[f"base_model.model.{path}"]
        assert torch.equal(layer.lora_A.grad, peft_layer.lora_A["default"].weight.grad), path
        assert torch.equal(layer.lora_B.grad, peft_layer.lora_B["default"].weight.grad), path
        assert peft_layer.scaling["default"] == layer.scale == spec.alpha / spec.rank
    assert ours.layers["h.0.attn.c_attn"].lora_A.grad.abs().sum() > 0


@pytest.mark.parametrize("defect", ["scale alpha", "B not zero", "wrong module"])
def test_negative_controls_differ_from_peft(gpt2_tiny, defect):
    theirs = peft_model(gpt2_tiny, ATTN)
    model, config = gpt2_reference(gpt2_tiny)
    spec = LoraSpec(rank=8, alpha=16.0, target_modules=("c_attn", "mlp.c_proj")) if defect == "wrong module" else ATTN
    ours = apply_lora(model, spec)
    lora_init(ours, seed=42)
    if defect == "B not zero":
        # both start from our init with B = 0 on peft's side; ours keeps a planted non-zero B
        mods = dict(theirs.named_modules())
        for path, layer in ours.layers.items():
            with torch.no_grad():
                mods[f"base_model.model.{path}"].lora_A["default"].weight.copy_(layer.lora_A)
                mods[f"base_model.model.{path}"].lora_B["default"].weight.zero_()
                layer.lora_B.fill_(1e-2)
    elif defect == "wrong module":
        mods = dict(theirs.named_modules())
        g = torch.Generator().manual_seed(5)
        for path, layer in ours.layers.items():
            with torch.no_grad():
                layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g) * 0.02)
        for path in ("h.0.attn.c_attn", "h.1.attn.c_attn"):
            with torch.no_grad():
                mods[f"base_model.model.{path}"].lora_A["default"].weight.copy_(ours.layers[path].lora_A)
                mods[f"base_model.model.{path}"].lora_B["default"].weight.copy_(ours.layers[path].lora_B)
        for path in ("h.0.attn.c_proj", "h.1.attn.c_proj"):
            with torch.no_grad():
                mods[f"base_model.model.{path}"].lora_B["default"].weight.fill_(0.02)
    else:
        same_adapters(ours, theirs)
        for layer in ours.layers.values():
            layer.scale = layer.alpha  # the planted defect: alpha instead of alpha / rank
    idx, tgt = batch(config)
    assert not torch.equal(model(idx, tgt)[1], theirs(idx, tgt)[1])


def test_lora_linear_keeps_the_base_parameters():
    base = torch.nn.Linear(3, 2)
    layer = LoRALinear(base, rank=2, alpha=4.0)
    assert layer.weight is base.weight and layer.bias is base.bias and layer.scale == 2.0
    assert [n for n, _ in layer.named_parameters()] == ["weight", "bias", "lora_A", "lora_B"]


def test_llama3_adapts_its_gate_and_starts_at_the_base_model():
    from lockstep.models import SHAPES
    from lockstep.models.init import init_tensors

    config = SHAPES["llama3-tiny"].config
    tensors = init_tensors(config, FAMILIES["llama3"].init_rule(config), seed=42)
    ref = FAMILIES["llama3"].reference_class()
    base, model = ref.from_llmc(tensors, config), ref.from_llmc(tensors, config)
    adapters = apply_lora(model, LoraSpec(rank=4, alpha=8.0, target_modules=("c_attn", "c_proj", "c_fc", "c_fc2")))
    assert list(adapters.layers)[:5] == ["h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_fc", "h.0.mlp.c_fc2",
                                         "h.0.mlp.c_proj"]
    assert "lm_head" not in adapters.layers  # no target names it
    init = lora_init(adapters, seed=42)
    assert init["transformer.h.0.attn.c_attn.lora_B"].shape == (config.qkv_rows, 4)  # one adapter on fused Q,K,V
    idx = torch.randint(0, config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model(idx, torch.roll(idx, -1, 1))[1], base(idx, torch.roll(idx, -1, 1))[1])
