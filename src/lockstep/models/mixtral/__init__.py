"""Mixtral-style MoE: Llama 3's attention, 8 SwiGLU experts, top-2 router, untied head, Adam
(docs/reference/mixtral.md); InfiniTrain's `feat/support_moe` tiny_mixtral checkpoint layout."""

from __future__ import annotations

import math

from lockstep.models.family import InitRule, ModelFamily, ModelShape
from lockstep.models.llama3 import ADAM, INIT_STD
from lockstep.models.mixtral import checkpoint, hf
from lockstep.models.mixtral.config import MixtralConfig


def init_rule(config: MixtralConfig) -> InitRule:
    """Llama 3's rule (models/llama3): every matrix N(0, 0.02), router included; the residual
    projections (attention output, every expert's down) N(0, 0.02/sqrt(2L)); RMSNorm weights 1."""
    residual = INIT_STD / math.sqrt(2 * config.num_layers)
    names = [name for name, _ in config.tensor_shapes()]
    ones = tuple(n for n in names if n == "lnfw" or n.startswith(("ln1w[", "ln2w[")))
    stds = {n: (residual if n.startswith("attprojw[") or ".fcprojw[" in n else INIT_STD)
            for n in names if n not in ones}
    return InitRule(stds=stds, ones=ones)


FAMILY = ModelFamily(
    name="mixtral",
    title="Mixtral",
    config_type=MixtralConfig,
    magic=checkpoint.MIXTRAL_MAGIC,
    tokenizer="llama3",  # tiny_mixtral trains on Llama 3 token ids (its config.h)
    optimizer=ADAM,  # tiny_mixtral's main.cc: Adam at the case's lr (b7e0760 switched it from SGD)
    decode_header=checkpoint.decode_header,
    encode_header=checkpoint.encode_header,
    fp32_version=checkpoint.VERSION_FP32,
    bf16_version=None,
    init_rule=init_rule,
    hf=hf.ADAPTER,
    reference="lockstep.models.mixtral.model:Mixtral",
    cpu_shape="mixtral-tiny",
)

# tiny_mixtral's binary accepts its own shape only (its CheckLLMCConfig compares every header
# word with config.h); mixtral-tiny is for CPUs (reference, megatron-core).
SHAPES = (
    ModelShape("mixtral-l32-c512", "mixtral", MixtralConfig(),
               "InfiniTrain tiny_mixtral's shape (L32 NH4 kv1 C512 E8 top-2 F1792), one GPU"),
    ModelShape("mixtral-tiny", "mixtral",
               MixtralConfig(max_seq_len=1024, num_layers=2, num_heads=4, num_kv_heads=1, channels=64,
                             moe_ffn_hidden_size=224),
               "Mixtral L2 NH4 kv1 C64 E8 top-2 F224 (real vocabulary), for CPUs"),
)
