"""Llama 3: RMSNorm, interleaved RoPE, GQA, SwiGLU, untied head, Adam (docs/reference/training-contract.md#model-math)."""

from __future__ import annotations

import math

from lockstep.models.family import InitRule, ModelFamily, ModelShape, OptimizerSpec
from lockstep.models.llama3 import checkpoint, hf
from lockstep.models.llama3.config import Llama3Config

INIT_STD = 0.02
NORM_WEIGHTS = ("ln1w", "qknormw", "ln2w", "lnfw")  # RMSNorm weights (Qwen3's q/k norms too): 1
RESIDUAL_PROJECTIONS = ("attprojw", "fcprojw")
ADAM = OptimizerSpec("adam", beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)


def init_rule(config) -> InitRule:
    """llm.c's rule in Llama's layout: every matrix N(0, 0.02), the residual projections
    (attention output, MLP down) N(0, 0.02/sqrt(2L)), every RMSNorm weight 1."""
    residual = INIT_STD / math.sqrt(2 * config.num_layers)
    ones = tuple(name for name, _ in config.tensor_shapes() if name in NORM_WEIGHTS)
    stds = {name: (residual if name in RESIDUAL_PROJECTIONS else INIT_STD)
            for name, _ in config.tensor_shapes() if name not in ones}
    return InitRule(stds=stds, ones=ones)


FAMILY = ModelFamily(
    name="llama3",
    title="Llama 3",
    config_type=Llama3Config,
    magic=checkpoint.LLAMA3_MAGIC,
    tokenizer="llama3",
    optimizer=ADAM,
    decode_header=checkpoint.decode_header,
    encode_header=checkpoint.encode_header,
    fp32_version=checkpoint.VERSION_FP32,
    bf16_version=None,
    init_rule=init_rule,
    hf=hf.ADAPTER,
    reference="lockstep.models.llama3.model:Llama3",
)

# The tiny shape keeps the real vocabulary: InfiniTrain's llama3 hard-codes sizes that need
# V >= 128,256 (docs/reference/infinitrain.md#known-facts-infinitrain-b24d92f). L=4 lets PP=2 x VPP=2 split it.
SHAPES = (
    ModelShape("llama3", "llama3", Llama3Config(), "Llama 3.2 1B shape (L16 NH32 kv8 C2048 FFN 8192)"),
    ModelShape("llama3-tiny", "llama3",
               Llama3Config(max_seq_len=1024, num_layers=4, num_heads=8, num_kv_heads=4, channels=128),
               "Llama 3 L4 NH8 kv4 C128 (real vocabulary), for CPUs"),
)
