"""`lockstep run --repeat N`: the bitwise determinism check, on injected records and on a real
gpt2-tiny pytorch run."""

from __future__ import annotations

import json
import math

import numpy as np

from lockstep.cli import main
from lockstep.determinism import analyse_repeats, repeat_dir
from lockstep.formats.run_record import RunRecord, StepRecord, read_run_record, write_run_record
from lockstep.formats.tokens import write_token_stream
from lockstep.history import HistoryStore


def write(out, k, fw, case, losses):
    write_run_record(repeat_dir(out, k) / fw / f"{case}.jsonl",
                     RunRecord(framework=fw, case=case, steps=[StepRecord(step=i + 1, loss=v)
                                                               for i, v in enumerate(losses)]))


def test_injected_non_determinism_is_found(tmp_path):
    losses = [10.98, 10.712345678901234, 10.52]
    for k in (1, 2, 3):
        write(tmp_path, k, "megatron", "gpt2_1", losses)
        # pytorch's repeat 3 is one ulp off at step 2; repeat 2 is identical
        write(tmp_path, k, "pytorch", "gpt2_1",
              [math.nextafter(v, math.inf) if (k == 3 and i == 1) else v for i, v in enumerate(losses)])
    write(tmp_path, 1, "pytorch", "zero", [0.0])
    write(tmp_path, 2, "pytorch", "zero", [-0.0])  # == but not the same bits
    report = analyse_repeats(tmp_path, [("pytorch", "gpt2_1"), ("megatron", "gpt2_1"), ("pytorch", "zero")], 3,
                             baseline="pytorch")
    pairs = {(p.framework, p.case): p for p in report.pairs}
    assert pairs[("megatron", "gpt2_1")].bitwise_identical and pairs[("megatron", "gpt2_1")].max_abs_diff == 0.0
    p = pairs[("pytorch", "gpt2_1")]
    assert not p.bitwise_identical and (p.max_diff_step, p.max_diff_repeat) == (2, 3)
    assert p.max_abs_diff == math.ulp(losses[1])
    zero = pairs[("pytorch", "zero")]
    assert not zero.bitwise_identical and zero.problems == ["repeat 3: " + str(repeat_dir(tmp_path, 3) / "pytorch" /
                                                                               "zero.jsonl") + ": no such file"]
    warnings = report.warnings()
    assert len(warnings) == 2 and warnings[0].startswith("baseline pytorch is not deterministic on gpt2_1: its own "
                                                         "repeats differ by up to 1.776e-15 (step 2)")
    assert report.to_json()["bitwise_identical"] is False


def test_gpt2_tiny_pytorch_repeat_2_is_bitwise_identical(tmp_path, capsys, tiny_checkpoint, private_history):
    tokens = tmp_path / "tokens.bin"
    write_token_stream(tokens, np.random.default_rng(0).integers(0, 50257, size=4000).tolist())
    out = tmp_path / "out"
    junit = tmp_path / "run.xml"
    rc = main(["run", "--frameworks", "pytorch", "--cases", "gpt2_1", "--steps", "3", "--repeat", "2",
               "--llmc", str(tiny_checkpoint), "--data", str(tokens), "--device", "cpu", "--out", str(out),
               "--no-report", "--junit", str(junit)])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    first, second = read_run_record(out / "pytorch" / "gpt2_1.jsonl"), read_run_record(out / "repeats" / "2" /
                                                                                        "pytorch" / "gpt2_1.jsonl")
    assert len(first.steps) == 3 and first.losses() == second.losses()
    det = json.loads((out / "summary.json").read_text())["determinism"]
    assert det["repeats"] == 2 and det["bitwise_identical"] is True and det["warnings"] == []
    assert det["pairs"] == [{"framework": "pytorch", "case": "gpt2_1", "repeats": 2, "bitwise_identical": True,
                             "max_abs_diff": 0.0, "max_diff_step": None, "max_diff_repeat": None, "problems": []}]
    assert "determinism over 2 repeats" in stdout
    assert json.loads((out / "summary.json").read_text())["frameworks"] == ["pytorch"]  # repeats/ is no framework
    (run,) = HistoryStore(private_history).runs()
    (row,) = run.results
    assert (row.case, row.framework, row.role, row.losses) == ("gpt2_1", "pytorch", "baseline", first.losses())
    assert row.tps_median is not None and row.tps_min <= row.tps_median <= row.tps_max
    assert junit.is_file()
