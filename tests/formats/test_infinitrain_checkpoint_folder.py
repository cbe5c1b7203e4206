"""InfiniTrain's native checkpoint folder: read byte-exactly, every problem one sentence, and its
model written back as LLMC equal to the weights it was made from."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct

import numpy as np
import pytest

from lockstep.cli import main
from lockstep.errors import FormatError
from lockstep.formats.detect import INFINITRAIN_CHECKPOINT, detect
from lockstep.formats.infinitrain_checkpoint import (read_checkpoint_folder, read_infinitrain_checkpoint,
                                                     read_state_file, read_trainer_state)
from lockstep.fsutil import sha256_file
from lockstep.models import FAMILIES
from lockstep.models.family import split_canonical
from lockstep.runners.infinitrain.convert import convert_infinitrain_checkpoint
from lockstep.runners.infinitrain.families.gpt2 import _GPT2_LAYER, _GPT2_TOP
from tests.support.infinitrain_checkpoint import adam_state, state_file_bytes, trainer_state_text, write_checkpoint

SHAPE = dict(n_layer=2, n_head=12, n_kv_head=12, n_embd=96, vocab_size=50257)
LINEAR = {"weight": np.arange(6, dtype=np.float32).reshape(2, 3) / 8, "bias": np.array([-1.5, 0.25], dtype=np.float32)}


def state(step=30, consumed=120, **topology) -> dict:
    return dict(global_step=step, consumed_batches=consumed, last_lr=1e-4, **SHAPE, **topology)


def test_state_file_bytes_are_the_cpp_writers():
    raw = state_file_bytes(LINEAR)
    expected = (b"CKPT" + struct.pack("<II", 1, 2)
                + struct.pack("<I", 6) + b"weight" + struct.pack("<bI", 11, 2) + struct.pack("<qq", 2, 3)
                + struct.pack("<Q", 24) + LINEAR["weight"].tobytes()
                + struct.pack("<I", 4) + b"bias" + struct.pack("<bI", 11, 1) + struct.pack("<q", 2)
                + struct.pack("<Q", 8) + LINEAR["bias"].tobytes())
    assert raw == expected and len(raw) == 12 + (4 + 6 + 5 + 16 + 8 + 24) + (4 + 4 + 5 + 8 + 8 + 8) == 112
    assert hashlib.sha256(raw).hexdigest() == hashlib.sha256(expected).hexdigest()
    assert raw[:4] == struct.pack("<I", 0x54504B43)


def test_a_state_file_reads_back_every_dtype(tmp_path):
    tensors = {**LINEAR, "adam.t": np.array(7, dtype=np.int64), "half": np.array([1.5, -2], dtype=np.float16),
               "bf": np.array([0x3FC0, 0xC000], dtype=np.uint16)}  # bf16 bits of 1.5, -2.0
    path = tmp_path / "model.ckpt"
    path.write_bytes(state_file_bytes(tensors, bf16=frozenset({"bf"})))
    st = read_state_file(path)
    assert st.version == 1 and st.size == path.stat().st_size and st.names == list(tensors)
    assert [(e.name, e.dtype, e.shape) for e in st.entries] == [
        ("weight", "float32", (2, 3)), ("bias", "float32", (2,)), ("adam.t", "int64", ()), ("half", "float16", (2,)),
        ("bf", "bfloat16", (2,))]
    assert np.array_equal(st.array(st.entry("weight")), LINEAR["weight"])
    assert int(st.array(st.entry("adam.t"))) == 7
    assert st.array(st.entry("bf")).tolist() == [1.5, -2.0]
    assert set(read_infinitrain_checkpoint(path)) == {"weight", "bias"}  # the capture's reader: FP32 only


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw[:8], "truncated: 8 bytes, too short for an InfiniTrain checkpoint header (12)"),
    (lambda raw: b"KPTC" + raw[4:], "wrong magic number 0x4354504b for an InfiniTrain checkpoint"),
    (lambda raw: raw[:4] + struct.pack("<I", 2) + raw[8:], "unsupported InfiniTrain checkpoint version 2"),
    (lambda raw: raw[:-3], "truncated: tensor bias needs 8 bytes, but the file ends early (3 bytes short)"),
    (lambda raw: raw[:20], "truncated: the file ends in the middle of tensor #1 of 2's entry"),
    (lambda raw: raw[:30], "truncated: the file ends in the middle of tensor weight's entry"),
    (lambda raw: raw + b"\0", "1 trailing bytes after 2 tensors"),
    (lambda raw: raw[:22] + bytes([99]) + raw[23:], "tensor weight: unknown dtype code 99"),
    (lambda raw: raw[:43] + struct.pack("<Q", 20) + raw[51:], "tensor weight: 20 bytes stored for float32 shape [2, 3], which holds 24"),
])
def test_every_damaged_state_file_is_one_sentence(tmp_path, damage, message):
    path = tmp_path / "model.ckpt"
    path.write_bytes(damage(state_file_bytes(LINEAR)))
    with pytest.raises(FormatError) as info:
        read_state_file(path)
    assert str(info.value) == f"{path}: {message}" or (str(info.value).startswith(f"{path}: {message}"))


def test_trainer_state_is_read_as_infinitrain_reads_its_not_quite_json(tmp_path):
    text = trainer_state_text(**state(ddp_size=2, tp_size=2, sp_size=2, pp_size=2))
    assert '"vocab_size": 50257\n  "global_step": 30,' in text  # InfiniTrain's missing comma
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    path = tmp_path / "trainer_state.json"
    path.write_text(text)
    ts = read_trainer_state(path)
    assert ts.values == {"n_layer": 2, "n_head": 12, "n_kv_head": 12, "n_embd": 96, "vocab_size": 50257,
                         "global_step": 30, "consumed_batches": 120, "last_lr": 1e-4, "ddp_size": 2, "tp_size": 2,
                         "sp_size": 2, "pp_size": 2}
    assert ts.missing == () and ts.world_size == 8 and ts.topology == "DP=2 TP=2 SP=2 PP=2"
    path.write_text(text.replace('  "consumed_batches": 120,\n', ""))
    ts = read_trainer_state(path)
    assert ts.missing == ("consumed_batches",) and ts.values["consumed_batches"] == 0
    path.write_text(text.replace('"global_step": 30', '"global_step": thirty'))
    with pytest.raises(FormatError, match=r"global_step is 'thirty', not a number"):
        read_trainer_state(path)


def rank_model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"transformer.h.0.attn.c_attn.weight": rng.standard_normal((6, 4)).astype(np.float32),
            "transformer.h.0.attn.c_attn.bias": rng.standard_normal(6).astype(np.float32)}


def parallel_folder(tmp_path, dp=2, tp=2, pp=1, drop=None):
    """A DP x TP x PP folder as a parallel run saves it; `drop` = (rank, name) leaves one tensor out."""
    ranks = {}
    for r in range(dp * tp * pp):
        model = rank_model(r // (tp * dp))
        if drop and drop[0] == r:
            model.pop(drop[1])
        ranks[r] = (model, state(ddp_size=dp, tp_size=tp, sp_size=1, pp_size=pp),
                    adam_state(list(model.values()), t=30, seed=r))
    return write_checkpoint(tmp_path / "save", 30, ranks)


def test_a_complete_folder_has_no_problems(tmp_path):
    single = write_checkpoint(tmp_path / "one", 30, {None: (LINEAR, state(), adam_state(list(LINEAR.values()), 30))})
    folder = read_checkpoint_folder(single)
    assert folder.problems == [] and folder.step == 30 and not folder.parallel
    assert folder.ranks[0].optimizer.names == ["adam.m.0", "adam.v.0", "adam.m.1", "adam.v.1", "adam.t"]
    assert detect(single) == INFINITRAIN_CHECKPOINT
    par = read_checkpoint_folder(parallel_folder(tmp_path, dp=2, tp=2, pp=2))
    assert par.problems == [] and [r.rank for r in par.ranks] == list(range(8))
    assert par.trainer_state.topology == "DP=2 TP=2 SP=1 PP=2"


def test_sgd_writes_no_optimizer_file_and_that_is_complete(tmp_path):
    folder = read_checkpoint_folder(write_checkpoint(tmp_path, 10, {None: (LINEAR, state(step=10), None)}))
    assert folder.problems == [] and folder.ranks[0].optimizer is None


def test_every_folder_problem_is_one_sentence(tmp_path):
    step = parallel_folder(tmp_path, dp=2, tp=2, pp=2, drop=(5, "transformer.h.0.attn.c_attn.bias"))
    r3 = step / "rank_000003"
    (r3 / "model.ckpt").write_bytes((r3 / "model.ckpt").read_bytes()[:-5])
    shutil.rmtree(step / "rank_000007")
    (step / "rank_000006" / "trainer_state.json").write_text(trainer_state_text(**state(step=20, ddp_size=2, tp_size=2,
                                                                                         pp_size=2)))
    (step / "rank_000002" / "trainer_state.json").unlink()
    problems = read_checkpoint_folder(step).problems
    assert problems == [
        f"{step / 'rank_000002'}: has no trainer_state.json",
        f"{r3 / 'model.ckpt'}: truncated: tensor transformer.h.0.attn.c_attn.bias needs 24 bytes, but the file ends "
        "early (5 bytes short)",
        f"{step / 'rank_000006' / 'trainer_state.json'}: global_step is 20, but rank 0's trainer state says 30",
        f"{step}: the trainer state's topology DP=2 TP=2 SP=1 PP=2 is 8 ranks, but rank_000007/ is missing",
        f"{step / 'rank_000005' / 'model.ckpt'}: has no tensor transformer.h.0.attn.c_attn.bias, which rank 4 of the "
        "same pipeline stage holds",
        f"{step / 'rank_000005' / 'optimizer.ckpt'}: has no tensor adam.m.1, which rank 4 of the same pipeline stage "
        "holds (and 1 more)",
    ]


def test_a_topology_that_does_not_match_the_folder(tmp_path):
    step = write_checkpoint(tmp_path, 30, {r: (rank_model(), state(ddp_size=2), None) for r in range(3)})
    assert read_checkpoint_folder(step).problems == [
        f"{step}: holds rank_000002/, but the trainer state's topology DP=2 TP=1 SP=1 PP=1 has only ranks 0..1"]
    single = write_checkpoint(tmp_path / "s", 30, {None: (rank_model(), state(tp_size=2, sp_size=3), None)})
    assert read_checkpoint_folder(single).problems == [
        f"{single / 'trainer_state.json'}: sp_size is 3, but InfiniTrain writes 1 or tp_size (2)",
        f"{single}: the trainer state's topology DP=1 TP=2 SP=3 PP=1 is 2 ranks, but the folder holds one rank's "
        "files and no rank_NNNNNN/ folders"]
    named = write_checkpoint(tmp_path / "n", 40, {None: (rank_model(), state(step=30), None)})
    assert read_checkpoint_folder(named).problems == [
        f"{named / 'trainer_state.json'}: global_step is 30, but the folder is named for step 40"]


def test_not_a_checkpoint_and_a_save_root(tmp_path):
    with pytest.raises(FormatError, match="is a directory, but not an InfiniTrain checkpoint folder"):
        read_checkpoint_folder(tmp_path)
    for s in (10, 20):
        write_checkpoint(tmp_path, s, {None: (LINEAR, state(step=s), None)})
    with pytest.raises(FormatError, match=r"is a --save folder holding checkpoints of steps 10, 20; name one of them "
                                          r"\(e\.g\. .*checkpoint_step_000020\)"):
        read_checkpoint_folder(tmp_path)


def test_inspect_prints_header_tensors_state_and_topology(tmp_path, capsys):
    step = write_checkpoint(tmp_path, 30, {None: (LINEAR, state(), adam_state(list(LINEAR.values()), 30))})
    assert main(["inspect", str(step)]) == 0
    out = capsys.readouterr().out
    assert "InfiniTrain checkpoint of step 30, one rank — valid" in out
    assert "model.ckpt: magic CKPT, version 1, 2 tensors, 112 bytes" in out
    assert "topology: DP=1 TP=1 SP=1 PP=1 (1 rank(s))" in out and "global_step" in out and "consumed_batches" in out
    assert "weight" in out and "float32" in out and "2×3" in out and "3.1250e-01" in out  # mean of 0..5 / 8
    assert main(["inspect", "--json", str(step)]) == 0
    doc = json.loads(capsys.readouterr().out)
    w = doc["ranks"][0]["model"]["tensors"][0]
    assert (w["name"], w["dtype"], w["shape"], w["min"], w["max"], w["mean"]) == ("weight", "float32", [2, 3], 0.0,
                                                                                   0.625, 0.3125)
    assert doc["valid"] and doc["topology"] == "DP=1 TP=1 SP=1 PP=1" and doc["ranks"][0]["trainer_state"]["global_step"] == 30


def test_inspect_of_a_broken_folder_exits_1_with_each_problem(tmp_path, capsys):
    step = parallel_folder(tmp_path, drop=(1, "transformer.h.0.attn.c_attn.weight"))
    assert main(["inspect", str(step)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == (f"lockstep: error: {step / 'rank_000001' / 'model.ckpt'}: has no tensor "
                      "transformer.h.0.attn.c_attn.weight, which rank 0 of the same pipeline stage holds")
    # and its optimizer's state: one parameter fewer, so adam.m.1/adam.v.1 are gone and adam.m.0 is the bias's
    assert err[1:] == [
        f"lockstep: error: {step / 'rank_000001' / 'optimizer.ckpt'}: has no tensor adam.m.1, which rank 0 of the same "
        "pipeline stage holds (and 1 more)",
        f"lockstep: error: {step / 'rank_000001' / 'optimizer.ckpt'}: tensor adam.m.0 has shape [6], rank 0's [6, 4]"]


def infinitrain_names(tensors: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
    """LLMC tensors under InfiniTrain's GPT-2 module names, wte cut to V rows as InfiniTrain holds it."""
    w = split_canonical(tensors, config)
    top = {llmc: it for it, llmc in _GPT2_TOP.items()}
    layer = {llmc: it for it, llmc in _GPT2_LAYER.items()}
    out = {top[n]: w[n] for n in ("wpe", "lnfw", "lnfb")}
    out[top["wte"]] = w["wte"][: config.vocab_size]
    for i in range(config.num_layers):
        for llmc, it in layer.items():
            out[f"transformer.h.{i}.{it}"] = w[f"{llmc}[{i}]"]
    out["lm_head.weight"] = w["wte"][: config.vocab_size]  # the tied copy a build may save
    return out


def test_convert_writes_the_weights_it_was_given_as_llmc(tmp_path, tiny_checkpoint, capsys):
    fam = FAMILIES["gpt2"]
    ckpt = fam.load(tiny_checkpoint)
    config = ckpt.config
    model = infinitrain_names(ckpt.tensors, config)
    ts = dict(global_step=30, consumed_batches=30, last_lr=1e-4, n_layer=config.num_layers, n_head=config.num_heads,
              n_kv_head=config.num_heads, n_embd=config.channels, vocab_size=config.vocab_size)
    step = write_checkpoint(tmp_path / "save", 30, {r: (model, {**ts, "ddp_size": 2}, None) for r in range(2)})
    out = tmp_path / "model.bin"
    assert main(["convert", "--from-infinitrain", str(step), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "left out    lm_head.weight (no LLMC tensor)" in printed
    # padding rows V..Vp-1 come back as zeros, which is what llm.c's init writes there
    assert sha256_file(out) == sha256_file(tiny_checkpoint)
    assert out.read_bytes() == tiny_checkpoint.read_bytes()
    again = tmp_path / "like.bin"
    convert_infinitrain_checkpoint(step, again, like=tiny_checkpoint)
    assert again.read_bytes() == tiny_checkpoint.read_bytes()


def test_convert_refuses_what_it_cannot_write(tmp_path, tiny_checkpoint):
    fam = FAMILIES["gpt2"]
    ckpt = fam.load(tiny_checkpoint)
    config = ckpt.config
    model = infinitrain_names(ckpt.tensors, config)
    ts = dict(global_step=30, consumed_batches=30, last_lr=1e-4, n_layer=config.num_layers, n_head=config.num_heads,
              n_kv_head=config.num_heads, n_embd=config.channels, vocab_size=config.vocab_size)
    out = tmp_path / "out.bin"
    tp = write_checkpoint(tmp_path / "tp", 30, {r: (model, {**ts, "tp_size": 2}, None) for r in range(2)})
    with pytest.raises(FormatError, match="its topology DP=1 TP=2 SP=1 PP=1 shards the model over ranks; converting "
                                          "a TP or PP checkpoint"):
        convert_infinitrain_checkpoint(tp, out)
    short = dict(model)
    short.pop("transformer.h.1.mlp.c_fc.weight")
    gap = write_checkpoint(tmp_path / "gap", 30, {None: (short, ts, None)})
    with pytest.raises(FormatError, match=r"model\.ckpt: has no tensor for LLMC fcw\[1\]"):
        convert_infinitrain_checkpoint(gap, out)
    wrong = write_checkpoint(tmp_path / "wrong", 30, {None: (model, {**ts, "n_layer": 3}, None)})
    with pytest.raises(FormatError, match="trainer_state.json: n_layer is 3, but the model shape asked for has 2"):
        convert_infinitrain_checkpoint(wrong, out, model="gpt2-tiny")
    broken = write_checkpoint(tmp_path / "broken", 30, {None: (model, ts, None)})
    (broken / "trainer_state.json").unlink()
    with pytest.raises(FormatError, match="not a complete checkpoint: .*has no trainer_state.json"):
        convert_infinitrain_checkpoint(broken, out)
    assert not out.exists()  # nothing half-written
