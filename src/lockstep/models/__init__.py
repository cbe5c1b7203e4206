"""Model families and the shapes registered for them: the one table the rest of lockstep reads.

`FAMILIES` maps a family name (gpt2, llama3, qwen3, mixtral) to its `ModelFamily`; `SHAPES` maps a model
name (gpt2, gpt2-tiny, llama3, llama3-tiny, qwen3-1.7b, ...) to a `ModelShape`. Nothing outside
`models/` and the runners' per-family adapters names a family.
"""

from __future__ import annotations

import os

from lockstep.errors import FormatError, LockstepError
from lockstep.formats import llmc
from lockstep.models import gpt2, llama3, mixtral, qwen3
from lockstep.models.family import ModelFamily, ModelShape

FAMILIES: dict[str, ModelFamily] = {f.FAMILY.name: f.FAMILY for f in (gpt2, llama3, qwen3, mixtral)}
SHAPES: dict[str, ModelShape] = {s.name: s for f in (gpt2, llama3, qwen3, mixtral) for s in f.SHAPES}
# The shape a CPU-only machine trains when a case names a shape too large for it and the user
# gave neither --model nor --llmc.
CPU_SHAPES: dict[str, str] = {"gpt2": "gpt2-tiny", "llama3": "llama3-tiny", "qwen3": "qwen3-tiny",
                             "mixtral": "mixtral-tiny"}


def family(name: str) -> ModelFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise LockstepError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}") from None


def model_shape(name: str) -> ModelShape:
    try:
        return SHAPES[name]
    except KeyError:
        raise LockstepError(f"unknown model {name!r}; known models: {', '.join(SHAPES)}") from None


def family_of_config(config) -> ModelFamily:
    return family(config.family)


def family_of_checkpoint(path: str | os.PathLike) -> ModelFamily:
    """The family whose LLMC magic number the file starts with."""
    header, _ = llmc.read_header(path)
    magic = int(header[0])
    for fam in FAMILIES.values():
        if fam.magic == magic:
            return fam
    known = ", ".join(f"{f.magic} ({f.title})" for f in FAMILIES.values())
    raise FormatError(path, f"unknown checkpoint magic number {magic}; known: {known}")


def read_checkpoint_layout(path: str | os.PathLike) -> tuple[ModelFamily, llmc.CheckpointLayout]:
    """Identify, decode and size-check an LLMC checkpoint of any family (tensors not read)."""
    fam = family_of_checkpoint(path)
    return fam, fam.read_layout(path)


def load_checkpoint(path: str | os.PathLike) -> llmc.LLMCCheckpoint:
    return family_of_checkpoint(path).load(path)


def config_from_dict(d: dict):
    """A family config back from its `to_dict()` (e.g. a worker's copy of the planned model)."""
    return family(d["family"]).config_type.from_dict(d)
