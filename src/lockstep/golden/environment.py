"""The environment golden values were recorded in, and what of it changed since.

Golden values drift with a driver, CUDA, torch or megatron-core update, a rebuilt framework or a
new lockstep; a check that fails says which of these moved since the values were recorded, so a
refresh (`golden record --update`) is a decision about a known change, not a guess
(docs/reference/golden.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from lockstep.formats.run_record import RunRecord
from lockstep.history.keys import case_inputs_sha256

# (key in the golden file, how a person names it); the order a change is said in.
SHARED_KEYS = (("device", "device"), ("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch"),
               ("megatron_core", "megatron-core"), ("lockstep_commit", "lockstep commit"),
               ("case_inputs", "the case's inputs"))
# Only compared when the checked record is of the framework the golden values came from: another
# framework's commit differs by nature.
FRAMEWORK_KEYS = (("framework_commit", "commit"), ("build_flags", "build flags"))

# CMakeCache.txt entries that change what an InfiniTrain build computes.
BUILD_FLAG_KEYS = ("CMAKE_BUILD_TYPE", "CMAKE_CXX_FLAGS", "CMAKE_CUDA_FLAGS", "CMAKE_CUDA_ARCHITECTURES",
                   "CMAKE_CXX_COMPILER", "CMAKE_CUDA_COMPILER", "USE_CUDA", "USE_NCCL", "USE_OMP")


def build_flags(build_dir: str | None) -> str | None:
    """The build's configuration from its CMakeCache.txt, as KEY=VALUE lines, or None where the
    build dir is not at hand (a record read on another machine)."""
    if not build_dir:
        return None
    try:
        lines = (Path(build_dir) / "CMakeCache.txt").read_text(errors="replace").splitlines()
    except OSError:
        return None
    flags = {}
    for line in lines:
        name, _, value = line.partition("=")
        key = name.split(":", 1)[0]
        if key in BUILD_FLAG_KEYS:
            flags[key] = value.strip()
    return " ".join(f"{k}={flags[k]}" for k in sorted(flags)) or None


def _framework_commit(record: RunRecord) -> str | None:
    meta = record.meta
    if meta.get("infinitrain_commit"):
        return meta["infinitrain_commit"]
    if record.framework in ("pytorch", "megatron"):  # lockstep's own trainer, or a PyPI package it drives
        return meta.get("lockstep_commit")
    return meta.get("framework_commit")


def environment_of(record: RunRecord) -> dict[str, str | None]:
    """What a record says about where and with what it ran."""
    meta = record.meta
    flags = meta.get("infinitrain_build_flags") or build_flags(meta.get("infinitrain_build"))
    return {
        "framework": record.framework,
        "device": meta.get("device_name") or meta.get("device"),
        "driver": meta.get("driver_version"),
        "cuda": meta.get("cuda_version"),
        "torch": meta.get("torch_version"),
        "megatron_core": meta.get("megatron_core_version"),
        "lockstep_commit": meta.get("lockstep_commit"),
        "case_inputs": case_inputs_sha256(meta),
        "framework_commit": _framework_commit(record),
        "build_flags": hashlib.sha256(flags.encode()).hexdigest()[:12] + f" ({flags})" if flags else None,
    }


def _short(key: str, value: str) -> str:
    if key in ("case_inputs", "lockstep_commit", "framework_commit") and len(value) > 12:
        return value[:12]
    return value


def changes(recorded: dict | None, now: dict) -> list[str]:
    """'driver 580.65 -> 590.10', one per key that both sides state and that differs."""
    if not recorded:
        return []
    keys = list(SHARED_KEYS)
    if recorded.get("framework") and recorded.get("framework") == now.get("framework"):
        keys += [(k, f"{now['framework']} {label}") for k, label in FRAMEWORK_KEYS]
    out = []
    for key, label in keys:
        a, b = recorded.get(key), now.get(key)
        if a and b and a != b:
            out.append(f"{label} {_short(key, str(a))} -> {_short(key, str(b))}")
    return out


def changes_sentence(recorded: dict | None, now: dict) -> str:
    """'driver 580 -> 590 and megatron-core 0.19.2 -> 0.20.0 since the golden values were recorded'."""
    if not recorded:
        return "the golden file does not record its environment (golden record --update records it)"
    said = changes(recorded, now)
    if not said:
        return "nothing of the recorded environment changed"
    joined = said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]
    return f"{joined} since the golden values were recorded"
