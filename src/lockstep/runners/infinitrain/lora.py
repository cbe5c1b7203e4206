"""LoRA cases on InfiniTrain: its `--lora_*` flags, lockstep's one LoRA init handed to it as a
`--lora_load_path` file, and the check of its log that the load took (docs/reference/lora.md).

InfiniTrain's own draw of A is not portable to another framework (lora.md, "Seeding"), so every
LoRA case loads lockstep's init. Its loader copies each tensor of the file into the parameter of
that name and only warns for a name the model does not have; a parameter the file lacks keeps
InfiniTrain's own draw, without a word. Both are failures of the case here: the log must have
no "not found" warning, and InfiniTrain must optimise exactly the tensors the file holds.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from lockstep.cases.spec import CaseSpec, LoraSpec
from lockstep.errors import RunError

LORA_INIT_SUFFIX = ".lora_init.bin"

# lora_utils.cc LoadLoRAWeights (b24d92f): a file tensor the model has no parameter of.
_NOT_FOUND = re.compile(r"LoRA parameter not found in model: (\S+)")
# example/gpt2/main.cc:267, example/llama3/main.cc: the optimizer's parameter count under LoRA.
_OPTIMIZING = re.compile(r"Optimizing (\d+) LoRA parameters")


def lora_flags(spec: LoraSpec, init_file: Path) -> list[str]:
    return ["--lora_rank", str(spec.rank), "--lora_alpha", repr(float(spec.alpha)),
            "--lora_target_modules", ",".join(spec.target_modules), "--lora_load_path", str(init_file)]


def infinitrain_lora_init(case: CaseSpec, family: str, config, seed: int) -> dict[str, np.ndarray]:
    """The case's one LoRA init (models/lora.py `lora_init_tensors`, the tensors every runner loads)
    under InfiniTrain's names (transformer.h.0.attn.c_attn.lora_A), A before B per layer in module
    order. CaseError when a target names no linear layer."""
    from lockstep.models.lora import infinitrain_lora_name, lora_init_tensors

    return {infinitrain_lora_name(name): a for name, a in lora_init_tensors(family, config, case.lora, seed).items()}


def canonical_adapters(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The LoRA tensors of an InfiniTrain state dict under lockstep's canonical names
    (transformer.h.3.attn.c_attn.lora_A -> lora_A.qkvw[3]), as the other runners' final parameters
    carry them; every other tensor is left out."""
    from lockstep.models.lora import INFINITRAIN_PREFIX, LORA_PARTS, canonical_lora_name

    out = {}
    for name, a in state.items():
        module, _, part = name.rpartition(".")
        if part in LORA_PARTS and module.startswith(INFINITRAIN_PREFIX):
            out[canonical_lora_name(part, module[len(INFINITRAIN_PREFIX):])] = a
    return out


def write_lora_init(case: CaseSpec, family: str, config, seed: int, dest_dir: Path) -> tuple[Path, int]:
    """`<case>.lora_init.bin` in dest_dir (InfiniTrain's LoRA weights format) of the init drawn with
    `seed` (RunInputs.lora_seed); its path and how many tensors it holds."""
    from lockstep.models.lora import write_lora_file

    tensors = infinitrain_lora_init(case, family, config, seed)
    path = Path(dest_dir) / f"{case.name}{LORA_INIT_SUFFIX}"
    write_lora_file(path, tensors)
    return path, len(tensors)


def check_lora_loaded(text: str, log_path: Path, init_file: Path, tensors: int) -> None:
    """RunError unless InfiniTrain's log shows the whole init taken: no name of the file unknown to
    the model, and the optimizer training exactly the file's `tensors` adapter tensors (one more
    would be an adapter still holding InfiniTrain's own draw)."""
    missing = _NOT_FOUND.findall(text)
    if missing:
        raise RunError(f"{log_path}: InfiniTrain did not load lockstep's LoRA init {init_file}: its model has no "
                       f"parameter {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    counts = {int(n) for n in _OPTIMIZING.findall(text)}
    if not counts:
        raise RunError(f"{log_path}: InfiniTrain's log does not say how many LoRA parameters it trains "
                       "(no 'Optimizing N LoRA parameters' line), so the load of lockstep's init cannot be checked")
    if counts != {tensors}:
        other = sorted(counts - {tensors})[0]
        raise RunError(f"{log_path}: InfiniTrain trains {other} LoRA tensors but "
                       f"lockstep's init {init_file} holds {tensors}: some adapters kept InfiniTrain's own draw")
