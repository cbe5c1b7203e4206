"""A Hugging Face checkpoint directory -> the family's LLMC file, through the family's `HFAdapter`.

The family comes from config.json's model_type (or is checked against it). Before a byte is
written, the checkpoint's tensor inventory is checked against what its config.json implies: every
tensor present, none left over (a weight the LLMC format has no place for would be dropped
silently), every shape right. Then the LLMC file is written one layer of one tensor kind at a
time, in LLMC order, to a temporary file renamed into place: an error leaves nothing at `out`.
Each tensor read is checked to be finite on the way (NaN or Inf: one sentence naming the
tensor, as `lockstep run` would refuse the file).

What is at `out` is replaced only when lockstep could have written it (docs/reference/hf-convert.md,
"What --out may replace"): an LLMC checkpoint, recognised by a header that decodes and a size that
matches it exactly. Anything else is refused unless `--force`, which moves it aside
(`<name>.moved-by-lockstep-<UTC time>`), never deletes it; and `out` may never be one of the
checkpoint's own files (same resolved path or same inode), nor a name Transformers reads in its
folder. Temporary files left by a conversion killed mid-write are removed first, and said.
"""

from __future__ import annotations

import datetime as _dt
import os

import numpy as np
import time
from dataclasses import dataclass
from pathlib import Path

from lockstep.errors import FormatError, LockstepError
from lockstep.formats import llmc
from lockstep.formats.hf_checkpoint import CONFIG_FILE, INDEX_FILE, SINGLE_FILE, HFCheckpoint
from lockstep.fsutil import StaleTemp, check_writable_target, move_aside, remove_stale_temps
from lockstep.models import FAMILIES, family, read_checkpoint_layout
from lockstep.models.family import HFModel, HFOptions, ModelFamily

HEAD = "lm_head.weight"
# The input embedding as each family's Hugging Face layout names it (GPT-2; Llama, Qwen3, Mixtral).
EMBEDDINGS = ("transformer.wte.weight", "model.embed_tokens.weight")


@dataclass(frozen=True)
class Conversion:
    source: Path
    out: Path
    family: ModelFamily
    model: HFModel
    model_type: str
    shards: int
    source_dtypes: tuple[str, ...]
    seconds: float
    notes: tuple[str, ...] = ()  # what was read and done that the user should know, checkpoint's first
    moved_aside: Path | None = None  # where --force moved a file that was at `out` and not lockstep's
    removed_temps: tuple[StaleTemp, ...] = ()  # left at `out` by a conversion killed mid-write


def convertible_families() -> list[ModelFamily]:
    return [f for f in FAMILIES.values() if f.hf is not None]


def family_for(config: dict, config_path: Path, requested: str | None) -> ModelFamily:
    """The family of config.json's model_type; with `requested` (--family), that it agrees."""
    model_type = config.get("model_type")
    known = ", ".join(f"{f.name} ({'/'.join(f.hf.model_types)})" for f in convertible_families())
    found = next((f for f in convertible_families() if model_type in f.hf.model_types), None)
    if requested is not None:
        wanted = family(requested)
        if wanted.hf is None:
            raise LockstepError(f"--family {requested}: lockstep cannot convert {wanted.title} checkpoints")
        if found is not wanted:
            what = f"a {found.title} checkpoint" if found else "not a checkpoint lockstep converts"
            raise FormatError(config_path, f"model_type is {model_type!r}, {what}, but --family {requested} asks for "
                                           f"{wanted.title} (model_type {' or '.join(map(repr, wanted.hf.model_types))})")
        return wanted
    if found is None:
        raise FormatError(config_path, f"model_type is {model_type!r}; lockstep converts {known}")
    return found


def is_llmc_checkpoint(path: Path) -> bool:
    """Whether `path` is an LLMC checkpoint of a known family: header decodes, size exact."""
    try:
        read_checkpoint_layout(path)
    except LockstepError:
        return False
    return True


def foreign_output(out: Path, force: bool) -> bool:
    """True when a file lockstep did not write is at `out` and --force lets it be moved aside;
    refused without --force."""
    if not os.path.lexists(out) or is_llmc_checkpoint(out):
        return False
    if not force:
        raise FormatError(out, "exists and is not an LLMC checkpoint, so lockstep did not write it; choose another "
                               "--out, or pass --force to move it aside (nothing is deleted)")
    return True


def refuse_an_input(out: Path, ckpt: HFCheckpoint) -> None:
    """`out` must not be a file this conversion reads, nor one Transformers would read in its folder."""
    target = Path(os.path.realpath(out))
    for f in ckpt.input_files():
        if target == Path(os.path.realpath(f)) or (out.exists() and os.path.samefile(out, f)):
            raise FormatError(out, f"is the checkpoint's own {f.name} ({f}), an input of this conversion; writing "
                                   "the LLMC file there would replace it: choose another --out")
    if target.parent == Path(os.path.realpath(ckpt.directory)) and target.name in (CONFIG_FILE, SINGLE_FILE,
                                                                                     INDEX_FILE):
        raise FormatError(out, f"is where transformers reads the checkpoint's {target.name} in {ckpt.directory}; "
                               "an LLMC file there would break that folder: choose another --out")


def convert_hf_checkpoint(directory: str | os.PathLike, out: str | os.PathLike, family_name: str | None = None,
                          options: HFOptions = HFOptions(), force: bool = False) -> Conversion:
    started = time.perf_counter()
    # An --out that can never be a file, or holds a file lockstep did not write, fails first; its
    # folder is made, and a foreign file moved aside, only once the input has passed every check,
    # so that a refused conversion changes nothing.
    out = check_writable_target(out, "LLMC checkpoint")
    with HFCheckpoint(directory) as ckpt:
        refuse_an_input(out, ckpt)
        move_foreign = foreign_output(out, force)
        fam = family_for(ckpt.config, ckpt.config_path, family_name)
        adapter = fam.hf
        model = adapter.read_config(ckpt.config, ckpt.config_path, options)
        stored = check_inventory(ckpt, fam, model)
        check_tied_head(ckpt, fam, model, stored)
        layout = fam.layout(model.config)

        def read(name: str):
            return ckpt.read(stored[name])

        moved = move_aside(out, _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")) if move_foreign else None
        removed = tuple(remove_stale_temps(out))
        llmc.write_checkpoint_by_layer(out, fam.encode_header(layout), layout,
                                       lambda name, layer: adapter.llmc_tensor(model, name, layer, read))
        fam.read_layout(out)  # the header decodes and the size is exact, or FormatError
        return Conversion(source=ckpt.directory, out=out, family=fam, model=model,
                          model_type=str(ckpt.config.get("model_type")), shards=len(ckpt.files),
                          source_dtypes=tuple(ckpt.dtypes()), seconds=time.perf_counter() - started,
                          notes=(*ckpt.notes, *model.notes), moved_aside=moved, removed_temps=removed)


def check_tied_head(ckpt: HFCheckpoint, fam: ModelFamily, model: HFModel, stored: dict[str, str]) -> None:
    """A tied model's file holds no head: the embedding is the head. A checkpoint that stores an
    lm_head anyway must hold the embedding there, or converting would drop trained weights."""
    if not model.tied or HEAD not in ckpt.tensors:
        return
    embedding = next((stored[n] for n in EMBEDDINGS if n in stored), None)
    if embedding is None:
        return
    head, wte = ckpt.read(HEAD), ckpt.read(embedding)
    if head.shape == wte.shape and np.array_equal(head, wte):
        return
    differs = (f"differs from {embedding} by up to {float(np.max(np.abs(head - wte))):.3g}"
               if head.shape == wte.shape else f"has shape {head.shape}, {embedding} {wte.shape}")
    raise FormatError(ckpt.tensors[HEAD].file, f"holds an untied {HEAD} that {differs}; the LLMC {fam.title} format "
                                               "ties the head to the embedding, so converting would drop it")


def check_inventory(ckpt: HFCheckpoint, fam: ModelFamily, model: HFModel) -> dict[str, str]:
    """Adapter name -> name as stored, once every expected tensor is there with its shape and
    nothing unknown is left over."""
    stored: dict[str, str] = {}
    for name in ckpt.tensors:
        canonical = fam.hf.hf_name(model, name)
        if canonical is None:
            continue
        if canonical in stored:
            raise FormatError(ckpt.tensors[name].file, f"holds tensor {name} and {stored[canonical]}, the same tensor "
                                                       "under two names")
        stored[canonical] = name
    expected = fam.hf.tensor_shapes(model)
    shape_words = f"config.json's {fam.title} shape ({model.config.describe()})"
    missing = [n for n in expected if n not in stored]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise FormatError(ckpt.directory, f"tensor {missing[0]}{more} is missing; {shape_words} needs it")
    extra = [stored[n] for n in stored if n not in expected]
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise FormatError(ckpt.tensors[extra[0]].file, f"holds tensor {extra[0]}{more}, which the LLMC {fam.title} "
                                                       "format has no place for; converting would drop it")
    for name, shape in expected.items():
        info = ckpt.tensors[stored[name]]
        if info.shape != shape:
            raise FormatError(info.file, f"tensor {info.name} has shape {info.shape}, but {shape_words} needs {shape}")
    return stored
