"""JUnit XML from the real comparison's output: one testcase per (case, framework), counts that
match the verdicts, parsed back with xml.etree."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from lockstep.cli import main
from lockstep.compare import compare_run_dir
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record
from lockstep.history import HistoryStore
from lockstep.report.junit import cases_from_comparisons, write_junit


def write(path, fw, case, losses, dtype="float32"):
    write_run_record(path, RunRecord(framework=fw, case=case, meta={"case_spec": {"dtype": dtype}},
                                     steps=[StepRecord(step=i + 1, loss=v, tokens_per_s=100.0)
                                            for i, v in enumerate(losses)]))


def make_run(run):
    base = [11.0, 10.8, 10.6]
    for case in ("a", "b", "c_bf16"):
        write(run / "pytorch" / f"{case}.jsonl", "pytorch", case, base, "bfloat16" if case == "c_bf16" else "float32")
    write(run / "megatron" / "a.jsonl", "megatron", "a", [11.0, 10.8 + 3e-8, 10.6])  # PASS
    write(run / "megatron" / "b.jsonl", "megatron", "b", [11.0, 10.8 + 2e-5, 10.6 + 5e-5])  # FAIL at step 3
    write(run / "infinitrain" / "a.jsonl", "infinitrain", "a", [11.0, 10.8, 10.6 + 1e-6])  # PASS
    (run / "run.json").write_text(json.dumps({"baseline": "pytorch", "skipped": [
        {"case": "c_bf16", "framework": "megatron", "reason": "BF16 on CPU"},
        {"case": "b", "framework": "infinitrain", "reason": "needs 8 devices"},
        {"case": "c_bf16", "framework": "infinitrain", "reason": "BF16 on CPU"}]}))
    return run


def test_junit_counts_and_failure_text(tmp_path):
    run = make_run(tmp_path / "run")
    summary = compare_run_dir(run, "pytorch")
    path = tmp_path / "junit.xml"
    write_junit(path, cases_from_comparisons(summary["comparisons"]))
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    assert {k: root.get(k) for k in ("tests", "failures", "errors", "skipped")} == \
        {"tests": "6", "failures": "1", "errors": "0", "skipped": "3"}
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert sorted(suites) == ["infinitrain vs pytorch", "megatron vs pytorch"]
    meg = suites["megatron vs pytorch"]
    assert (meg.get("tests"), meg.get("failures"), meg.get("skipped")) == ("3", "1", "1")
    names = [(tc.get("classname"), tc.get("name")) for tc in root.iter("testcase")]
    assert len(names) == len(set(names)) == 6  # one testcase per (case, framework)
    failure = meg.find("testcase[@name='b']/failure")
    assert failure.get("message").startswith(
        "FAIL unexplained: max |Δloss| 5.000e-05 at step 3 exceeds 1.000e-05 (first failing step 2); ")
    assert meg.find("testcase[@name='c_bf16']/skipped").get("message") == "BF16 on CPU"
    assert meg.find("testcase[@name='a']/failure") is None


def test_compare_cli_writes_junit_and_history(tmp_path, capsys, private_history):
    run = make_run(tmp_path / "run")
    junit = tmp_path / "compare.xml"
    rc = main(["compare", str(run / "pytorch"), str(run / "megatron"), "--junit", str(junit)])
    capsys.readouterr()
    assert rc == 1
    root = ET.parse(junit).getroot()
    # the framework dirs sit in a run dir whose run.json lists c_bf16 as skipped on megatron
    assert {k: root.get(k) for k in ("tests", "failures", "errors", "skipped")} == \
        {"tests": "3", "failures": "1", "errors": "0", "skipped": "1"}
    (hist_run,) = HistoryStore(private_history).runs()
    assert hist_run.kind == "compare" and hist_run.passed is False
    res = {(r.case, r.framework): r for r in hist_run.results}
    assert res[("b", "megatron")].verdict == "FAIL unexplained" and res[("b", "megatron")].max_diff_step == 3
    assert res[("c_bf16", "megatron")].verdict == "SKIPPED"

    rc = main(["compare", str(run / "pytorch"), str(run / "megatron"), "--no-history"])
    capsys.readouterr()
    assert len(HistoryStore(private_history).runs()) == 1


def test_junit_follows_the_strict_schema_layout(tmp_path):
    """xunit2 / Jenkins junit-10.xsd: testsuites > testsuite > testcase, whose only children are
    skipped, error, failure, system-out, system-err; the counts are integers that add up."""
    run = make_run(tmp_path / "run")
    path = tmp_path / "junit.xml"
    write_junit(path, cases_from_comparisons(compare_run_dir(run, "pytorch")["comparisons"]))
    root = ET.parse(path).getroot()
    for suite in root:
        assert suite.tag == "testsuite" and suite.get("name")
        cases = list(suite)
        assert all(tc.tag == "testcase" and tc.get("name") and tc.get("classname") for tc in cases)
        assert int(suite.get("tests")) == len(cases)
        for tc in cases:
            assert {child.tag for child in tc} <= {"skipped", "error", "failure", "system-out", "system-err"}
            assert sum(child.tag in ("skipped", "error", "failure") for child in tc) <= 1
    assert int(root.get("tests")) == sum(int(s.get("tests")) for s in root)
    assert "max_abs_diff: 3.000e-08" in root.find(".//testcase[@name='a'][@classname='lockstep.megatron']/system-out").text


def test_a_one_framework_run_compared_nothing_so_it_exits_1_and_junit_says_so(tmp_path, capsys, tiny_checkpoint,
                                                                               tiny_shakespeare_train):
    # issue 36, item 10: a pytorch-only run with --junit wrote tests="0" and exited 0.
    junit = tmp_path / "junit.xml"
    rc = main(["run", "--frameworks", "pytorch", "--cases", "gpt2_1", "--steps", "1", "--llmc", str(tiny_checkpoint),
               "--data", str(tiny_shakespeare_train), "--device", "cpu", "--no-certify", "--no-report",
               "--out", str(tmp_path / "o"), "--junit", str(junit)])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 1
    assert ("RAN: pytorch only (one framework): nothing was compared; name a framework to compare it with "
            "(--frameworks pytorch,megatron) or --repeat N to compare its repeats") in out
    root = ET.parse(junit).getroot()
    assert (root.get("tests"), root.get("errors"), root.get("failures")) == ("1", "1", "0")
    error = root.find("testsuite/testcase/error")
    assert error.get("message") == ("nothing was compared: one framework ran alone: no test framework was compared "
                                    "with the baseline")


def test_junit_of_a_comparison_that_judged_something_has_no_nothing_compared_error(tmp_path):
    # Negative control of the test above, and the other way to compare nothing: every pair skipped.
    summary = compare_run_dir(make_run(tmp_path / "run"), "pytorch")
    assert all(c.name != "(comparison)" for c in cases_from_comparisons(summary["comparisons"]))
    skipped_only = [{"baseline_framework": "pytorch", "test_framework": "megatron", "cases": [],
                     "skipped": [{"case": "a", "reason": "BF16 on CPU"}]}]
    cases = cases_from_comparisons(skipped_only)
    assert [(c.name, c.outcome) for c in cases] == [("a", "skipped"), ("(comparison)", "error")]
    assert cases[-1].message == "nothing was compared: no case ran on both the baseline and a test framework"
    assert cases_from_comparisons([], nothing_compared_is_error=False) == []
