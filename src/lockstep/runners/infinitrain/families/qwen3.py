"""InfiniTrain's `qwen3` example for the Qwen3 family: only some builds have one."""

from __future__ import annotations

from lockstep.runners.infinitrain.families.llama3 import Llama3Family

ADAPTER = Llama3Family("qwen3", "qwen3", optional=True,
                       missing_note="InfiniTrain b24d92f has none; its PR #208 adds one reading the v4 layout")
