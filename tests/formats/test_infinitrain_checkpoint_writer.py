"""lockstep's writer of InfiniTrain's native checkpoint (diagnose --at-step's --load folder): its
bytes are those of the C++ writer (tests/support/infinitrain_checkpoint.py, written from
checkpoint.cc), its trainer_state.json reads back as InfiniTrain's key extractor reads it, and the
folder reads back as a complete checkpoint."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from lockstep.formats.infinitrain_checkpoint import (TRAINER_STATE_KEYS, read_checkpoint_folder, read_state_file,
                                                     read_trainer_state, state_file_bytes, trainer_state_text,
                                                     write_checkpoint_folder, write_state_file)
from tests.support import infinitrain_checkpoint as cpp

WEIGHT = np.arange(6, dtype=np.float32).reshape(2, 3) / 8
MOMENTS = {"adam.m.0": WEIGHT * 2, "adam.v.0": WEIGHT ** 2, "adam.t": np.array(3, dtype=np.int64)}
STATE = dict(n_layer=12, n_head=12, n_kv_head=12, n_embd=768, vocab_size=50304, global_step=3, consumed_batches=60,
             last_lr=1e-4, ddp_size=1, tp_size=1, sp_size=1, pp_size=1)


def test_model_and_optimizer_bytes_are_the_cpp_writers(tmp_path):
    model = {"transformer.h.0.attn.c_attn.weight": WEIGHT, "transformer.h.0.attn.c_attn.bias": WEIGHT[0]}
    assert state_file_bytes(model) == cpp.state_file_bytes(model)
    assert state_file_bytes(MOMENTS) == cpp.state_file_bytes(MOMENTS)  # a 0-d INT64 adam.t: ndim 0, 8 bytes
    write_state_file(tmp_path / "optimizer.ckpt", MOMENTS)
    assert (tmp_path / "optimizer.ckpt").read_bytes() == cpp.state_file_bytes(MOMENTS)
    head = struct.pack("<I", 6) + b"adam.t" + struct.pack("<bI", 8, 0) + struct.pack("<Q", 8) + struct.pack("<q", 3)
    assert state_file_bytes({"adam.t": MOMENTS["adam.t"]})[12:] == head
    read = read_state_file(tmp_path / "optimizer.ckpt")
    assert read.names == list(MOMENTS) and np.array_equal(read.array(read.entry("adam.m.0")), WEIGHT * 2)
    # Negative control: an FP64 tensor is not silently narrowed, and a different value is different bytes.
    with pytest.raises(ValueError, match="dtype float64 is not written"):
        state_file_bytes({"w": WEIGHT.astype(np.float64)})
    assert state_file_bytes({"w": WEIGHT}) != cpp.state_file_bytes({"w": WEIGHT + np.float32(2.0 ** -20)})


def test_trainer_state_reads_back_as_infinitrains_and_every_key_is_written(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text(trainer_state_text(STATE))
    import json

    assert json.loads(path.read_text()) == STATE  # valid JSON, unlike b24d92f's own writer
    back = read_trainer_state(path)
    assert back.values == STATE and back.missing == ()
    # What InfiniTrain itself writes (no comma after vocab_size) reads to the same values.
    path.write_text(cpp.trainer_state_text(**STATE))
    assert read_trainer_state(path).values == STATE
    # Negative control: a key left out would be InfiniTrain's silent fallback, so the writer refuses.
    with pytest.raises(ValueError, match="trainer state without consumed_batches"):
        trainer_state_text({k: v for k, v in STATE.items() if k != "consumed_batches"})
    assert list(TRAINER_STATE_KEYS) == list(STATE)


def test_the_folder_is_a_complete_one_rank_checkpoint(tmp_path):
    folder = write_checkpoint_folder(tmp_path / "root", 3, {"w": WEIGHT}, STATE)
    assert folder == tmp_path / "root" / "checkpoint_step_000003"
    assert sorted(p.name for p in folder.iterdir()) == ["model.ckpt", "trainer_state.json"]  # SGD: no optimizer.ckpt
    read = read_checkpoint_folder(folder)
    assert read.problems == [] and read.step == 3 and read.trainer_state.values == STATE
    with_adam = write_checkpoint_folder(tmp_path / "adam", 3, {"w": WEIGHT}, STATE, optimizer=MOMENTS)
    assert read_checkpoint_folder(with_adam).ranks[0].optimizer.names == list(MOMENTS)
    # Negative control: a folder whose trainer state says another step is a problem the reader names.
    wrong = write_checkpoint_folder(tmp_path / "wrong", 4, {"w": WEIGHT}, STATE)
    assert read_checkpoint_folder(wrong).problems == [
        f"{wrong / 'trainer_state.json'}: global_step is 3, but the folder is named for step 4"]
