"""Reading a Hugging Face config.json's fields, shared by the families' adapters (`models/*/hf.py`).

Each reader raises a FormatError naming config.json and the key, so that a missing or mistyped
field is one sentence, not a KeyError. RoPE settings are read from both spellings Transformers
has written: `rope_theta` / `rope_scaling` at the top level (4.x, every Hub checkpoint of
2024-2025) and `rope_parameters` (5.x). A config.json holding both `rope_scaling` and
`rope_parameters` that disagree is refused: Transformers 5 loads such a file from `rope_scaling`
alone (its `convert_rope_params_to_dict`: `rope_scaling or rope_parameters`, theta then from the
top-level `rope_theta` or 10000), so a hand-edited `rope_parameters` there has no effect on the
model Transformers runs, and converting either reading would silently differ from one of them.
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


def rope_parameters(cfg: dict, path: str | os.PathLike | None = None) -> dict:
    """RoPE settings merged from both spellings: rope_theta, rope_type and the scaling fields.
    With `path`, a config.json whose two spellings disagree is a FormatError naming it."""
    if path is not None:
        check_rope_spellings(cfg, path)
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
    return hf_float(rope_parameters(cfg, path), "rope_theta", path, default)


def rope_type(cfg: dict, path: str | os.PathLike | None = None) -> str:
    """"default" when config.json does not scale RoPE."""
    value = rope_parameters(cfg, path).get("rope_type")
    return "default" if value in (None, "default") else str(value)


def _rope_reading(fields: dict, cfg: dict) -> dict:
    """One spelling's RoPE settings as Transformers completes them: "type" read as rope_type,
    rope_type "default" when absent, rope_theta from the top level when absent there."""
    out = dict(fields)
    if "type" in out:
        out.setdefault("rope_type", out.pop("type"))
    out.setdefault("rope_type", "default")
    if "rope_theta" in cfg:
        out.setdefault("rope_theta", cfg["rope_theta"])
    return out


def _rope_words(reading: dict) -> str:
    rest = ", ".join(f"{k} {v}" for k, v in sorted(reading.items()) if k != "rope_type")
    return f"{reading['rope_type']}{', ' + rest if rest else ''}"


def check_rope_spellings(cfg: dict, path: str | os.PathLike) -> None:
    scaling, params = cfg.get("rope_scaling"), cfg.get("rope_parameters")
    if not (isinstance(scaling, dict) and scaling and isinstance(params, dict) and params):
        return
    from_scaling, from_params = _rope_reading(scaling, cfg), _rope_reading(params, cfg)
    if from_scaling != from_params:
        raise FormatError(path, f"holds both rope_scaling ({_rope_words(from_scaling)}) and rope_parameters "
                                f"({_rope_words(from_params)}), which disagree; transformers loads the model from "
                                "rope_scaling and ignores rope_parameters, so remove the one that is wrong")


def head_dim_problem(cfg: dict, channels: int, heads: int, path: str | os.PathLike) -> None:
    """LLMC derives head_dim as C/NH; a checkpoint whose heads are wider or narrower cannot be written."""
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim != channels // heads:
        raise FormatError(path, f"head_dim is {head_dim} but hidden_size/num_attention_heads is "
                                f"{channels}/{heads} = {channels // heads}; the LLMC format derives head_dim "
                                "as C/NH, so this model has no LLMC form")
