"""Which linear layers a LoRA target names, per model family, by InfiniTrain's module paths.

InfiniTrain applies an adapter to every linear module whose path ends in a target at a `.`
boundary (infini_train/src/nn/lora/lora_config.cc, ShouldApplyLoRA): `c_proj` is both
`attn.c_proj` and `mlp.c_proj`, `attn.c_proj` only the attention's (docs/reference/lora.md).
No torch here: the case loader checks targets before anything runs.
"""

from __future__ import annotations

# The linear layers of one transformer block, as InfiniTrain names them under transformer.h.<i>.
LORA_LINEARS: dict[str, tuple[str, ...]] = {
    "gpt2": ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
    "llama3": ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_fc2", "mlp.c_proj"),
    "qwen3": ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_fc2", "mlp.c_proj"),
}


def target_matches(target: str, module_path: str) -> bool:
    """InfiniTrain's rule: the path ends in the target, preceded by '.' or nothing."""
    if not module_path.endswith(target):
        return False
    start = len(module_path) - len(target)
    return start == 0 or module_path[start - 1] == "."


def adapted_linears(family: str, targets: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The block linears (LORA_LINEARS order) that any of the targets names."""
    return tuple(m for m in LORA_LINEARS.get(family, ()) if any(target_matches(t, m) for t in targets))


def unmatched_targets(family: str, targets: tuple[str, ...] | list[str]) -> list[str]:
    """Targets that name no linear layer of the family (InfiniTrain would silently adapt nothing)."""
    return [t for t in targets if not any(target_matches(t, m) for m in LORA_LINEARS.get(family, ()))]
