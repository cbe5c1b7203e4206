"""Which linear layers a LoRA target names, per model family, by InfiniTrain's module paths.

InfiniTrain applies an adapter to every linear module whose path ends in a target at a `.`
boundary (infini_train/src/nn/lora/lora_config.cc, ShouldApplyLoRA): `c_proj` is both
`attn.c_proj` and `mlp.c_proj`, `attn.c_proj` only the attention's (docs/reference/lora.md).
No torch here: the case loader checks targets before anything runs.
"""

from __future__ import annotations

import re

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


# Canonical names of the adapters (captures, final parameters, the certificate): `lora_A.qkvw[3]`
# is the A of the adapter on the linear whose weight is LLMC `qkvw[3]` (layer 3's attn.c_attn).
BASE_WEIGHT = {"attn.c_attn": "qkvw", "attn.c_proj": "attprojw", "mlp.c_fc": "fcw", "mlp.c_fc2": "fcw2",
               "mlp.c_proj": "fcprojw"}
LINEAR_OF = {w: m for m, w in BASE_WEIGHT.items()}
LORA_PARTS = ("lora_A", "lora_B")
_CANONICAL_LORA = re.compile(r"^(lora_[AB])\.([a-z0-9]+)\[(\d+)\]$")


def canonical_lora_name(part: str, module_path: str) -> str:
    """`lora_A`, `h.3.attn.c_attn` -> `lora_A.qkvw[3]`."""
    head, layer, rest = module_path.split(".", 2)
    if head != "h" or rest not in BASE_WEIGHT:
        raise ValueError(f"{module_path} is not a block linear LoRA can adapt")
    return f"{part}.{BASE_WEIGHT[rest]}[{int(layer)}]"


def is_lora_name(name: str) -> bool:
    return name.startswith(LORA_PARTS)


def parse_lora_name(name: str) -> tuple[str, str, int] | None:
    """`lora_B.qkvw[3]` -> ("lora_B", "qkvw", 3); None for any other name."""
    m = _CANONICAL_LORA.match(name)
    return (m.group(1), m.group(2), int(m.group(3))) if m else None
