"""GPT-2: LayerNorm, tanh GELU, learned positions, tied wte/lm_head, SGD
(docs/reference/training-contract.md#model-math)."""

from __future__ import annotations

import math

from lockstep.models.family import InitRule, ModelFamily, ModelShape, OptimizerSpec
from lockstep.models.gpt2 import checkpoint, hf
from lockstep.models.gpt2.config import GPT2Config

INIT_STD = 0.02


def init_rule(config: GPT2Config) -> InitRule:
    """llm.c's `gpt2_build_from_random`: N(0, 0.02), the two projections back into the residual
    stream N(0, 0.02/sqrt(2L)), LayerNorm weights 1, biases 0, wte padding rows 0."""
    residual = INIT_STD / math.sqrt(2 * config.num_layers)
    stds = {"wte": INIT_STD, "wpe": INIT_STD, "qkvw": INIT_STD, "attprojw": residual, "fcw": INIT_STD,
            "fcprojw": residual}
    return InitRule(stds=stds, ones=("ln1w", "ln2w", "lnfw"), drawn_rows={"wte": config.vocab_size})


FAMILY = ModelFamily(
    name="gpt2",
    title="GPT-2",
    config_type=GPT2Config,
    magic=checkpoint.GPT2_MAGIC,
    tokenizer="gpt2",
    optimizer=OptimizerSpec("sgd"),
    decode_header=checkpoint.decode_header,
    encode_header=checkpoint.encode_header,
    fp32_version=checkpoint.VERSION_FP32,
    bf16_version=checkpoint.VERSION_BF16,
    init_rule=init_rule,
    hf=hf.ADAPTER,
    reference="lockstep.models.gpt2.model:GPT2",
    padding_rows=lambda config: {"wte": config.vocab_size},
)

# gpt2-tiny keeps NH=12: InfiniTrain's GPT-2 loader rejects any other head count
# (docs/reference/infinitrain.md#known-facts-infinitrain-b24d92f), and C=96 keeps a CPU step well under a second.
SHAPES = (
    ModelShape("gpt2", "gpt2", GPT2Config(), "GPT-2 124M"),
    ModelShape("gpt2-tiny", "gpt2", GPT2Config(num_layers=2, num_heads=12, channels=96), "GPT-2 L2 NH12 C96, for CPUs"),
)
