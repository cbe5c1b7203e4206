"""LoRA on lockstep's reference models, as InfiniTrain trains it (docs/reference/lora.md).

`apply_lora` replaces every `nn.Linear` of the model whose path a target names (InfiniTrain's
suffix rule, cases/lora_targets.py) by a `LoRALinear` that keeps the base layer's own weight
and bias parameters (so the model's LLMC names and state dict are unchanged) and adds `lora_A`
`[rank, in]` and `lora_B` `[out, rank]`: y = W x + b + (alpha / rank) · B (A x), not merged, no
dropout. Everything but the adapters is frozen.

`lora_init` is the one initialisation every framework starts from: A Kaiming-uniform (bound
1/√in, InfiniTrain's and peft's rule) from a `torch.Generator` seeded with the run's seed, B
zeros; `write_lora_file` writes it in InfiniTrain's `--lora_load_path` format.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lockstep.cases.lora_targets import target_matches
from lockstep.cases.spec import LoraSpec
from lockstep.errors import CaseError, FormatError
from lockstep.fsutil import atomic_write, read_bytes

LORA_MAGIC = 0x4C4F5241  # lora_utils.cc, SaveLoRAWeights
LORA_VERSION = 1
# InfiniTrain's module paths are the reference's under `transformer.` (transformer.h.0.attn.c_attn).
INFINITRAIN_PREFIX = "transformer."


class LoRALinear(nn.Linear):
    """A linear layer with a LoRA branch; `weight` and `bias` are the base layer's parameters."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.rank, self.alpha = rank, alpha
        self.scale = alpha / rank
        dev = base.weight.device
        self.lora_A = nn.Parameter(torch.zeros(rank, base.in_features, dtype=torch.float32, device=dev))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=torch.float32, device=dev))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.weight, self.bias)
        # (B (A x)) · scale: one rounding per product, in peft's order
        return base + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale


@dataclass(frozen=True)
class LoraAdapters:
    """The adapted layers by the reference's module path, in module order."""

    layers: dict[str, LoRALinear]

    def parameters(self) -> list[nn.Parameter]:
        """What the optimizer trains: A then B of each layer in module order (lora_utils.cc's order)."""
        return [p for layer in self.layers.values() for p in (layer.lora_A, layer.lora_B)]

    def state(self) -> dict[str, torch.Tensor]:
        """Every adapter tensor under InfiniTrain's state-dict name (transformer.h.0.attn.c_attn.lora_A)."""
        out = {}
        for path, layer in self.layers.items():
            out[f"{INFINITRAIN_PREFIX}{path}.lora_A"] = layer.lora_A
            out[f"{INFINITRAIN_PREFIX}{path}.lora_B"] = layer.lora_B
        return out

    def load(self, tensors: dict[str, np.ndarray], source: str) -> None:
        """Copy A and B in from `tensors` (InfiniTrain names); every adapter must be there with its shape."""
        for name, param in self.state().items():
            if name not in tensors:
                raise FormatError(source, f"has no {name}, which the case's LoRA needs")
            value = torch.as_tensor(np.asarray(tensors[name]), dtype=torch.float32)
            if tuple(value.shape) != tuple(param.shape):
                raise FormatError(source, f"{name} has shape {list(value.shape)}, the adapter {list(param.shape)}")
            with torch.no_grad():
                param.copy_(value)
        extra = sorted(set(tensors) - set(self.state()))
        if extra:
            raise FormatError(source, f"holds {extra[0]}, which no adapter of the case has")


def apply_lora(model: nn.Module, spec: LoraSpec) -> LoraAdapters:
    """Adapt the model's targeted linear layers in place and freeze everything else. CaseError
    when a target names no linear layer (InfiniTrain would silently adapt nothing)."""
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and not isinstance(module, LoRALinear)
               and any(target_matches(t, name) for t in spec.target_modules)]
    unmatched = [t for t in spec.target_modules if not any(target_matches(t, name) for name, _ in targets)]
    if unmatched:
        raise CaseError(f"LoRA target(s) {', '.join(unmatched)} name no linear layer of the model")
    for p in model.parameters():
        p.requires_grad_(False)
    layers = {}
    for name, base in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = LoRALinear(base, spec.rank, spec.alpha)
        setattr(parent, attr, layer)
        layers[name] = layer
    return LoraAdapters(layers)


def lora_init(adapters: LoraAdapters, seed: int) -> dict[str, np.ndarray]:
    """The LoRA init every framework starts from, by InfiniTrain name: each A in module order
    uniform in ±1/√in from one generator seeded with `seed`, each B zeros; also copied into the
    adapters."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for path, layer in adapters.layers.items():
        bound = 1.0 / math.sqrt(layer.in_features)
        a = (torch.rand(layer.lora_A.shape, generator=gen, dtype=torch.float32) * 2 - 1) * bound
        out[f"{INFINITRAIN_PREFIX}{path}.lora_A"] = a.numpy()
        out[f"{INFINITRAIN_PREFIX}{path}.lora_B"] = np.zeros(tuple(layer.lora_B.shape), dtype=np.float32)
    adapters.load(out, f"lora_init(seed={seed})")
    return out


def lora_file_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    """InfiniTrain's LoRA weights file (lora_utils.cc:309-351): uint32 magic, version, count; per
    tensor uint32 name length, name, uint32 ndim, int64 dims, FP32 values; little-endian."""
    parts = [struct.pack("<III", LORA_MAGIC, LORA_VERSION, len(tensors))]
    for name, a in tensors.items():
        a = np.asarray(a, dtype="<f4")
        raw = name.encode()
        parts.append(struct.pack("<I", len(raw)) + raw + struct.pack("<I", a.ndim) + struct.pack(f"<{a.ndim}q", *a.shape)
                     + a.tobytes())
    return b"".join(parts)


def write_lora_file(path: str | os.PathLike, tensors: dict[str, np.ndarray]) -> None:
    with atomic_write(path, "wb", what="LoRA weights") as f:
        f.write(lora_file_bytes(tensors))


def read_lora_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of an InfiniTrain LoRA weights file; FormatError naming the first problem."""
    data = read_bytes(path, "LoRA weights file")
    if len(data) < 12:
        raise FormatError(path, f"truncated: {len(data)} bytes, too short for a LoRA weights header (12)")
    magic, version, count = struct.unpack_from("<III", data, 0)
    if magic != LORA_MAGIC:
        raise FormatError(path, f"wrong magic number {magic:#x} for InfiniTrain LoRA weights (expected {LORA_MAGIC:#x})")
    if version != LORA_VERSION:
        raise FormatError(path, f"unsupported LoRA weights version {version} (supported: {LORA_VERSION})")
    pos, out = 12, {}
    for i in range(count):
        try:
            (n,) = struct.unpack_from("<I", data, pos)
            name = data[pos + 4 : pos + 4 + n].decode()
            pos += 4 + n
            (ndim,) = struct.unpack_from("<I", data, pos)
            dims = struct.unpack_from(f"<{ndim}q", data, pos + 4)
            pos += 4 + 8 * ndim
        except (struct.error, UnicodeDecodeError):
            raise FormatError(path, f"truncated or damaged in tensor #{i + 1} of {count}'s entry") from None
        nbytes = 4 * math.prod(dims)
        if pos + nbytes > len(data):
            raise FormatError(path, f"truncated: tensor {name} needs {nbytes} bytes, but the file ends early")
        out[name] = np.frombuffer(data, dtype="<f4", count=math.prod(dims), offset=pos).reshape(dims).copy()
        pos += nbytes
    if pos != len(data):
        raise FormatError(path, f"{len(data) - pos} trailing bytes after {count} tensors")
    return out
