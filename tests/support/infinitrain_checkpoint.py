"""InfiniTrain's native checkpoint written byte for byte as its C++ writer does (b24d92f:
infini_train/src/checkpoint/checkpoint.cc, SaveStateDict and SaveTrainerState; the folder layout
of example/gpt2/main.cc), so that lockstep's reader is tested against what InfiniTrain writes
without an InfiniTrain build. Written from reading that source, not copied."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from lockstep.formats.infinitrain_checkpoint import CKPT_MAGIC, CKPT_VERSION

# numpy dtype -> InfiniTrain DataType code (datatype.h)
CODES = {np.dtype("bool"): 0, np.dtype("uint8"): 1, np.dtype("int8"): 2, np.dtype("uint16"): 3,
         np.dtype("int16"): 4, np.dtype("uint32"): 5, np.dtype("int32"): 6, np.dtype("uint64"): 7,
         np.dtype("int64"): 8, np.dtype("float16"): 10, np.dtype("float32"): 11, np.dtype("float64"): 12}
BF16 = 9


def state_file_bytes(tensors: dict[str, np.ndarray], bf16: frozenset[str] = frozenset()) -> bytes:
    """magic, version, count (uint32 each); per tensor: uint32 name length, name, int8 dtype, uint32
    ndim, int64 dims, uint64 byte count, the bytes. Names in `bf16` are stored as BF16: their
    array holds the uint16 bit patterns."""
    out = [struct.pack("<III", CKPT_MAGIC, CKPT_VERSION, len(tensors))]
    for name, a in tensors.items():
        a = np.asarray(a)  # 0-d stays 0-d (adam.t); tobytes() is C order
        code = BF16 if name in bf16 else CODES[a.dtype]
        raw = name.encode()
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        out.append(struct.pack("<I", len(raw)) + raw + struct.pack("<bI", code, a.ndim)
                   + struct.pack(f"<{a.ndim}q", *a.shape) + struct.pack("<Q", len(data)) + data)
    return b"".join(out)


def trainer_state_text(global_step: int, consumed_batches: int, last_lr: float, n_layer: int, n_head: int,
                       n_kv_head: int, n_embd: int, vocab_size: int, ddp_size: int = 1, tp_size: int = 1,
                       sp_size: int = 1, pp_size: int = 1) -> str:
    """SaveTrainerState's text: its key order, two-space indent, and no comma after vocab_size (as
    InfiniTrain writes it); a double goes through `ostream <<` (6 significant digits, %g)."""
    return ("{\n"
            f'  "n_layer": {n_layer},\n  "n_head": {n_head},\n  "n_kv_head": {n_kv_head},\n'
            f'  "n_embd": {n_embd},\n  "vocab_size": {vocab_size}\n'
            f'  "global_step": {global_step},\n  "consumed_batches": {consumed_batches},\n'
            f'  "last_lr": {last_lr:g},\n  "ddp_size": {ddp_size},\n  "tp_size": {tp_size},\n'
            f'  "sp_size": {sp_size},\n  "pp_size": {pp_size}\n'
            "}\n")


def adam_state(params: list[np.ndarray], t: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Adam::StateDict: adam.m.<i>, adam.v.<i> per parameter in optimizer order, adam.t an int64 scalar."""
    rng = np.random.default_rng(seed)
    out = {}
    for i, p in enumerate(params):
        out[f"adam.m.{i}"] = rng.standard_normal(p.shape).astype(np.float32)
        out[f"adam.v.{i}"] = np.abs(rng.standard_normal(p.shape)).astype(np.float32)
    out["adam.t"] = np.array(t, dtype=np.int64)
    return out


def write_rank(directory: Path, model: dict[str, np.ndarray], state: dict, optimizer: dict[str, np.ndarray] | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.ckpt").write_bytes(state_file_bytes(model))
    if optimizer:  # Checkpoint::Save writes no file for an empty optimizer state (SGD)
        (directory / "optimizer.ckpt").write_bytes(state_file_bytes(optimizer))
    (directory / "trainer_state.json").write_text(trainer_state_text(**state))


def write_checkpoint(root: Path, step: int, ranks: dict[int | None, tuple[dict, dict, dict | None]]) -> Path:
    """root/checkpoint_step_NNNNNN/ with each rank's (model, trainer state, optimizer): rank None
    writes the files into the step folder (a run of one thread), ints into rank_NNNNNN/."""
    step_dir = root / f"checkpoint_step_{step:06d}"
    for rank, (model, state, optimizer) in ranks.items():
        write_rank(step_dir if rank is None else step_dir / f"rank_{rank:06d}", model, state, optimizer)
    return step_dir
