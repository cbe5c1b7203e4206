"""Qwen3: Llama 3's math plus QK-norm, half-split RoPE (theta 1e6), Adam
(docs/reference/training-contract.md#model-math)."""

from __future__ import annotations

from lockstep.models.family import ModelFamily, ModelShape
from lockstep.models.llama3 import ADAM
from lockstep.models.llama3 import init_rule as llama_init_rule
from lockstep.models.qwen3 import checkpoint, hf
from lockstep.models.qwen3.config import Qwen3Config

FAMILY = ModelFamily(
    name="qwen3",
    title="Qwen3",
    config_type=Qwen3Config,
    magic=checkpoint.QWEN3_MAGIC,
    tokenizer="qwen3",
    optimizer=ADAM,
    decode_header=checkpoint.decode_header,
    encode_header=checkpoint.encode_header,
    fp32_version=checkpoint.VERSION_FP32,
    bf16_version=None,
    init_rule=llama_init_rule,  # the same rule: q_norm/k_norm weights are RMSNorm weights, 1
    hf=hf.ADAPTER,
    reference="lockstep.models.qwen3.model:Qwen3",
)

SHAPES = (
    ModelShape("qwen3-8b", "qwen3",
               Qwen3Config(num_layers=36, num_heads=32, num_kv_heads=8, channels=4096, intermediate_size=12288),
               "Qwen3-8B shape (L36 NH32 kv8 C4096 I12288), the seed's 8-GPU cases"),
    ModelShape("qwen3-1.7b", "qwen3", Qwen3Config(), "Qwen3-1.7B shape (L28 NH16 kv8 C2048 I6144), one H200"),
    ModelShape("qwen3-tiny", "qwen3",
               Qwen3Config(max_seq_len=1024, num_layers=4, num_heads=8, num_kv_heads=4, channels=128,
                           intermediate_size=384),
               "Qwen3 L4 NH8 kv4 C128 I384 (real vocabulary), for CPUs"),
)
