"""megatron-core's pipeline layout strings (`pipeline_model_parallel_layout`), read without megatron.

A layout lists the pipeline chunks in order, `|` between them: chunk i of PP x VPP chunks is
virtual stage i // PP of pipeline rank i % PP (megatron-core's order). In a chunk, `E` is the
embedding, `t` one transformer layer, `L` the loss (final norm and output layer); `x*n`
repeats x, `(...)*n` repeats a group, commas are cosmetic. So `Et*5|t*5|t*4L` is three stages
of 5, 5 and 4 layers with the embedding on the first and the loss on the last. Parsed here so
that a case's layout is checked before any framework starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lockstep.errors import CaseError

_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_REPEAT = re.compile(r"(.)\*(\d+)")


@dataclass(frozen=True)
class LayoutStage:
    layers: int  # transformer layers in the chunk
    embedding: bool
    loss: bool


def parse_pipeline_layout(layout: str, where: str = "pp_layout") -> list[LayoutStage]:
    """The chunks of a layout, in megatron-core's order; CaseError for anything megatron would refuse."""
    text = layout.replace(",", "")
    text = _GROUP.sub(lambda m: m.group(1) * int(m.group(2)), text)
    text = _REPEAT.sub(lambda m: m.group(1) * int(m.group(2)), text)
    stages = []
    for chunk in text.split("|"):
        bad = sorted(set(chunk) - set("EtL"))
        if bad:
            raise CaseError(f"{where}: pp_layout {layout!r} holds {bad[0]!r}; lockstep reads E (embedding), "
                            f"t (transformer layer) and L (loss), with x*n and (...)*n repeats")
        stages.append(LayoutStage(layers=chunk.count("t"), embedding="E" in chunk, loss="L" in chunk))
    if text.count("E") != 1 or not stages[0].embedding or not text.startswith("E"):
        raise CaseError(f"{where}: pp_layout {layout!r} must start with the embedding E, once")
    if text.count("L") != 1 or not stages[-1].loss or not text.endswith("L"):
        raise CaseError(f"{where}: pp_layout {layout!r} must end with the loss L, once")
    return stages
