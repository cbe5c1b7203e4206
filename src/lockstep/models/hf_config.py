"""Reading a Hugging Face config.json's fields, shared by the families' adapters (`models/*/hf.py`).

Each reader raises a FormatError naming config.json and the key, so that a missing or mistyped
field is one sentence, not a KeyError. RoPE settings are read from both spellings Transformers
has written: `rope_theta` / `rope_scaling` at the top level (4.x, every Hub checkpoint of
2024-2025) and `rope_parameters` (5.x).
"""

from __future__ import annotations

import os
from typing import Any

from lockstep.errors import FormatError

_MISSING = object()


def hf_int(cfg: dict, key: str, path: str | os.PathLike, default: Any = _MISSING) -> int:
    value = cfg.get(key, default)
    if value is _MISSING:
        raise FormatError(path, f"has no {key}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(path, f"{key} is {value!r}, not an integer")
    return value


def hf_float(cfg: dict, key: str, path: str | os.PathLike, default: Any = _MISSING) -> float:
    value = cfg.get(key, default)
    if value is _MISSING:
        raise FormatError(path, f"has no {key}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FormatError(path, f"{key} is {value!r}, not a number")
    return float(value)


def require(cfg: dict, key: str, allowed: tuple, path: str | os.PathLike, default: Any, why: str) -> Any:
    """A field whose other values the LLMC format (or lockstep's reference) cannot express."""
    value = cfg.get(key, default)
    if value not in allowed:
        shown = " or ".join(repr(a) for a in allowed)
        raise FormatError(path, f"{key} is {value!r}; {why} needs {shown}")
    return value


def rope_parameters(cfg: dict) -> dict:
    """RoPE settings merged from both spellings: rope_theta, rope_type and the scaling fields."""
    merged: dict = {}
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict):
        merged.update(scaling)
        if "type" in scaling and "rope_type" not in scaling:  # the older key
            merged["rope_type"] = scaling["type"]
    if "rope_theta" in cfg:
        merged["rope_theta"] = cfg["rope_theta"]
    params = cfg.get("rope_parameters")
    if isinstance(params, dict):
        merged.update(params)
    return merged


def rope_theta(cfg: dict, path: str | os.PathLike, default: float) -> float:
    return hf_float(rope_parameters(cfg), "rope_theta", path, default)


def rope_type(cfg: dict) -> str:
    """"default" when config.json does not scale RoPE."""
    value = rope_parameters(cfg).get("rope_type")
    return "default" if value in (None, "default") else str(value)


def head_dim_problem(cfg: dict, channels: int, heads: int, path: str | os.PathLike) -> None:
    """LLMC derives head_dim as C/NH; a checkpoint whose heads are wider or narrower cannot be written."""
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim != channels // heads:
        raise FormatError(path, f"head_dim is {head_dim} but hidden_size/num_attention_heads is "
                                f"{channels}/{heads} = {channels // heads}; the LLMC format derives head_dim "
                                "as C/NH, so this model has no LLMC form")
