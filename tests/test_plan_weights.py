"""`lockstep run --llmc FILE`: a checkpoint holding NaN or Inf is refused before anything trains,
naming the tensor; non-finite GPT-2 padding rows are said, not refused (issue 17)."""

from __future__ import annotations

import numpy as np
import pytest

from lockstep.cli import main
from lockstep.models import FAMILIES, SHAPES
from lockstep.models.init import init_tensors


def write_tiny(path, damage=None):
    cfg = SHAPES["gpt2-tiny"].config
    fam = FAMILIES["gpt2"]
    tensors = {k: np.array(v) for k, v in init_tensors(cfg, fam.init_rule(cfg), seed=1).items()}
    if damage:
        damage(tensors, cfg)
    fam.write(path, cfg, tensors)
    return path


def test_nan_in_a_weight_is_refused_naming_the_tensor(tmp_path, capsys):
    def nan_in_ln2b(t, cfg):
        t["ln2b"][1, 5] = np.nan

    ckpt = write_tiny(tmp_path / "nan.bin", nan_in_ln2b)
    rc = main(["run", "--llmc", str(ckpt), "--cases", "gpt2_1", "--frameworks", "pytorch", "--steps", "1",
               "--device", "cpu", "--out", str(tmp_path / "out"), "--no-history"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.strip() == (f"lockstep: error: {ckpt}: tensor ln2b holds 1 NaN and 0 infinite value(s); "
                           "no framework can train from it")
    assert not (tmp_path / "out" / "pytorch").exists()


def test_inf_in_padding_rows_is_said_not_refused():
    from lockstep.plan import check_finite_weights

    def inf_in_padding(t, cfg):
        t["wte"][cfg.vocab_size + 3, 0] = np.inf

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        ckpt = write_tiny(Path(d) / "pad.bin", inf_in_padding)
        notes = check_finite_weights(FAMILIES["gpt2"], str(ckpt))
    assert len(notes) == 1 and "wte padding rows 50257.. hold non-finite values" in notes[0]
