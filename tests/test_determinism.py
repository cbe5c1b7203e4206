"""`lockstep run --repeat N`'s bitwise determinism check on injected records (the real run is in
tests/commands/test_run_repeat.py)."""

from __future__ import annotations

import math

from lockstep.determinism import analyse_repeats, repeat_dir
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record


def write(out, k, fw, case, losses, dtype="float32"):
    write_run_record(repeat_dir(out, k) / fw / f"{case}.jsonl",
                     RunRecord(framework=fw, case=case, meta={"case_spec": {"dtype": dtype}},
                               steps=[StepRecord(step=i + 1, loss=v) for i, v in enumerate(losses)]))


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


def test_baseline_spread_beyond_the_threshold_is_said(tmp_path):
    write(tmp_path, 1, "pytorch", "gpt2_1", [10.9, 10.8])
    write(tmp_path, 2, "pytorch", "gpt2_1", [10.9, 10.8 + 3e-5])
    (w,) = analyse_repeats(tmp_path, [("pytorch", "gpt2_1")], 2, baseline="pytorch").warnings()
    assert "up to 3.000e-05 (step 2)" in w and "exceeds the float32 threshold 1e-05" in w
