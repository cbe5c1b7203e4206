"""A golden file is validated when read: each tampered input is refused in one sentence naming
the file, the case and the key, exit 1 (issue 36 item 6); golden values record their environment
and a failing check names what changed; records without golden values are said, not dropped;
`golden record --update` shows old -> new."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from lockstep.cli import main
from lockstep.golden import check_run_dir, read_golden, record_golden, write_golden

from test_golden import LOSSES, REPEAT2, write

ENV = {"device_name": "NVIDIA H200", "driver_version": "580.65.06", "cuda_version": "13.0",
       "torch_version": "2.11.0+cu130", "megatron_core_version": "0.16.1", "lockstep_commit": "a" * 40,
       "checkpoint_sha256": "c" * 64, "data_sha256": "d" * 64}


@pytest.fixture
def golden_file(tmp_path):
    ref = tmp_path / "ref"
    write(ref / "megatron" / "gpt2_1.jsonl", "megatron", "gpt2_1", LOSSES, meta=ENV)
    write(ref / "repeats" / "2" / "megatron" / "gpt2_1.jsonl", "megatron", "gpt2_1", REPEAT2, meta=ENV)
    (ref / "run.json").write_text(json.dumps({"baseline": "megatron"}))
    path = tmp_path / "golden.json"
    write_golden(path, record_golden([ref]))
    return path


def _tamper(path, edit) -> None:
    golden = json.loads(path.read_text())
    edit(golden["cases"]["gpt2_1"])
    path.write_text(json.dumps(golden))


def _step(key, value):
    def edit(case):
        case["steps"][1][key] = value
    return edit


def _set(key, value):
    def edit(case):
        case[key] = value
    return edit


TAMPERED = {
    "inf tolerance": (_step("tolerance", float("inf")), 'case gpt2_1, step 2: "tolerance" is Infinity; it must be a '
                                                        'finite number'),
    "1e9 tolerance": (_step("tolerance", 1e9), 'case gpt2_1, step 2: "tolerance" is 1000000000.0, not max(threshold, '
                                               'k x spread) = 1.000e-05 as golden record writes it'),
    "negative tolerance": (_step("tolerance", -1e-5), 'case gpt2_1, step 2: "tolerance" is -1e-05, below the float32 '
                                                      'threshold 1e-05 golden record never goes under'),
    "1e9 spread to match": (lambda c: c["steps"][1].update(spread=1e9, tolerance=3e9),
                            'case gpt2_1, step 2: "spread" is 1000000000.0; repeats\' losses spread from 0 up to the '
                            'loss itself (10.71)'),
    "no steps": (_set("steps", []), 'case gpt2_1: "steps" is []; it must list at least one step'),
    "text mean": (_step("mean", "10.71"), 'case gpt2_1, step 2: "mean" is "10.71"; it must be a finite number'),
    "null mean": (_step("mean", None), 'case gpt2_1, step 2: "mean" is null; it must be a finite number'),
    "step not a number": (_step("step", "two"), 'case gpt2_1, steps[1]: "step" is "two"; it must be a step number '
                                                '>= 1, once per case'),
}


@pytest.mark.parametrize("name", sorted(TAMPERED))
def test_a_tampered_golden_file_is_refused_in_one_sentence(tmp_path, golden_file, capsys, name):
    run = tmp_path / "run"
    write(run / "megatron" / "gpt2_1.jsonl", "megatron", "gpt2_1", LOSSES, meta=ENV)
    assert main(["golden", "check", str(run), "--golden", str(golden_file)]) == 0  # the untampered file judges
    capsys.readouterr()
    edit, sentence = TAMPERED[name]
    _tamper(golden_file, edit)
    rc = main(["golden", "check", str(run), "--golden", str(golden_file)])
    captured = capsys.readouterr()
    assert rc == 1 and "PASS" not in captured.out and "Traceback" not in captured.err
    assert captured.err.strip().splitlines() == [f"lockstep: error: {golden_file}: {sentence}"]


def test_a_failing_check_names_what_changed_in_the_environment(tmp_path, golden_file, capsys):
    moved = [v + (3e-5 if i == 3 else 0.0) for i, v in enumerate(LOSSES)]
    same = tmp_path / "same"
    write(same / "megatron" / "gpt2_1.jsonl", "megatron", "gpt2_1", moved, meta=ENV)
    assert main(["golden", "check", str(same), "--golden", str(golden_file)]) == 1
    [v] = check_run_dir(read_golden(golden_file), same)
    assert v.message.endswith("; nothing of the recorded environment changed") and v.environment_changes == ()

    upgraded = tmp_path / "upgraded"
    write(upgraded / "megatron" / "gpt2_1.jsonl", "megatron", "gpt2_1", moved,
          meta={**ENV, "megatron_core_version": "0.17.0", "driver_version": "590.10"})
    rc = main(["golden", "check", str(upgraded), "--golden", str(golden_file), "--junit", str(tmp_path / "g.xml")])
    assert rc == 1
    [v] = check_run_dir(read_golden(golden_file), upgraded)
    assert v.message.endswith("; driver 580.65.06 -> 590.10 and megatron-core 0.16.1 -> 0.17.0 since the golden "
                              "values were recorded")
    assert v.environment_changes == ("driver 580.65.06 -> 590.10", "megatron-core 0.16.1 -> 0.17.0")
    failure = ET.parse(tmp_path / "g.xml").getroot().find(".//testcase[@name='gpt2_1']/failure")
    assert "megatron-core 0.16.1 -> 0.17.0 since the golden values were recorded" in failure.get("message")

    # A run within tolerance passes whatever changed: the environment is said only when values move.
    write(upgraded / "megatron" / "gpt2_1.jsonl", "megatron", "gpt2_1", LOSSES,
          meta={**ENV, "megatron_core_version": "0.17.0"})
    assert main(["golden", "check", str(upgraded), "--golden", str(golden_file)]) == 0


def test_records_without_golden_values_are_named_and_fail_the_check(tmp_path, golden_file, capsys):
    run = tmp_path / "run"
    write(run / "megatron" / "gpt2_1.jsonl", "megatron", "gpt2_1", LOSSES, meta=ENV)
    write(run / "megatron" / "gpt2_2.jsonl", "megatron", "gpt2_2", LOSSES, meta=ENV)
    write(run / "pytorch" / "gpt2_2_bfloat16.jsonl", "pytorch", "gpt2_2_bfloat16", LOSSES, "bfloat16")
    rc = main(["golden", "check", str(run), "--golden", str(golden_file)])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 1
    assert "2 record(s) not judged (no golden values for them): megatron/gpt2_2, pytorch/gpt2_2_bfloat16" in out
    assert "PASS" in out  # gpt2_1 itself was judged, and passed


def test_record_update_shows_old_and_new_and_refuses_a_silent_overwrite(tmp_path, golden_file, capsys):
    ref2 = tmp_path / "ref2"
    new_env = {**ENV, "megatron_core_version": "0.17.0"}
    write(ref2 / "megatron" / "gpt2_1.jsonl", "megatron", "gpt2_1", [v + (2e-5 if i == 4 else 0) for i, v in
                                                                       enumerate(LOSSES)], meta=new_env)
    (ref2 / "run.json").write_text(json.dumps({"baseline": "megatron"}))
    before = golden_file.read_bytes()
    rc = main(["golden", "record", str(ref2), "--out", str(golden_file)])
    assert rc == 1 and golden_file.read_bytes() == before
    assert "golden record --update replaces it" in capsys.readouterr().err

    assert main(["golden", "record", str(ref2), "--out", str(golden_file), "--update"]) == 0
    out = capsys.readouterr().out
    assert "~ gpt2_1: megatron-core 0.16.1 -> 0.17.0, 2 of 5 steps changed" in out
    assert "step 3: mean 10.5200020 -> 10.5200000 (-2.000e-06), tolerance 1.2e-05 -> 1.0e-05" in out
    assert "step 5: mean 10.3100000 -> 10.3100200 (+2.000e-05), tolerance 1.0e-05 -> 1.0e-05" in out
    assert json.loads(golden_file.read_text())["cases"]["gpt2_1"]["environment"]["megatron_core"] == "0.17.0"


def test_a_schema_1_file_without_environment_is_read_and_says_so(tmp_path, golden_file, capsys):
    golden = json.loads(golden_file.read_text())
    golden["schema"] = 1
    del golden["cases"]["gpt2_1"]["environment"]
    golden_file.write_text(json.dumps(golden))
    run = tmp_path / "run"
    write(run / "megatron" / "gpt2_1.jsonl", "megatron", "gpt2_1", [v + 1e-3 for v in LOSSES], meta=ENV)
    assert main(["golden", "check", str(run), "--golden", str(golden_file)]) == 1
    [v] = check_run_dir(read_golden(golden_file), run)
    assert v.message.endswith("; the golden file does not record its environment (golden record --update records it)")


def test_records_state_the_software_golden_values_compare():
    import importlib.metadata

    import torch

    from lockstep.runners.base import software_environment

    env = software_environment()
    assert env["megatron_core_version"] == importlib.metadata.version("megatron-core")
    assert env["cuda_version"] == torch.version.cuda  # None on this CPU build
    assert set(env) == {"cuda_version", "driver_version", "megatron_core_version"}


def test_an_infinitrain_rebuild_with_other_flags_is_named(tmp_path):
    """The framework's commit and build flags are compared when the record is of the framework
    the golden values came from; CMakeCache.txt is read from the build dir the record names."""
    from lockstep.formats.run_record import read_run_record
    from lockstep.golden.environment import changes, environment_of

    def build(name, build_type):
        d = tmp_path / name
        d.mkdir()
        (d / "CMakeCache.txt").write_text(f"CMAKE_BUILD_TYPE:STRING={build_type}\nUSE_CUDA:BOOL=ON\n"
                                          "SOMETHING_ELSE:STRING=x\n")
        return str(d)

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write(a, "infinitrain", "gpt2_1", LOSSES, meta={**ENV, "infinitrain_commit": "1" * 40,
                                                     "infinitrain_build": build("b1", "Release")})
    write(b, "infinitrain", "gpt2_1", LOSSES, meta={**ENV, "infinitrain_commit": "2" * 40,
                                                     "infinitrain_build": build("b2", "Debug")})
    ea, eb = environment_of(read_run_record(a)), environment_of(read_run_record(b))
    assert ea["build_flags"].endswith("(CMAKE_BUILD_TYPE=Release USE_CUDA=ON)")
    said = changes(ea, eb)
    assert said[0] == "infinitrain commit 111111111111 -> 222222222222"
    assert said[1].startswith("infinitrain build flags ") and "(CMAKE_BUILD_TYPE=Debug USE_CUDA=ON)" in said[1]
    # another framework's record: its own commit is no change of the golden values' framework
    c = tmp_path / "c.jsonl"
    write(c, "megatron", "gpt2_1", LOSSES, meta=ENV)
    assert changes(ea, environment_of(read_run_record(c))) == []


def _spec(steps: int, lr: float = 1e-4) -> dict:
    return {"case_spec": {"dtype": "float32", "steps": steps, "lr": lr, "total_batch": 256, "seq_len": 64}}


LONG = [10.98 - 0.05 * i for i in range(10)]


def _golden_of_three_steps(tmp_path):
    ref = tmp_path / "ref3"
    write(ref / "pytorch" / "gpt2_1.jsonl", "pytorch", "gpt2_1", LONG[:3], meta={**ENV, **_spec(3)})
    path = tmp_path / "golden3.json"
    write_golden(path, record_golden([ref], "pytorch"))
    return path


def test_a_longer_run_than_the_golden_values_is_not_judged_by_its_first_steps(tmp_path, capsys):
    golden = _golden_of_three_steps(tmp_path)
    run = tmp_path / "run10"
    write(run / "infinitrain" / "gpt2_1.jsonl", "infinitrain", "gpt2_1", LONG, meta={**ENV, **_spec(10)})
    rc = main(["golden", "check", str(run), "--golden", str(golden)])
    out = capsys.readouterr().out
    assert rc == 1 and "PASS" not in out and "ERROR" in out
    [v] = check_run_dir(read_golden(golden), run)
    assert v.outcome == "error"
    assert "not the run the golden values were recorded from (steps 10 vs 3 in the golden file; inputs digest" in \
        v.message


def test_a_record_without_a_spec_is_still_told_apart_by_its_steps(tmp_path):
    golden = _golden_of_three_steps(tmp_path)
    run = tmp_path / "bare"
    write(run / "infinitrain" / "gpt2_1.jsonl", "infinitrain", "gpt2_1", LONG)  # a spec without steps, no digest
    [v] = check_run_dir(read_golden(golden), run)
    assert v.outcome == "error"
    assert "(10 steps vs 3 in the golden file, which has no values for steps 4..10;" in v.message


def test_other_hyper_parameters_are_named_and_the_same_run_passes(tmp_path):
    golden = _golden_of_three_steps(tmp_path)
    run = tmp_path / "lr"
    write(run / "infinitrain" / "gpt2_1.jsonl", "infinitrain", "gpt2_1", LONG[:3], meta={**ENV, **_spec(3, lr=3e-4)})
    [v] = check_run_dir(read_golden(golden), run)
    assert v.outcome == "error" and "lr 0.0003 vs 0.0001 in the golden file" in v.message
    write(run / "infinitrain" / "gpt2_1.jsonl", "infinitrain", "gpt2_1", LONG[:3], meta={**ENV, **_spec(3)})
    [v] = check_run_dir(read_golden(golden), run)
    assert v.outcome == "passed"
