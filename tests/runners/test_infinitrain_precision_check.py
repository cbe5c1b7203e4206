"""InfiniTrain's module-output dumps (`--precision_check`) read back under canonical names.

The file names are those b24d92f's CPU build wrote for gpt2-tiny (2 layers, accumulation 2, so
every module also has a second-call `_1` file) on 2026-11-30."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lockstep.runners.infinitrain.precision_check import (canonical_output_name, precision_check_flag,
                                                          read_module_outputs)

MODULES = ["TransformerFirstStage", "TransformerChunk", "TransformerLastStage", "Transformer", "CrossEntropyLoss",
           "lm_head", "transformer.wte", "transformer.wpe", "transformer.ln_f"] + [
    f"transformer.h.{i}{sub}" for i in range(2)
    for sub in ("", ".ln_1", ".attn", ".attn.c_attn", ".attn.c_proj", ".ln_2", ".mlp", ".mlp.c_fc", ".mlp.gelu",
                ".mlp.c_proj")]


def dumps(tmp_path: Path) -> Path:
    rank0 = tmp_path / "pc" / "20261130_091404" / "rank_0"
    rank0.mkdir(parents=True)
    for k, module in enumerate(MODULES):
        for call in (0, 1):
            suffix = f"_{call}" if call else ""
            np.save(rank0 / f"{module}{suffix}_forward.npy", np.full((2, 3), k + 0.5 * call, dtype=np.float32))
            np.save(rank0 / f"{module}{suffix}_backward.npy", np.zeros((2, 3), dtype=np.float32))
    return tmp_path / "pc"


def test_first_call_module_outputs_map_to_canonical_names(tmp_path):
    got = read_module_outputs(dumps(tmp_path))
    expected = {"embedding": "TransformerFirstStage", "lnf": "transformer.ln_f", "logits": "lm_head"}
    for i in range(2):
        expected |= {f"ln1[{i}]": f"transformer.h.{i}.ln_1", f"attproj[{i}]": f"transformer.h.{i}.attn.c_proj",
                     f"ln2[{i}]": f"transformer.h.{i}.ln_2", f"mlp[{i}]": f"transformer.h.{i}.mlp",
                     f"block[{i}]": f"transformer.h.{i}"}
    assert set(got) == set(expected)
    for name, module in expected.items():  # the first call's file (the first micro batch), never `_1`
        assert got[name][0, 0] == MODULES.index(module), name


def test_names_that_are_not_module_outputs_lockstep_compares_map_to_nothing():
    assert canonical_output_name("transformer.h.0.ln_1") == "ln1[0]"  # the module ln_1, not a 2nd call
    for other in ("transformer.h.0.ln_1_1", "transformer.h.0_1", "lm_head_1", "transformer.h.0.mlp.gelu",
                  "transformer.wte", "CrossEntropyLoss", "TransformerChunk"):
        assert canonical_output_name(other) is None, other


def test_no_dumps_is_no_outputs_and_the_flag_names_the_path(tmp_path):
    assert read_module_outputs(tmp_path / "absent") == {}
    assert precision_check_flag(Path("/x/y")) == "--precision_check=level=1,save_tensors=true,path=/x/y"
