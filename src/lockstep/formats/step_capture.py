"""The step-1 capture file (`.npz`): what one framework's first step of a case looks like inside.

A `StepCapture` holds, under canonical names (LLMC tensor names, per layer `qkvw[3]`):
- `forward`: the output of every module on DP rank 0's first micro batch, in forward order
  (`embedding`, `ln1[i]`, `attn[i]` (attention before its projection), `attproj[i]`, `ln2[i]`,
  `mlp[i]`, `block[i]`, `lnf`, `logits`, `loss`); empty when the framework exposes none.
- `output_grads`: the gradient arriving at each of those outputs in step 1's backward (same
  micro batch, as the gradient of its mean loss / accum).
- `grads`: every parameter's gradient of step 1 (the whole step: all micro batches and ranks).
  `grad_kind` says how it was obtained: "exact" (read from the framework), "sgd-recovered"
  ((w0 - w1)/lr after one SGD step, with `grad_precision` per tensor), "adam-moment" (after one
  Adam step, its saved first moment / (1 - beta1), with `grad_precision`) or "adam-update" (Adam's
  first update direction u = g/(|g| + eps), (w0 - w1)/lr after one Adam step: all that survives
  where the optimizer state is not saved).
- `loss`: the step-1 loss as the framework logs it; `token_losses` (FP32 per-token losses of the
  step, reference runners) lets other frameworks' logging be emulated.
- `updates`: Adam's first update of each exact gradient, whole, as what two first Adam steps
  can be held to: the sign of its saturated elements, 0 below, a ramp between
  (capture/request.adam_first_update). Kept instead of the whole gradients when the other side
  shows only its Adam update (InfiniTrain on Adam families): one int8 per element (-127..127, in
  1/127 steps; `update_levels`), a quarter of the gradient's bytes.
- `tie_parts`: for a tied tensor, the gradient its embedding use alone gives (the rest is the
  output head's), so that a framework that lost the tie is recognised as exactly that.
- `param_order` / `module_kind`: parameters in the order the forward pass first uses them, and
  the reference module type owning each (LayerNorm, Linear, ...).
- `routing`: for mixture-of-experts layers, what each layer's router decided on micro batch 0
  (DP rank 0, the forward's rows): `experts[l]` (B, T, k) int16, the chosen experts of each token,
  highest router logit first; `weights[l]` (B, T, k) FP32, their routing weights; `aux_loss[l]`
  (0-d FP64), the layer's load-balancing loss of the whole micro batch at coefficient 1. The router
  logits themselves are a module output, `router[l]` (B, T, E). Always whole (a few KB).
- `sketches`: instead of (or beside) any of those tensors, its linear sketch (capture/sketch.py)
  and exact norm, under `fwd/NAME`, `outgrad/NAME`, `grad/NAME`, `tie/NAME`, `update/NAME`
  (Adam's first update computed from an exact gradient). The certificate of `lockstep run`
  records sketches only: a few MB whatever the model's size.
- `applied/NAME` (sketches only): the update the framework's optimizer applied to each parameter
  in the captured step, (w_before - w_after)/lr, recorded by a capture that steps its optimizer
  (`lockstep diagnose`: at step 1, and with `--at-step N` step N+1 from a saved state, where
  Adam's moments and step count shape the update; `CaptureRequest.records_applied`);
  `meta["applied"]` holds the step, the lr and, per tensor, the bound on
  ||error|| / ||update|| that w_after's FP32 rounding allows.

On disk: one .npz written tensor by tensor (never the whole capture in memory twice), entries
`fwd/`, `outgrad/`, `grad/`, `update/`, `tie/`, `route/`, `sk/<kind>/NAME`, `token_losses` and a JSON `meta`;
read back lazily, one tensor at a time. Tensors are FP32, except Adam update saturations (`update/`,
and `grad/` of an "adam-update" capture), which are int8 (capture schema 4: -127..127 for -1..1;
schema 3: -1, 0, 1).
"""

from __future__ import annotations

import io
import json
import mmap
import os
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from lockstep.errors import FormatError
from lockstep.fsutil import atomic_write

GRAD_EXACT = "exact"
GRAD_SGD_RECOVERED = "sgd-recovered"
GRAD_ADAM_UPDATE = "adam-update"
GRAD_ADAM_MOMENT = "adam-moment"  # (first moment after one Adam step) / (1 - beta1): the whole gradient
# 4: int8 tensors hold Adam update saturations in 1/127 steps (capture/request.update_signs);
# 3: `update/` entries, and int8 for sign-valued tensors (-1, 0, 1; 2 and 3 still read)
CAPTURE_SCHEMA = 4
UPDATE_LEVELS = 127  # int8 steps per unit of an Adam update saturation (schema 4)
UPDATE_LEVELS_BEFORE_4 = 1
SKETCH_KINDS = ("fwd", "outgrad", "grad", "tie", "update")
APPLIED = "applied"  # the optimizer's applied update of the captured step: sketches only
# The canonical module outputs of one layer and around the layers, in the order a forward reaches them.
MODULE_ORDER = ("embedding", "ln1", "attn", "attproj", "ln2", "router", "mlp", "block", "lnf", "logits", "loss")


def forward_rank(name: str) -> tuple:
    """Sort key of a canonical module output's name (`ln1[3]`, `lnf`) in forward order; a name the
    format does not define sorts after its layer's known ones."""
    base, _, rest = name.partition("[")
    layer = int(rest.rstrip("]")) if rest else -1
    top = {"embedding": (-1,), "lnf": (10**9,), "logits": (10**9 + 1,), "loss": (10**9 + 2,)}
    if base in top:
        return top[base] + (0,)
    return (layer, MODULE_ORDER.index(base) if base in MODULE_ORDER else len(MODULE_ORDER))


@dataclass(frozen=True)
class Sketch:
    """A tensor's linear sketch (FP64), its exact FP64 norm and its shape."""

    values: np.ndarray
    norm: float
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def exact(self) -> bool:
        """A tensor no larger than the sketch is stored whole (bucket i holds element i)."""
        return self.values.size == self.numel


class LazyTensors(Mapping):
    """The `prefix/NAME` arrays of an open .npz, loaded when asked for (a capture of a 1B model's
    gradients is 5 GB: diagnose compares it one tensor at a time). Entries stored uncompressed (as
    `save` writes them) are read-only views of the memory-mapped file, read from disk as they are
    used, once however often they are asked for."""

    def __init__(self, npz, prefix: str, mapped: "MappedEntries | None" = None):
        self._npz = npz
        self._prefix = prefix
        self._mapped = mapped
        self._names = [k[len(prefix):] for k in npz.files if k.startswith(prefix)]

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        key = self._prefix + name
        array = self._mapped.array(key) if self._mapped is not None else None
        return array if array is not None else self._npz[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class MappedEntries:
    """The uncompressed .npy entries of a .npz, as views of the file mapped into memory: no copy,
    and no CRC pass over gigabytes (the file is lockstep's own; a short one fails as a FormatError)."""

    def __init__(self, path: str | os.PathLike, zf: zipfile.ZipFile):
        self.path = str(path)
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._infos = {i.filename[:-4]: i for i in zf.infolist()
                       if i.filename.endswith(".npy") and i.compress_type == zipfile.ZIP_STORED}

    def array(self, key: str) -> np.ndarray | None:
        """The entry `key` (without .npy), or None where it is not a plain stored entry."""
        info = self._infos.get(key)
        if info is None:
            return None
        m, start = self._map, info.header_offset
        if m[start:start + 4] != b"PK\x03\x04":
            raise FormatError(self.path, f"entry {key}: no zip local header where its directory says")
        # The local header's own name and extra lengths (its extra field may differ from the directory's).
        name_len, extra_len = int.from_bytes(m[start + 26:start + 28], "little"), int.from_bytes(m[start + 28:start + 30], "little")
        begin = start + 30 + name_len + extra_len
        header = io.BytesIO(m[begin:begin + min(info.file_size, 1 << 16)])
        try:
            version = np.lib.format.read_magic(header)
            if version not in ((1, 0), (2, 0)):
                return None
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(header)
        except ValueError as e:
            raise FormatError(self.path, f"entry {key} is not a .npy array ({e})") from None
        if dtype.hasobject or fortran:
            return None
        count = int(np.prod(shape, dtype=np.int64))
        offset = begin + header.tell()
        if offset + count * dtype.itemsize > begin + info.file_size or begin + info.file_size > len(m):
            raise FormatError(self.path, f"entry {key}: {count} elements of {dtype} do not fit in it, or the file ends early")
        return np.frombuffer(m, dtype=dtype, count=count, offset=offset).reshape(shape)


@dataclass
class StepCapture:
    framework: str
    loss: float | None = None
    forward: Mapping[str, np.ndarray] = field(default_factory=dict)
    forward_order: list[str] = field(default_factory=list)
    output_grads: Mapping[str, np.ndarray] = field(default_factory=dict)
    grads: Mapping[str, np.ndarray] = field(default_factory=dict)
    grad_kind: str = GRAD_EXACT
    grad_precision: dict[str, float] = field(default_factory=dict)  # bound on ||error|| / ||g||, per tensor
    updates: Mapping[str, np.ndarray] = field(default_factory=dict)  # Adam's first update (signs), whole
    tie_parts: Mapping[str, np.ndarray] = field(default_factory=dict)
    routing: Mapping[str, np.ndarray] = field(default_factory=dict)  # MoE routers' decisions (see above)
    token_losses: np.ndarray | None = None  # (micro batches, tokens) FP32 per-token losses of step 1
    param_order: list[str] = field(default_factory=list)
    module_kind: dict[str, str] = field(default_factory=dict)
    sketches: dict[str, Sketch] = field(default_factory=dict)  # "kind/NAME" -> sketch
    notes: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    source: str | None = None  # the file it was read from
    update_levels: int = UPDATE_LEVELS  # int8 tensors' steps per unit (1 before schema 4)

    def sketch(self, kind: str, name: str) -> Sketch | None:
        return self.sketches.get(f"{kind}/{name}")

    def names(self, kind: str) -> list[str]:
        """Every tensor of a kind ("fwd", "outgrad", "grad", "tie") held whole or as a sketch."""
        whole = self.store(kind)
        sketched = [k.split("/", 1)[1] for k in self.sketches if k.startswith(kind + "/")]
        return list(whole) + [n for n in sketched if n not in whole]

    def store(self, kind: str) -> Mapping[str, np.ndarray]:
        """The whole tensors of a kind ("fwd", "outgrad", "grad", "update", "tie")."""
        return {"fwd": self.forward, "outgrad": self.output_grads, "grad": self.grads, "update": self.updates,
                "tie": self.tie_parts, "route": self.routing, APPLIED: {}}[kind]

    @property
    def applied_precision(self) -> dict[str, float]:
        """Per tensor, the bound on ||error|| / ||update|| of its applied update (see `applied/`)."""
        return dict((self.meta.get(APPLIED) or {}).get("precision", {}))

    def save(self, path: str | os.PathLike) -> None:
        """Written aside, one entry at a time, and renamed into place; a failed write says why,
        naming the file, and leaves nothing."""
        meta = {"schema": CAPTURE_SCHEMA, "framework": self.framework, "loss": self.loss,
                "forward_order": self.forward_order, "grad_kind": self.grad_kind,
                "grad_precision": self.grad_precision, "param_order": self.param_order,
                "module_kind": self.module_kind, "notes": self.notes, "meta": self.meta,
                "sketches": {k: {"norm": s.norm, "shape": list(s.shape)} for k, s in self.sketches.items()}}
        with atomic_write(path, "wb", what="step-1 capture") as out, zipfile.ZipFile(out, "w", allowZip64=True) as zf:
            def put(name: str, array: np.ndarray) -> None:
                with zf.open(name + ".npy", "w", force_zip64=True) as f:
                    # np.require keeps a 0-d array 0-d (ascontiguousarray would make it 1-d).
                    np.lib.format.write_array(f, np.require(array, requirements="C"), allow_pickle=False)

            signs = self.grad_kind == GRAD_ADAM_UPDATE
            for prefix, tensors, dtype in (("fwd/", self.forward, np.float32), ("outgrad/", self.output_grads, np.float32),
                                           ("grad/", self.grads, np.int8 if signs else np.float32),
                                           ("update/", self.updates, np.int8), ("tie/", self.tie_parts, np.float32)):
                for name in tensors:
                    put(prefix + name, _as(tensors[name], dtype, name))
            for name in self.routing:
                put("route/" + name, _routing_array(self.routing[name], name))
            for key, s in self.sketches.items():
                put("sk/" + key, np.asarray(s.values, dtype=np.float64))
            if self.token_losses is not None:
                put("token_losses", np.asarray(self.token_losses, dtype=np.float32))
            put("meta", np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "StepCapture":
        """The capture at `path`; its whole tensors are read when used (the file stays open)."""
        try:
            z = np.load(path, allow_pickle=False)
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            raise FormatError(path, f"is not a lockstep step-1 capture ({e})") from None
        if not hasattr(z, "files") or "meta" not in z.files:
            raise FormatError(path, "is not a lockstep step-1 capture (no meta entry)")
        try:
            meta = json.loads(bytes(z["meta"]).decode())
        except (ValueError, UnicodeDecodeError) as e:
            raise FormatError(path, f"has an unreadable meta entry ({e})") from None
        try:
            mapped = MappedEntries(path, z.zip)
        except (OSError, ValueError):  # e.g. an empty file; np.load's own reads still work
            mapped = None
        sketches = {}
        for key, info in meta.get("sketches", {}).items():
            if "sk/" + key not in z.files:
                raise FormatError(path, f"lists sketch {key} but does not hold it")
            sketches[key] = Sketch(z["sk/" + key], float(info["norm"]), tuple(info["shape"]))
        return cls(framework=meta["framework"], loss=meta.get("loss"),
                   forward=LazyTensors(z, "fwd/", mapped), forward_order=meta.get("forward_order", []),
                   output_grads=LazyTensors(z, "outgrad/", mapped), grads=LazyTensors(z, "grad/", mapped),
                   grad_kind=meta.get("grad_kind", GRAD_EXACT), grad_precision=meta.get("grad_precision", {}),
                   updates=LazyTensors(z, "update/", mapped),
                   tie_parts=LazyTensors(z, "tie/", mapped), routing=LazyTensors(z, "route/", mapped),
                   token_losses=z["token_losses"] if "token_losses" in z.files else None,
                   param_order=meta.get("param_order", []), module_kind=meta.get("module_kind", {}),
                   sketches=sketches, notes=meta.get("notes", []), meta=meta.get("meta", {}), source=str(path),
                   update_levels=UPDATE_LEVELS if meta.get("schema", CAPTURE_SCHEMA) >= 4 else UPDATE_LEVELS_BEFORE_4)


def _as(array, dtype, name: str) -> np.ndarray:
    """`array` in the file's dtype; an Adam update saturation tensor (int8 on disk, UPDATE_LEVELS steps)
    is kept as it is when int8 already (capture/request.update_signs), else made from values in -1..1."""
    a = np.asarray(array)
    if dtype is np.int8 and a.dtype != np.int8:
        if a.size and float(np.max(np.abs(a))) > 1.0:
            raise ValueError(f"{name}: an Adam update saturation tensor holds values outside -1..1")
        return np.rint(a.astype(np.float64) * UPDATE_LEVELS).astype(np.int8)
    return a.astype(dtype, copy=False)


ROUTING_DTYPES = {"experts": np.int16, "weights": np.float32, "aux_loss": np.float64}


def _routing_array(array, name: str) -> np.ndarray:
    """A `route/` entry in its dtype (by its kind: experts, weights, aux_loss)."""
    kind = name.split("[")[0]
    if kind not in ROUTING_DTYPES:
        raise ValueError(f"route/{name}: not a routing entry (experts, weights or aux_loss)")
    return np.asarray(array).astype(ROUTING_DTYPES[kind], copy=False)
