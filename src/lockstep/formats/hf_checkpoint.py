"""A Hugging Face Transformers checkpoint directory, read tensor by tensor.

What `save_pretrained` writes and the Hub serves: `config.json`, and the weights either as one
`model.safetensors` or as shards listed in `model.safetensors.index.json` (its `weight_map`:
tensor name -> shard file). A folder holding both is read as Transformers reads it: its
`from_pretrained` loads `model.safetensors` and never opens the index, so the conversion is of
the model Transformers runs; the checkpoint's `notes` say that the index was ignored. Tensors are read one at a time through the `safetensors` package
(memory-mapped), so converting an 8B model never holds the whole checkpoint twice. bf16, fp16
and fp64 tensors are returned as fp32 (bf16 and fp16 exactly; fp64 rounded to nearest).

Every problem (no such directory, no weights, a shard the index names that is not there, a
file that is not safetensors, a tensor of an integer type) is a FormatError naming the file.
`pytorch_model.bin` (pickle) is not read: it can run code, and every current checkpoint has a
safetensors copy.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lockstep.errors import FormatError, LockstepError
from lockstep.fsutil import read_text, regular_file_size

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# safetensors dtype names of weights (every one but F64 widens to fp32 exactly).
FLOAT_DTYPES = frozenset({"F32", "BF16", "F16", "F64"})


@dataclass(frozen=True)
class HFTensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors' name: F32, BF16, F16, F64
    file: Path


def safetensors_module():
    try:
        import safetensors
    except ModuleNotFoundError:
        raise LockstepError("reading Hugging Face checkpoints needs the safetensors package: "
                            "pip install 'lockstep[hf]'") from None
    return safetensors


class HFCheckpoint:
    """config.json and the tensor inventory of a checkpoint directory; `read(name)` gives fp32."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        if not self.directory.exists():
            raise FormatError(self.directory, "no such directory")
        if not self.directory.is_dir():
            raise FormatError(self.directory, "is not a directory; give the Hugging Face checkpoint's folder "
                                              "(the one holding config.json)")
        self.config_path = self.directory / CONFIG_FILE
        self.config = read_json(self.config_path, "Hugging Face config.json")
        self.files = self._weight_files()
        self.tensors = self._inventory()
        self._handles: dict[Path, Any] = {}

    def _weight_files(self) -> list[Path]:
        index, single = self.directory / INDEX_FILE, self.directory / SINGLE_FILE
        self.notes: list[str] = []
        if index.is_file() and single.exists():
            self.notes.append(f"{SINGLE_FILE} read and {INDEX_FILE} beside it ignored, as transformers' "
                              "from_pretrained does")
        elif index.is_file():
            content = read_json(index, "safetensors index")
            weight_map = content.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise FormatError(index, "has no weight_map (tensor name -> shard file)")
            self._index_map = {str(k): self.directory / str(v) for k, v in weight_map.items()}
            files = list(dict.fromkeys(self._index_map.values()))
            for f in files:
                if not f.is_file():
                    raise FormatError(f, f"no such file, but {INDEX_FILE} lists it as a shard")
            return files
        if single.exists():
            regular_file_size(single, "safetensors file")
            self._index_map = None
            return [single]
        hint = " (pytorch_model.bin is not read: save the model with safetensors)" \
            if (self.directory / "pytorch_model.bin").exists() else ""
        raise FormatError(self.directory, f"holds neither {SINGLE_FILE} nor {INDEX_FILE}{hint}")

    def _inventory(self) -> dict[str, HFTensorInfo]:
        safe_open = safetensors_module().safe_open
        out: dict[str, HFTensorInfo] = {}
        for f in self.files:
            try:
                with safe_open(str(f), framework="pt") as handle:
                    for name in handle.keys():
                        part = handle.get_slice(name)
                        info = HFTensorInfo(name=name, shape=tuple(int(d) for d in part.get_shape()),
                                            dtype=str(part.get_dtype()), file=f)
                        if name in out:
                            raise FormatError(f, f"tensor {name} is also in {out[name].file.name}")
                        out[name] = info
            except FormatError:
                raise
            except Exception as e:  # safetensors raises its own error types for a damaged header
                raise FormatError(f, f"is not a readable safetensors file: {e}") from None
        if self._index_map is not None:
            for name, f in self._index_map.items():
                if name not in out:
                    raise FormatError(f, f"does not hold tensor {name}, which {INDEX_FILE} places there")
        return out

    def read(self, name: str) -> np.ndarray:
        """One tensor as a C-contiguous fp32 array; a FormatError naming its file when it holds NaN or
        Inf (Transformers loads such weights; every lockstep framework would refuse to train them)."""
        info = self.tensors[name]
        if info.dtype not in FLOAT_DTYPES:
            raise FormatError(info.file, f"tensor {name} holds {info.dtype} values, not floating point weights")
        handle = self._handles.get(info.file)
        if handle is None:
            handle = safetensors_module().safe_open(str(info.file), framework="pt")
            self._handles[info.file] = handle
        import torch

        t = np.ascontiguousarray(handle.get_tensor(name).to(torch.float32).numpy())
        finite = np.isfinite(t)
        if not finite.all():
            nan = int(np.isnan(t).sum())
            inf = int(t.size - finite.sum()) - nan
            raise FormatError(info.file, f"tensor {name} holds {nan} NaN and {inf} infinite value(s); lockstep run "
                                         "refuses such weights, so they are not converted")
        return t

    def input_files(self) -> list[Path]:
        """Every file the conversion reads: config.json, the weights, the index when it is used."""
        index = [self.directory / INDEX_FILE] if self._index_map is not None else []
        return [self.config_path, *index, *self.files]

    def dtypes(self) -> list[str]:
        return sorted({t.dtype for t in self.tensors.values()})

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> "HFCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_json(path: Path, what: str) -> dict:
    text = read_text(path, what)
    try:
        content = json.loads(text)
    except json.JSONDecodeError as e:
        raise FormatError(path, f"is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(content, dict):
        raise FormatError(path, f"is not a JSON object; is it a {what}?")
    return content
