"""InfiniTrain's native checkpoint (`--save DIR --save_interval N`), read and validated.

A save writes DIR/checkpoint_step_NNNNNN/ (and, when the run is parallel, one rank_NNNNNN/ per
thread rank inside it, example/gpt2/main.cc) holding:

- `model.ckpt`: the model's state dict; `optimizer.ckpt`: the optimizer's (Adam: `adam.m.<i>`,
  `adam.v.<i>` per parameter in optimizer order and `adam.t`, an int64 scalar; SGD has no state
  and writes no file; infini_train/src/optimizer.cc). Both: magic "CKPT" (0x54504B43), version 1,
  a uint32 tensor count, then per tensor a uint32 name length and the name, an int8 dtype
  (InfiniTrain's DataType, datatype.h: 11 = FP32, 8 = INT64, 9 = BF16), a uint32 ndim, int64
  dims, a uint64 byte count and the bytes, little-endian, in the state dict's (hash map) order
  (infini_train/src/checkpoint/checkpoint.cc, SaveStateDict).
- `trainer_state.json`: global_step, consumed_batches, last_lr, the shape (n_layer, n_head,
  n_kv_head, n_embd, vocab_size) and the topology (ddp_size, tp_size, sp_size, pp_size). It is
  not valid JSON at b24d92f (no comma after vocab_size) and InfiniTrain reads it with a field
  extractor that falls back to a default for a missing key; lockstep reads it the same way and
  says which keys were missing.

Names are InfiniTrain's module paths (transformer.h.0.attn.c_attn.weight);
runners/infinitrain/families.py maps them to LLMC names. Thread ranks are laid out TP fastest,
then DP, then PP (nn/parallel/global.h, Layout order {TP, DP, PP}).
"""

from __future__ import annotations

import math
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lockstep.errors import FormatError
from lockstep.fsutil import read_text

CKPT_MAGIC = 0x54504B43
CKPT_VERSION = 1
INFINITRAIN_FP32 = 11
# InfiniTrain's DataType codes (datatype.h, enum class DataType : int8_t) -> numpy dtype.
DTYPES: dict[int, tuple[str, str]] = {0: ("bool", "|b1"), 1: ("uint8", "|u1"), 2: ("int8", "|i1"),
                                      3: ("uint16", "<u2"), 4: ("int16", "<i2"), 5: ("uint32", "<u4"),
                                      6: ("int32", "<i4"), 7: ("uint64", "<u8"), 8: ("int64", "<i8"),
                                      9: ("bfloat16", "<u2"), 10: ("float16", "<f2"), 11: ("float32", "<f4"),
                                      12: ("float64", "<f8")}
MODEL_FILE, OPTIMIZER_FILE, TRAINER_STATE_FILE = "model.ckpt", "optimizer.ckpt", "trainer_state.json"
STEP_DIR = re.compile(r"^checkpoint_step_(\d{6,})$")
RANK_DIR = re.compile(r"^rank_(\d{6,})$")
# trainer_state.json's keys in InfiniTrain's order, and the value its reader falls back to.
TRAINER_STATE_KEYS: dict[str, int | float] = {
    "n_layer": 0, "n_head": 0, "n_kv_head": 0, "n_embd": 0, "vocab_size": 0, "global_step": 0, "consumed_batches": 0,
    "last_lr": 0.0, "ddp_size": 1, "tp_size": 1, "sp_size": 1, "pp_size": 1}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype_code: int
    shape: tuple[int, ...]
    offset: int  # of the data in the file
    nbytes: int

    @property
    def dtype(self) -> str:
        return DTYPES[self.dtype_code][0] if self.dtype_code in DTYPES else f"code {self.dtype_code}"


@dataclass
class StateFile:
    """One `model.ckpt` / `optimizer.ckpt`: its header and every tensor's entry (data not read)."""

    path: Path
    version: int
    entries: list[TensorEntry]
    size: int
    _data: object = field(default=None, repr=False)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def entry(self, name: str) -> TensorEntry:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(name)

    def array(self, e: TensorEntry) -> np.ndarray:
        """The tensor's values (BF16 widened to FP32; a read-only view of the mapped file otherwise)."""
        count = math.prod(e.shape)
        a = np.frombuffer(self._data, dtype=DTYPES[e.dtype_code][1], count=count, offset=e.offset).reshape(e.shape)
        if e.dtype_code == 9:
            return (a.astype(np.uint32) << 16).view(np.float32)
        return a


def read_state_file(path: str | os.PathLike) -> StateFile:
    """Parse a CKPT file's header and tensor entries completely; FormatError names the first problem."""
    path = Path(path)
    data = _map_file(path)
    version, count = _read_header(path, data)
    pos, entries, seen = 12, [], set()
    for i in range(count):
        entry = _read_entry(path, data, pos, f"tensor #{i + 1} of {count}")
        if entry.name in seen:
            raise FormatError(path, f"tensor {entry.name} is stored twice")
        seen.add(entry.name)
        entries.append(entry)
        pos = entry.offset + entry.nbytes
    if pos != len(data):
        raise FormatError(path, f"{len(data) - pos} trailing bytes after {count} tensors")
    return StateFile(path=path, version=version, entries=entries, size=len(data), _data=data)


def _map_file(path: Path):
    """The file's bytes, memory-mapped so that a 5 GB model is read from disk only where used."""
    with open(path, "rb") as f:
        try:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            return b""


def _read_header(path: Path, data) -> tuple[int, int]:
    """(version, tensor count) after checking the magic number and the version."""
    if len(data) < 12:
        raise FormatError(path, f"truncated: {len(data)} bytes, too short for an InfiniTrain checkpoint header (12)")
    magic, version, count = struct.unpack_from("<III", data, 0)
    if magic != CKPT_MAGIC:
        raise FormatError(path, f"wrong magic number {magic:#x} for an InfiniTrain checkpoint (expected {CKPT_MAGIC:#x}, "
                                "\"CKPT\")")
    if version != CKPT_VERSION:
        raise FormatError(path, f"unsupported InfiniTrain checkpoint version {version} (supported: {CKPT_VERSION})")
    return version, count


def _read_entry(path: Path, data, pos: int, where: str) -> TensorEntry:
    """The entry starting at `pos` (its data follows it), checked against its dtype and the file's end."""
    name, dtype, dims, nbytes, pos = _entry_fields(path, data, pos, where)
    if dtype not in DTYPES:
        raise FormatError(path, f"tensor {name}: unknown dtype code {dtype} (InfiniTrain's DataType is 0..12)")
    if any(d < 0 for d in dims):
        raise FormatError(path, f"tensor {name}: negative dimension in shape {list(dims)}")
    itemsize = np.dtype(DTYPES[dtype][1]).itemsize
    if nbytes != itemsize * math.prod(dims):
        raise FormatError(path, f"tensor {name}: {nbytes} bytes stored for {DTYPES[dtype][0]} shape {list(dims)}, "
                                f"which holds {itemsize * math.prod(dims)}")
    if pos + nbytes > len(data):
        raise FormatError(path, f"truncated: tensor {name} needs {nbytes} bytes, but the file ends early "
                                f"({pos + nbytes - len(data)} bytes short)")
    return TensorEntry(name=name, dtype_code=dtype, shape=tuple(dims), offset=pos, nbytes=nbytes)


def _entry_fields(path: Path, data, pos: int, where: str) -> tuple[str, int, tuple, int, int]:
    """(name, dtype code, dims, byte count, where the data starts), as the entry stores them."""
    try:
        (n,) = struct.unpack_from("<I", data, pos)
        if pos + 4 + n > len(data):
            raise struct.error
        name = bytes(data[pos + 4 : pos + 4 + n]).decode()
        pos += 4 + n
        where = f"tensor {name}"
        dtype, ndim = struct.unpack_from("<bI", data, pos)
        pos += 5
        dims = struct.unpack_from(f"<{ndim}q", data, pos)
        pos += 8 * ndim
        (nbytes,) = struct.unpack_from("<Q", data, pos)
        pos += 8
    except struct.error:
        raise FormatError(path, f"truncated: the file ends in the middle of {where}'s entry") from None
    except UnicodeDecodeError:
        raise FormatError(path, f"{where}: its name is not UTF-8") from None
    return name, dtype, dims, nbytes, pos


def read_infinitrain_checkpoint(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The FP32 tensors of an InfiniTrain `model.ckpt`, by InfiniTrain's names (other dtypes are
    skipped): read-only views of the memory-mapped file, read from disk when used (a 1B model's
    is 5 GB). The file may be removed while they live; its space is freed with the last of them."""
    state = read_state_file(path)
    return {e.name: state.array(e) for e in state.entries if e.dtype_code == INFINITRAIN_FP32}


# numpy dtype -> InfiniTrain's DataType code, for the tensors a writer may hold (weights, moments, adam.t).
WRITABLE_DTYPES = {np.dtype("<f4"): INFINITRAIN_FP32, np.dtype("<i8"): 8}


def state_file_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    """A CKPT file as InfiniTrain's SaveStateDict lays it out (checkpoint.cc:112-140), in the dict's
    order: FP32 and INT64 tensors (a 0-d INT64 is Adam's step count `adam.t`)."""
    parts = [struct.pack("<III", CKPT_MAGIC, CKPT_VERSION, len(tensors))]
    for name, a in tensors.items():
        a = np.asarray(a)
        kind = np.dtype(a.dtype).newbyteorder("<")
        if kind not in WRITABLE_DTYPES:
            raise ValueError(f"tensor {name}: dtype {a.dtype} is not written (FP32 or INT64 only)")
        a = a.astype(kind, order="C", copy=False)  # not ascontiguousarray: it makes a 0-d adam.t 1-d
        raw = name.encode()
        parts += [struct.pack("<I", len(raw)), raw, struct.pack("<bI", WRITABLE_DTYPES[kind], a.ndim),
                  struct.pack(f"<{a.ndim}q", *a.shape), struct.pack("<Q", a.nbytes), a.tobytes()]
    return b"".join(parts)


def write_state_file(path: str | os.PathLike, tensors: dict[str, np.ndarray]) -> None:
    """`state_file_bytes` written to `path`, tensor by tensor (a model's worth is not held twice)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<III", CKPT_MAGIC, CKPT_VERSION, len(tensors)))
        for name, a in tensors.items():
            f.write(state_file_bytes({name: a})[12:])


def write_infinitrain_checkpoint(path: str | os.PathLike, tensors: dict[str, np.ndarray]) -> None:
    """A model.ckpt of FP32 tensors (tests; InfiniTrain's own writer is the real source of these files)."""
    write_state_file(path, {n: np.asarray(a, dtype=np.float32) for n, a in tensors.items()})


def trainer_state_text(values: dict[str, int | float]) -> str:
    """trainer_state.json with every TRAINER_STATE_KEYS key, in InfiniTrain's order and one a line,
    as valid JSON (b24d92f's own writer leaves out the comma after vocab_size; its reader, a key
    extractor that reads up to `,`, newline or `}`, takes both). A key not given is an error: the
    reader would silently take its fallback."""
    missing = [k for k in TRAINER_STATE_KEYS if k not in values]
    if missing:
        raise ValueError(f"trainer state without {', '.join(missing)}")
    def number(key):
        v = values[key]
        return repr(float(v)) if isinstance(TRAINER_STATE_KEYS[key], float) else str(int(v))

    return "{\n" + ",\n".join(f'  "{k}": {number(k)}' for k in TRAINER_STATE_KEYS) + "\n}\n"


def write_checkpoint_folder(root: str | os.PathLike, step: int, model: dict[str, np.ndarray],
                            trainer_state: dict[str, int | float], optimizer: dict[str, np.ndarray] | None = None) -> Path:
    """`root/checkpoint_step_NNNNNN/` of one rank as InfiniTrain's --load reads it: model.ckpt,
    optimizer.ckpt (only when given: SGD has none) and trainer_state.json; its path."""
    folder = Path(root) / f"checkpoint_step_{step:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    write_state_file(folder / MODEL_FILE, model)
    if optimizer is not None:
        write_state_file(folder / OPTIMIZER_FILE, optimizer)
    (folder / TRAINER_STATE_FILE).write_text(trainer_state_text(trainer_state))
    return folder


@dataclass(frozen=True)
class TrainerState:
    """trainer_state.json as InfiniTrain reads it (checkpoint.cc, LoadTrainerState)."""

    values: dict[str, int | float]  # every TRAINER_STATE_KEYS key: the stored value or InfiniTrain's fallback
    missing: tuple[str, ...]  # keys absent from the file (their fallback used)
    path: Path

    @property
    def world_size(self) -> int:
        return int(self.values["ddp_size"] * self.values["tp_size"] * self.values["pp_size"])

    @property
    def topology(self) -> str:
        v = self.values
        return f"DP={v['ddp_size']} TP={v['tp_size']} SP={v['sp_size']} PP={v['pp_size']}"


def read_trainer_state(path: str | os.PathLike) -> TrainerState:
    """Each key's number after `"key":`, up to `,`, newline or `}`, as InfiniTrain's extractor reads
    it (the file is not valid JSON, see the module docstring). A value that does not read as a
    number is an error here (InfiniTrain would silently use the fallback)."""
    path = Path(path)
    text = read_text(path, "InfiniTrain trainer state")
    values, missing = {}, []
    for key, fallback in TRAINER_STATE_KEYS.items():
        m = re.search(r'"' + key + r'"\s*:[ \n]*([^,\n}]*)', text)
        if m is None:
            values[key] = fallback
            missing.append(key)
            continue
        raw = m.group(1).strip()
        try:
            values[key] = float(raw) if isinstance(fallback, float) else int(raw)
        except ValueError:
            raise FormatError(path, f"{key} is {raw!r}, not a number") from None
    return TrainerState(values=values, missing=tuple(missing), path=path)


@dataclass
class RankCheckpoint:
    """What one thread rank saved (rank None: a run of one thread, files in the step folder)."""

    rank: int | None
    directory: Path
    model: StateFile | None = None
    optimizer: StateFile | None = None
    trainer_state: TrainerState | None = None


@dataclass
class CheckpointFolder:
    path: Path
    step: int | None  # from the folder's name (checkpoint_step_NNNNNN), None when it has another name
    ranks: list[RankCheckpoint]
    problems: list[str]  # one sentence each; empty when the folder is a complete, consistent checkpoint

    @property
    def trainer_state(self) -> TrainerState | None:
        return next((r.trainer_state for r in self.ranks if r.trainer_state is not None), None)

    @property
    def parallel(self) -> bool:
        return self.ranks[0].rank is not None


def is_checkpoint_folder(path: str | os.PathLike) -> bool:
    """A folder InfiniTrain's Checkpoint::Save wrote: its files, or rank_NNNNNN/ folders holding them."""
    path = Path(path)
    if not path.is_dir():
        return False
    if (path / MODEL_FILE).exists() or (path / TRAINER_STATE_FILE).exists():
        return True
    return any(RANK_DIR.match(p.name) and p.is_dir() for p in path.iterdir())


def saved_steps(root: str | os.PathLike) -> list[int]:
    """The steps a `--save` root holds (its checkpoint_step_NNNNNN folders), in order."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name)))


def read_checkpoint_folder(path: str | os.PathLike) -> CheckpointFolder:
    """Read every rank's files and check the folder: each file parses to its end, every rank the
    topology names is there (and no other), ranks of one pipeline stage hold the same tensor
    names and shapes, and every trainer state agrees with the others and with the folder's name.
    Problems are collected, one sentence each; FormatError only when it is no checkpoint at all."""
    path = Path(path)
    if not is_checkpoint_folder(path):
        steps = saved_steps(path)
        if steps:
            raise FormatError(path, f"is a --save folder holding checkpoints of steps {', '.join(map(str, steps))}; "
                                    f"name one of them (e.g. {path / f'checkpoint_step_{steps[-1]:06d}'})")
        raise FormatError(path, f"is a directory, but not an InfiniTrain checkpoint folder (no {MODEL_FILE}, {TRAINER_STATE_FILE} or "
                                "rank_NNNNNN/ folders)")
    m = STEP_DIR.match(path.name)
    step = int(m.group(1)) if m else None
    rank_dirs = sorted((int(m.group(1)), p) for p in path.iterdir() if p.is_dir() and (m := RANK_DIR.match(p.name)))
    problems: list[str] = []
    if rank_dirs:
        ranks = [_read_rank(r, p, problems) for r, p in rank_dirs]
        loose = [n for n in (MODEL_FILE, OPTIMIZER_FILE, TRAINER_STATE_FILE) if (path / n).exists()]
        if loose:
            problems.append(f"{path}: holds both rank_NNNNNN/ folders and {', '.join(loose)}; InfiniTrain reads only "
                            "the rank folders of a parallel run")
    else:
        ranks = [_read_rank(None, path, problems)]
    folder = CheckpointFolder(path=path, step=step, ranks=ranks, problems=problems)
    _check_consistency(folder)
    return folder


def _read_rank(rank: int | None, directory: Path, problems: list[str]) -> RankCheckpoint:
    out = RankCheckpoint(rank=rank, directory=directory)
    for attr, name, reader, required in (("model", MODEL_FILE, read_state_file, True),
                                         ("optimizer", OPTIMIZER_FILE, read_state_file, False),
                                         ("trainer_state", TRAINER_STATE_FILE, read_trainer_state, True)):
        file = directory / name
        if not file.exists():
            if required:
                problems.append(f"{directory}: has no {name}")
            continue
        try:
            setattr(out, attr, reader(file))
        except FormatError as e:
            problems.append(str(e))
    if out.trainer_state is not None and out.trainer_state.missing:
        problems.append(f"{out.trainer_state.path}: has no {', '.join(out.trainer_state.missing)} (InfiniTrain would "
                        "read its default)")
    return out


def _check_consistency(folder: CheckpointFolder) -> None:
    states = [(r, r.trainer_state) for r in folder.ranks if r.trainer_state is not None]
    if not states:
        return
    first = states[0][1]
    _check_trainer_states_agree(folder, states)
    _check_trainer_state_values(folder, first)
    if not folder.parallel:
        if first.world_size != 1:
            folder.problems.append(f"{folder.path}: the trainer state's topology {first.topology} is {first.world_size} "
                                   "ranks, but the folder holds one rank's files and no rank_NNNNNN/ folders")
        return
    _check_rank_folders(folder, first)
    _check_stage_tensors(folder, first)


def _check_trainer_states_agree(folder: CheckpointFolder, states: list[tuple[RankCheckpoint, TrainerState]]) -> None:
    """Every rank's trainer state says what the first one says (consumed_batches may differ)."""
    first_rank, first = states[0]
    for r, st in states[1:]:
        differ = [k for k in TRAINER_STATE_KEYS if st.values[k] != first.values[k] and k != "consumed_batches"]
        if differ:
            k = differ[0]
            folder.problems.append(f"{st.path}: {k} is {st.values[k]}, but rank {first_rank.rank}'s trainer state says "
                                   f"{first.values[k]}")


def _check_trainer_state_values(folder: CheckpointFolder, first: TrainerState) -> None:
    """The step matches the folder's name; sp_size is one InfiniTrain writes."""
    if folder.step is not None and first.values["global_step"] != folder.step:
        folder.problems.append(f"{first.path}: global_step is {first.values['global_step']}, but the folder is named "
                               f"for step {folder.step}")
    v = first.values
    if v["sp_size"] not in (1, v["tp_size"]):
        folder.problems.append(f"{first.path}: sp_size is {v['sp_size']}, but InfiniTrain writes 1 or tp_size "
                               f"({v['tp_size']})")


def _check_rank_folders(folder: CheckpointFolder, first: TrainerState) -> None:
    """Every rank the topology names has its folder, and no folder is beyond it."""
    world = first.world_size
    have = {r.rank for r in folder.ranks}
    absent = [r for r in range(world) if r not in have]
    extra = sorted(r for r in have if r >= world)
    if absent:
        folder.problems.append(f"{folder.path}: the trainer state's topology {first.topology} is {world} ranks, but "
                               f"rank_{absent[0]:06d}/" + (f" (and {len(absent) - 1} more)" if len(absent) > 1 else "")
                               + " is missing")
    if extra:
        folder.problems.append(f"{folder.path}: holds rank_{extra[0]:06d}/, but the trainer state's topology "
                               f"{first.topology} has only ranks 0..{world - 1}")


def _check_stage_tensors(folder: CheckpointFolder, first: TrainerState) -> None:
    # Ranks of one pipeline stage (rank // (TP x DP)) hold the same tensors; TP shards share names and shapes.
    v = first.values
    per_stage = int(v["tp_size"] * v["ddp_size"]) or 1
    for kind in ("model", "optimizer"):
        stages: dict[int, RankCheckpoint] = {}
        for r in folder.ranks:
            state = getattr(r, kind)
            if state is None or r.rank >= first.world_size:
                continue
            stage = r.rank // per_stage
            if stage not in stages:
                stages[stage] = r
                continue
            _compare_stage_tensors(folder.problems, stages[stage].rank, getattr(stages[stage], kind), state)


def _compare_stage_tensors(problems: list[str], ref_rank: int, ref: StateFile, state: StateFile) -> None:
    """`state` holds the tensors `ref` (rank `ref_rank`, same stage) holds, with the same shapes."""
    ref_shapes = {e.name: e.shape for e in ref.entries}
    shapes = {e.name: e.shape for e in state.entries}
    missing = [n for n in ref_shapes if n not in shapes]
    added = [n for n in shapes if n not in ref_shapes]
    if missing:
        problems.append(f"{state.path}: has no tensor {missing[0]}, which rank {ref_rank} of the same "
                        f"pipeline stage holds" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if added:
        problems.append(f"{state.path}: holds tensor {added[0]}, which rank {ref_rank} of the same "
                        "pipeline stage does not")
    for n in ref_shapes:
        if n in shapes and shapes[n] != ref_shapes[n]:
            problems.append(f"{state.path}: tensor {n} has shape {list(shapes[n])}, rank {ref_rank}'s "
                            f"{list(ref_shapes[n])}")
            break
