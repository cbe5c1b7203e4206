"""What a model family is to lockstep: one `ModelFamily` per folder under `models/`.

A family (gpt2, llama3, qwen3) brings its config (built from its LLMC header), its LLMC
checkpoint codec, its seeded init rule, its reference module (plain PyTorch, one readable
file), the optimizer its training contract uses, and its Hugging Face layout (`hf.py`, for
`lockstep convert`). Its canonical tensor names are the LLMC names of its config's
`tensor_shapes()`; every runner maps to and from them. A *model* is a registered shape of a
family (`ModelShape`, e.g. gpt2-tiny) or a checkpoint's header.

Nothing here imports torch: the CLI and the run planner read families cheaply; the reference
module is imported only when something trains.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable

import numpy as np

from lockstep.errors import FormatError
from lockstep.formats import llmc


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer of a family's training contract (docs/reference/training-contract.md#optimizer-by-family);
    the lr comes from the case."""

    kind: str  # "sgd" (no momentum) | "adam" (bias-corrected, no weight decay)
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def to_dict(self) -> dict:
        if self.kind == "sgd":
            return {"kind": "sgd", "momentum": 0.0, "weight_decay": self.weight_decay}
        return asdict(self)

    @property
    def label(self) -> str:
        if self.kind == "sgd":
            return "SGD (no momentum, no weight decay)"
        return f"Adam (beta {self.beta1}/{self.beta2}, eps {self.eps:g}, bias-corrected, no weight decay)"


@dataclass(frozen=True)
class InitRule:
    """llm.c's init for one config: which tensors draw N(0, std) (in LLMC order), which are 1.

    Tensors named in neither are 0. `drawn_rows` limits a tensor's draws to its first rows
    (GPT-2's wte draws V rows; its padding rows V..Vp-1 stay 0).
    """

    stds: dict[str, float]
    ones: tuple[str, ...]
    drawn_rows: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class HFOptions:
    """Choices a user makes when converting a Hugging Face checkpoint."""

    # Write use_scaled_rope 0 even where config.json scales RoPE (Llama 3.1/3.2): the file then
    # trains with plain RoPE, as every lockstep framework does.
    drop_rope_scaling: bool = False


@dataclass(frozen=True)
class HFModel:
    """What a Hugging Face config.json describes, in a family's terms."""

    config: Any  # the family's config: the LLMC header to write
    tied: bool  # the output head is the input embedding (the checkpoint need not hold lm_head)
    notes: tuple[str, ...] = ()  # what the conversion did that a user should know


@dataclass(frozen=True)
class HFAdapter:
    """A family's Hugging Face Transformers layout, both ways (`models/<family>/hf.py`).

    HF -> LLMC: `read_config` decodes config.json (FormatError naming it for anything the LLMC
    format cannot hold), `tensor_shapes` lists every tensor the checkpoint must hold,
    `hf_name` maps a stored name onto those (None: a buffer such as GPT-2's causal mask, or a
    tied lm_head, which the file does not need), and `llmc_tensor(model, name, layer, read)`
    builds one LLMC tensor (one layer's slice of a per-layer one) from `read(hf_name)`.
    LLMC -> HF: `to_hf` gives the HF state dict, `hf_config` the config.json that goes with it.
    """

    model_types: tuple[str, ...]  # config.json "model_type" values of this family
    read_config: Callable[[dict, str | os.PathLike, HFOptions], HFModel]
    tensor_shapes: Callable[[HFModel], dict[str, tuple[int, ...]]]
    hf_name: Callable[[HFModel, str], str | None]
    llmc_tensor: Callable[[HFModel, str, int | None, Callable[[str], np.ndarray]], np.ndarray]
    to_hf: Callable[[Any, dict[str, np.ndarray]], dict[str, np.ndarray]]
    hf_config: Callable[[Any], dict]


@dataclass(frozen=True)
class ModelFamily:
    name: str  # "gpt2"
    title: str  # "GPT-2", for people
    config_type: type  # the family's config dataclass (built from its LLMC header)
    magic: int  # LLMC checkpoint magic number
    tokenizer: str  # lockstep.data tokenizer name
    optimizer: OptimizerSpec
    # header words -> CheckpointLayout (raises FormatError naming the field); layout -> header words
    decode_header: Callable[[np.ndarray, str | os.PathLike], llmc.CheckpointLayout]
    encode_header: Callable[[llmc.CheckpointLayout], np.ndarray]
    fp32_version: int  # the header version of fp32 tensors (the one InfiniTrain reads)
    bf16_version: int | None  # None: the family has no bf16 layout
    init_rule: Callable[[Any], InitRule]
    reference: str  # "module:Class" of the reference nn.Module, with from_llmc() and llmc_tensors()
    # Rows of a tensor from which on it is padding (may hold anything): GPT-2's wte rows V..Vp-1.
    padding_rows: Callable[[Any], dict[str, int]] = lambda config: {}
    hf: HFAdapter | None = None  # its Hugging Face layout, for `lockstep convert`

    def layout(self, config, bf16: bool = False) -> llmc.CheckpointLayout:
        if bf16 and self.bf16_version is None:
            raise FormatError("-", f"{self.title} checkpoints have no bf16 layout")
        return llmc.CheckpointLayout(version=self.bf16_version if bf16 else self.fp32_version, config=config,
                                     dtype="bf16" if bf16 else "fp32")

    def read_layout(self, path: str | os.PathLike) -> llmc.CheckpointLayout:
        """Decode the header and check the file size, without reading the tensors."""
        header, size = llmc.read_header(path)
        layout = self.decode_header(header, path)
        llmc.check_size(path, layout, size, layout.config.describe() + f", version {layout.version}")
        return layout

    def load(self, path: str | os.PathLike) -> llmc.LLMCCheckpoint:
        layout = self.read_layout(path)
        return llmc.LLMCCheckpoint(path=str(path), family=self.name, version=layout.version, config=layout.config,
                                   tensors=llmc.map_tensors(path, layout))

    def write(self, path: str | os.PathLike, config, tensors: dict[str, np.ndarray], bf16: bool = False) -> None:
        problems = config.problems()
        if problems:
            raise FormatError(path, "cannot write a checkpoint whose shape is inconsistent: " + "; ".join(problems))
        layout = self.layout(config, bf16)
        llmc.write_checkpoint(path, self.encode_header(layout), layout, tensors)

    def reference_class(self):
        module, _, attr = self.reference.partition(":")
        return getattr(importlib.import_module(module), attr)


class LLMCConfig:
    """What every family's config dataclass shares: sizes from `tensor_shapes()`, dict round trips."""

    def num_parameters(self) -> int:
        total = 0
        for _, shape in self.tensor_shapes():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def to_dict(self) -> dict:
        return {"family": self.family, **asdict(self)}

    def training_problems(self) -> list[str]:
        """Why lockstep's frameworks cannot train this (valid) shape as its file means it; empty when they can."""
        return []

    @classmethod
    def from_dict(cls, d: dict):
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class ModelShape:
    """A registered model: a name users type (`--model`, a case's `model`) for a family's config."""

    name: str
    family: str
    config: Any
    description: str = ""


def canonical_tensor_names(config) -> list[str]:
    """Every tensor under its canonical name: LLMC names, per-layer ones split as `name[layer]`."""
    out = []
    for name, _ in config.tensor_shapes():
        if name in config.PER_LAYER:
            out.extend(f"{name}[{layer}]" for layer in range(config.num_layers))
        else:
            out.append(name)
    return out


def split_canonical(tensors: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
    """LLMC tensors (stacked over layers) -> canonical names (`qkvw[3]`), views, no copies."""
    out = {}
    for name, _ in config.tensor_shapes():
        t = tensors[name]
        if name in config.PER_LAYER:
            for layer in range(config.num_layers):
                out[f"{name}[{layer}]"] = t[layer]
        else:
            out[name] = t
    return out
