"""Matrix TOML: every wrong shape of input is one CaseError naming the file and the key."""

from __future__ import annotations

import pytest

from lockstep.cases.matrix import builtin_matrices, load_matrix, parse_matrix
from lockstep.cli import main
from lockstep.errors import CaseError, LockstepError

DEFAULTS = '[defaults]\nmodel = "gpt2"\nseq_len = 64\nsteps = 2\nlr = 1e-4\n'
CASE = '[[case]]\nname = "a"\ndtype = "float32"\nmicro_batch = 4\ntotal_batch = 256\n'


def test_builtin_matrices_load():
    counts = {n: len(load_matrix(n)) for n in builtin_matrices()}
    assert counts["gpt2"] == 6 and counts["gpt2_parallel"] == 6 and len(counts) >= 2


def test_integer_lr_is_a_number():
    assert parse_matrix(DEFAULTS.replace("1e-4", "1") + CASE, "m.toml")[0].lr == 1.0


@pytest.mark.parametrize("text, key", [
    (DEFAULTS + CASE.replace("micro_batch = 4", 'micro_batch = "4"'), "micro_batch = '4' is a string"),
    (DEFAULTS + CASE.replace("micro_batch = 4", "micro_batch = true"), "micro_batch = True is a boolean"),
    (DEFAULTS + CASE.replace('name = "a"', "name = 3"), "[[case]] #1: name = 3 is an integer"),
    (DEFAULTS.replace("lr = 1e-4", 'lr = "fast"') + CASE, "lr = 'fast' is a string"),
    (DEFAULTS.replace("steps = 2", "steps = 2.5") + CASE, "steps = 2.5 is a number, but steps must be an integer"),
    ("defaults = 3\n" + CASE, "defaults is an integer, but it must be a table"),
    ('case = [1, 2]\n' + DEFAULTS, "case is an array holding non-tables"),
    ('case = "x"\n' + DEFAULTS, "case is a string"),
    (DEFAULTS + "[extra]\nx = 1\n" + CASE, "unknown top-level key(s) 'extra'"),
    ("[default]\nx = 1\n" + CASE, "unknown top-level key(s) 'default'"),
    (DEFAULTS + "batch = 8\n" + CASE, "unknown key(s) 'batch' in [defaults]"),
    (DEFAULTS + CASE + "micro_bach = 8\n", "case a: unknown field(s) micro_bach"),
    (DEFAULTS.replace('"gpt2"', '"gpt3"') + CASE, "case a: model 'gpt3' is not a registered model (known: gpt2, gpt2-tiny"),
    (DEFAULTS.replace('model = "gpt2"\n', "") + CASE, "case a: missing field(s) model"),
    (DEFAULTS + CASE + "ep = 2\n", "case a: expert parallelism splits the data-parallel ranks, so ep=2 must divide dp=1"),
    (DEFAULTS + CASE + "ep = 0\n", "case a: ep is 0, must be at least 1"),
])
def test_wrong_types_and_unknown_keys_name_the_file_and_key(text, key):
    with pytest.raises(CaseError) as info:
        parse_matrix(text, "my.toml")
    msg = str(info.value)
    assert msg.startswith("my.toml: ") and key in msg and "\n" not in msg


@pytest.mark.parametrize("content, problem", [
    (b"\xff\xfe[defaults]\n", "is not UTF-8 text: byte 0xff at offset 0"),
    (b"[[case]\n", "not valid TOML"),
])
def test_unreadable_matrix_files(tmp_path, content, problem):
    path = tmp_path / "m.toml"
    path.write_bytes(content)
    with pytest.raises(LockstepError, match=problem) as info:
        load_matrix(str(path))
    assert str(path) in str(info.value)


def test_a_directory_is_not_a_matrix(tmp_path):
    with pytest.raises(LockstepError, match="is a directory, not a case matrix"):
        load_matrix(str(tmp_path))


def test_cli_bad_matrix_is_one_line_exit_1(tmp_path, capsys):
    path = tmp_path / "m.toml"
    path.write_text("defaults = 3\n" + CASE)
    assert main(["run", "--matrix", str(path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lockstep: error: ") and str(path) in err[0] and "defaults" in err[0]


def test_a_lora_target_that_names_no_layer_is_refused_at_plan_time():
    lora = '[case.lora]\nrank = 4\nalpha = 8.0\ntarget_modules = ["c_attn", "q_proj"]\n'
    with pytest.raises(CaseError) as info:
        parse_matrix(DEFAULTS + CASE + lora, "my.toml")
    msg = str(info.value)
    assert msg.startswith("my.toml: case a: lora target_modules: q_proj names no linear layer of gpt2")
    assert "c_attn" not in msg.split("of gpt2")[0].split(":")[-1]
    good = parse_matrix(DEFAULTS + CASE + lora.replace(', "q_proj"', ""), "my.toml")
    assert good[0].lora.target_modules == ("c_attn",)
