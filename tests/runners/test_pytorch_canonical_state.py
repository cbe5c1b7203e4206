"""The reference's saved state read back under canonical names (runners/pytorch/canonical_state.py):
what another framework writes into its own format to start from it (diagnose --at-step)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.errors import RunError
from lockstep.formats.tokens import write_token_stream
from lockstep.models import FAMILIES
from lockstep.models.init import write_initial_checkpoint
from lockstep.models.llama3.config import Llama3Config
from lockstep.runners.base import RunInputs
from lockstep.runners.pytorch import PyTorchRunner
from lockstep.runners.pytorch.canonical_state import read_canonical_state
from lockstep.runners.pytorch.checkpoint import CheckpointPlan, SavePlan, step_dir

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

SMALL_LLAMA = Llama3Config(max_seq_len=64, vocab_size=2048, num_layers=2, num_heads=4, num_kv_heads=2, channels=64)


def test_the_state_after_step_3_reads_back_as_the_run_final_weights_and_adams_state(tmp_path):
    ckpt, tokens = tmp_path / "llama.bin", tmp_path / "tokens.bin"
    write_initial_checkpoint(ckpt, FAMILIES["llama3"], SMALL_LLAMA, seed=42)
    write_token_stream(tokens, np.random.default_rng(0).integers(0, SMALL_LLAMA.vocab_size, size=2000))
    case = CaseSpec(name="adam", model="llama3", dtype="float32", micro_batch=2, seq_len=32, total_batch=64, steps=3,
                    lr=1e-3)
    root = tmp_path / "state"
    inputs = RunInputs(checkpoint=ckpt, tokens=tokens, model=SMALL_LLAMA, device="cpu", save_final_params=True,
                       extra={"pytorch_checkpoints": CheckpointPlan(save=SavePlan(str(root), interval=3))})
    record = PyTorchRunner().run(case, inputs, tmp_path / "out")
    assert record.ok, record.error

    state = read_canonical_state(str(step_dir(root, 3)), 3, case, str(ckpt))
    final = np.load(tmp_path / "out" / "pytorch" / "adam.final.npz")
    assert sorted(state.weights) == sorted(final.files) and len(final.files) == 17
    for name in final.files:  # bitwise: the weights the run ended with
        assert np.array_equal(state.weights[name], final[name]), name
    assert state.step == 3 and state.adam_step == 3
    assert sorted(state.exp_avg) == sorted(state.exp_avg_sq) == sorted(final.files)
    assert all(np.all(state.exp_avg_sq[n] >= 0) and np.any(state.exp_avg[n] != 0) for n in final.files)
    # Moments that match their weights' shapes, under the same canonical name.
    assert all(state.exp_avg[n].shape == final[n].shape for n in final.files)

    # The state of another step is refused, naming the folder.
    with pytest.raises(RunError, match="holds step 3"):
        read_canonical_state(str(step_dir(root, 3)), 2, dataclasses.replace(case), str(ckpt))
