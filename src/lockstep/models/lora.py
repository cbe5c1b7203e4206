"""LoRA on lockstep's reference models, as InfiniTrain trains it (docs/reference/lora.md).

`apply_lora` replaces every `nn.Linear` of the model whose path a target names (InfiniTrain's
suffix rule, cases/lora_targets.py) by a `LoRALinear` that keeps the base layer's own weight
and bias parameters (so the model's LLMC names and state dict are unchanged) and adds `lora_A`
`[rank, in]` and `lora_B` `[out, rank]`: y = W x + b + (alpha / rank) · B (A x), not merged, no
dropout. Everything but the adapters is frozen.

`lora_init_tensors` is the one initialisation every framework starts from, a pure function of
(family, model config, LoraSpec, seed): A Kaiming-uniform (bound 1/√in, InfiniTrain's and peft's
rule) from one `torch.Generator` seeded with the run's seed, drawn in module order, B zeros;
every runner calls it and loads the same tensors (`lora_init` draws the same for adapters already
applied). `write_lora_file` writes it in InfiniTrain's `--lora_load_path` format.

Canonical names (captures, final parameters, the certificate): `lora_A.qkvw[3]` / `lora_B.qkvw[3]`
are the adapter of the linear layer whose weight is LLMC `qkvw[3]` (layer 3's attn.c_attn).
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

from lockstep.cases.lora_targets import (BASE_WEIGHT, LORA_PARTS, canonical_lora_name, is_lora_name,  # noqa: F401
                                          parse_lora_name, target_matches)
from lockstep.cases.spec import LoraSpec
from lockstep.errors import CaseError, FormatError
from lockstep.fsutil import atomic_write, read_bytes

LORA_MAGIC = 0x4C4F5241  # lora_utils.cc, SaveLoRAWeights
LORA_VERSION = 1
# InfiniTrain's module paths are the reference's under `transformer.` (transformer.h.0.attn.c_attn).
INFINITRAIN_PREFIX = "transformer."


def infinitrain_lora_name(name: str) -> str:
    """`lora_A.qkvw[3]` -> `transformer.h.3.attn.c_attn.lora_A` (InfiniTrain's state-dict name)."""
    part, base, layer = parse_lora_name(name)
    module = next(m for m, w in BASE_WEIGHT.items() if w == base)
    return f"{INFINITRAIN_PREFIX}h.{layer}.{module}.{part}"


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

    def canonical(self) -> dict[str, nn.Parameter]:
        """Every adapter tensor under its canonical name (lora_A.qkvw[0]), A then B per layer."""
        return {canonical_lora_name(part, path): getattr(layer, part)
                for path, layer in self.layers.items() for part in LORA_PARTS}

    def load_canonical(self, tensors: dict[str, np.ndarray], source: str) -> None:
        """`load` from tensors under canonical names (`lora_init_tensors`)."""
        self.load({infinitrain_lora_name(n): v for n, v in tensors.items()}, source)

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


def lora_targets(model: nn.Module, spec: LoraSpec) -> list[tuple[str, nn.Linear]]:
    """The model's linear layers the spec's targets name, by module path, in module order."""
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and not isinstance(module, LoRALinear)
            and any(target_matches(t, name) for t in spec.target_modules)]


def apply_lora(model: nn.Module, spec: LoraSpec) -> LoraAdapters:
    """Adapt the model's targeted linear layers in place and freeze everything else. CaseError
    when a target names no linear layer (InfiniTrain would silently adapt nothing)."""
    targets = lora_targets(model, spec)
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


def _draw(layers: list[tuple[str, int, int]], rank: int, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(path, in, out) in module order -> (A, B): each A uniform in ±1/√in from one generator
    seeded with `seed`, in that order; each B zeros."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for path, fan_in, fan_out in layers:
        bound = 1.0 / math.sqrt(fan_in)
        a = (torch.rand((rank, fan_in), generator=gen, dtype=torch.float32) * 2 - 1) * bound
        out[path] = (a.numpy(), np.zeros((fan_out, rank), dtype=np.float32))
    return out


def lora_init(adapters: LoraAdapters, seed: int) -> dict[str, np.ndarray]:
    """The LoRA init every framework starts from, by InfiniTrain name (the same draws as
    `lora_init_tensors`), also copied into the adapters."""
    layers = [(path, layer.in_features, layer.out_features) for path, layer in adapters.layers.items()]
    rank = next(iter(adapters.layers.values())).rank if adapters.layers else 1
    out = {}
    for path, (a, b) in _draw(layers, rank, seed).items():
        out[f"{INFINITRAIN_PREFIX}{path}.lora_A"] = a
        out[f"{INFINITRAIN_PREFIX}{path}.lora_B"] = b
    adapters.load(out, f"lora_init(seed={seed})")
    return out


def lora_init_tensors(family: str, config, spec: LoraSpec, seed: int) -> dict[str, np.ndarray]:
    """The one LoRA init of a case, under canonical names (lora_A.qkvw[0], lora_B.qkvw[0], ...):
    a pure function of the model's family and config, the spec and the seed, so that every runner
    (and every rank) makes the same tensors without reading anything. The shapes come from the
    family's reference module built on the meta device (no memory, no values)."""
    from lockstep.models import family as model_family

    with torch.device("meta"):
        model = model_family(family).reference_class()(config)
    targets = lora_targets(model, spec)
    unmatched = [t for t in spec.target_modules if not any(target_matches(t, name) for name, _ in targets)]
    if unmatched:
        raise CaseError(f"LoRA target(s) {', '.join(unmatched)} name no linear layer of the model")
    drawn = _draw([(name, m.in_features, m.out_features) for name, m in targets], spec.rank, seed)
    out = {}
    for path, (a, b) in drawn.items():
        out[canonical_lora_name("lora_A", path)] = a
        out[canonical_lora_name("lora_B", path)] = b
    return out


def lora_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The adapters applied to a reference model, under canonical names, A then B per layer in
    module order (empty when the model has none)."""
    return {canonical_lora_name(part, path): getattr(m, part)
            for path, m in model.named_modules() if isinstance(m, LoRALinear) for part in LORA_PARTS}


def canonical_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Every parameter of a reference model under its canonical name: LLMC's, then the adapters'."""
    return model.llmc_parameters() | lora_parameters(model)


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
