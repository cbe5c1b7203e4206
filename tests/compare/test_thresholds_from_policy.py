"""Every consumer of a loss threshold asks the verdict policy (compare/policy.py's
`loss_threshold`): compare, the certificate's step-1 loss, diagnose's drift, golden files and the
determinism warnings judge one case at one threshold."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from lockstep.compare.policy import SP_FP32_THRESHOLD, THRESHOLDS, loss_threshold
from lockstep.determinism import DeterminismReport, PairDeterminism
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record
from lockstep.golden import record_golden

SRC = Path(__file__).resolve().parents[2] / "src" / "lockstep"
POLICY = SRC / "compare" / "policy.py"
POLICY_CONSTANTS = {"THRESHOLDS", "SP_FP32_THRESHOLD", "MEGATRON_LM_GPT2_FP32_THRESHOLD"}


def constants_read(source: str) -> set[str]:
    """The policy's threshold constants a module's code names (imports and uses; not strings)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in POLICY_CONSTANTS:
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in POLICY_CONSTANTS:
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            names |= {a.name for a in node.names if a.name in POLICY_CONSTANTS}
    return names


def test_no_module_but_the_policy_reads_the_threshold_table():
    readers = {str(p.relative_to(SRC)): constants_read(p.read_text()) for p in SRC.rglob("*.py") if p != POLICY}
    assert {p: n for p, n in readers.items() if n} == {}


def test_the_scan_sees_a_planted_direct_read():
    planted = "from lockstep.compare.policy import THRESHOLDS\nlimit = THRESHOLDS['float32']\n"
    assert constants_read(planted) == {"THRESHOLDS"}
    assert constants_read("import lockstep.compare.policy as p\nx = p.SP_FP32_THRESHOLD\n") == {"SP_FP32_THRESHOLD"}
    assert constants_read("limit = loss_threshold('c', 'float32')[0]  # THRESHOLDS\n") == set()


def test_the_policy_answers_without_records():
    assert loss_threshold("gpt2_1", "float32") == (THRESHOLDS["float32"], "default")
    assert loss_threshold("gpt2_1_bfloat16", "bfloat16") == (THRESHOLDS["bfloat16"], "default")
    assert loss_threshold("qwen3_tp8_sp_fp32", "float32")[0] == SP_FP32_THRESHOLD


def write(path: Path, case: str, losses: list[float], dtype: str = "float32") -> None:
    write_run_record(path, RunRecord(framework="pytorch", case=case, meta={"case_spec": {"dtype": dtype}},
                                     steps=[StepRecord(step=i + 1, loss=v) for i, v in enumerate(losses)]))


def test_golden_files_take_the_policy_threshold_of_each_case(tmp_path):
    run = tmp_path / "ref"
    for case in ("gpt2_1", "qwen3_tp8_sp_fp32"):
        write(run / "pytorch" / f"{case}.jsonl", case, [10.9, 10.7])
    (run / "run.json").write_text(json.dumps({"baseline": "pytorch"}))
    golden = record_golden([run])
    for case in ("gpt2_1", "qwen3_tp8_sp_fp32"):
        expected = loss_threshold(case, "float32")[0]
        assert golden["cases"][case]["threshold"] == expected
        assert [s["tolerance"] for s in golden["cases"][case]["steps"]] == [expected, expected]
    assert golden["cases"]["qwen3_tp8_sp_fp32"]["threshold"] == SP_FP32_THRESHOLD  # as compare judges it


@pytest.mark.parametrize("case, beyond", [("gpt2_1", True), ("qwen3_tp8_sp_fp32", False)])
def test_determinism_warnings_measure_against_the_policy_threshold(case, beyond):
    pair = PairDeterminism("pytorch", case, repeats=2, bitwise_identical=False, max_abs_diff=1e-3, max_diff_step=2,
                           max_diff_repeat=2, dtype="float32")
    (warning,) = DeterminismReport(2, "pytorch", [pair]).warnings()
    assert ("exceeds the float32 threshold" in warning) is beyond, warning
