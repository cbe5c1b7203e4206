"""What the report says: verdict cells per framework and case, expected skips apart from
problems, why a case was not compared, run-wide start/finish, and the model shape that ran."""

from __future__ import annotations

import json
import re
from pathlib import Path

from lockstep.compare.metadata import collect_run_metadata, model_label
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record
from lockstep.report import gather, write_report
from lockstep.report import tables

LOSSES = [5.3 - 0.05 * i for i in range(6)]
TINY = {"family": "gpt2", "max_seq_len": 1024, "vocab_size": 50257, "num_layers": 2, "num_heads": 12,
        "channels": 96, "padded_vocab_size": 50304}


def put(run: Path, fw: str, case: str, losses: list[float], started: str, finished: str, dtype: str = "float32"):
    spec = {"name": case, "model": "gpt2", "dtype": dtype, "micro_batch": 4, "seq_len": 64, "total_batch": 256,
            "steps": len(losses), "lr": 1e-4}
    write_run_record(run / fw / f"{case}.jsonl", RunRecord(
        fw, case, [StepRecord(i + 1, x, 256.0, 1000.0) for i, x in enumerate(losses)],
        meta={"case_spec": spec, "model": TINY, "started_at": started, "finished_at": finished}))


def make_run(run: Path, manifest_model: dict | None) -> Path:
    put(run, "pytorch", "gpt2_1", LOSSES, "2026-11-30T05:00:10+00:00", "2026-11-30T05:00:20+00:00")
    put(run, "pytorch", "gpt2_1_bfloat16", LOSSES, "2026-11-30T05:00:20+00:00", "2026-11-30T05:00:30+00:00",
        "bfloat16")
    put(run, "pytorch", "gpt2_2", LOSSES, "2026-11-30T05:00:30+00:00", "2026-11-30T05:00:40+00:00")
    put(run, "megatron", "gpt2_1", LOSSES, "2026-11-30T05:00:05+00:00", "2026-11-30T05:01:00+00:00")
    put(run, "megatron", "gpt2_2", [x + (1e-3 if i == 2 else 0) for i, x in enumerate(LOSSES)],
        "2026-11-30T05:01:00+00:00", "2026-11-30T05:02:00+00:00")
    manifest = {"frameworks": ["pytorch", "megatron"], "skipped": [
        {"case": "gpt2_1_bfloat16", "framework": "megatron", "reason": "megatron-core's bf16 needs CUDA"},
        {"case": "gpt2_8", "framework": "pytorch", "reason": "needs 8 devices"},
        {"case": "gpt2_8", "framework": "megatron", "reason": "needs 8 devices"}]}
    if manifest_model is not None:
        manifest["model"] = manifest_model
    (run / "run.json").write_text(json.dumps(manifest))
    return run


def test_verdict_cells_per_framework_and_case(tmp_path):
    data = gather(make_run(tmp_path / "run", {"name": "gpt2-tiny", **TINY}))
    col = tables.VERDICT_HEADER.index("verdict")
    cells = {(row[0], row[1]): row[col] for row in tables.verdict_rows(data)}
    assert cells == {("megatron", "gpt2_1"): "PASS", ("megatron", "gpt2_2"): "FAIL unexplained",
                     ("megatron", "gpt2_1_bfloat16"): "SKIPPED", ("megatron", "gpt2_8"): "SKIPPED"}
    assert tables.overall_line(data).startswith("FAIL: 1 passed, 1 failed (1 unexplained), 0 missing, 0 errors, 2 skipped")


def test_skips_are_listed_apart_from_problems_with_their_reason(tmp_path):
    run = make_run(tmp_path / "run", {"name": "gpt2-tiny", **TINY})
    data = gather(run)
    assert tables.problem_lines(data) == []
    assert tables.skipped_lines(data) == ["pytorch / gpt2_8: skipped (needs 8 devices)",
                                          "megatron / gpt2_1_bfloat16: skipped (megatron-core's bf16 needs CUDA)",
                                          "megatron / gpt2_8: skipped (needs 8 devices)"]
    assert data.not_compared_reason("gpt2_1_bfloat16") == "megatron skipped (megatron-core's bf16 needs CUDA)"
    html_path, md_path = write_report(run)
    md = md_path.read_text()
    assert "## Problems" not in md and "## Skipped (expected, with the reason)" in md
    assert "- megatron / gpt2_1_bfloat16: skipped (megatron-core's bf16 needs CUDA)" in md
    # gpt2_8 ran nowhere: no figure, the reason instead.
    assert "### gpt2_8\n\nnot run: pytorch skipped (needs 8 devices); megatron skipped (needs 8 devices)" in md
    assert "report_files/gpt2_8.png" not in md and (run / "report_files" / "gpt2_1_bfloat16.png").is_file()
    html = html_path.read_text()
    assert "<h2>Problems</h2>" not in html
    # The rendered cells, row by row: framework, case ... verdict.
    rows = re.findall(r"<tr><td>(\w+)</td><td>(\w+)</td>.*?<td class=\"(\w+)\">([\w ]+)</td>", html)
    assert {(fw, case): (cls, text) for fw, case, cls, text in rows} == {
        ("megatron", "gpt2_1"): ("PASS", "PASS"), ("megatron", "gpt2_2"): ("FAIL", "FAIL unexplained"),
        ("megatron", "gpt2_1_bfloat16"): ("SKIPPED", "SKIPPED"), ("megatron", "gpt2_8"): ("SKIPPED", "SKIPPED")}


def test_start_and_finish_span_all_records_and_the_model_shape_is_named(tmp_path):
    run = make_run(tmp_path / "run", {"name": "gpt2-tiny", **TINY})
    meta = collect_run_metadata(run)
    assert meta["started_at"] == "2026-11-30T05:00:05+00:00" and meta["finished_at"] == "2026-11-30T05:02:00+00:00"
    assert meta["frameworks"]["pytorch"]["started_at"] == "2026-11-30T05:00:10+00:00"
    assert meta["frameworks"]["pytorch"]["finished_at"] == "2026-11-30T05:00:40+00:00"
    assert meta["frameworks"]["megatron"]["finished_at"] == "2026-11-30T05:02:00+00:00"
    rows = dict(tables.metadata_rows(gather(run)))
    assert rows["model"] == "gpt2-tiny (gpt2: L=2 NH=12 C=96 V=50257 maxT=1024)"


def test_model_shape_from_an_older_run_json_or_the_records(tmp_path):
    # run.json of an older lockstep: the shape without its name.
    assert model_label(collect_run_metadata(make_run(tmp_path / "a", TINY))["model"]) == \
        "gpt2: L=2 NH=12 C=96 V=50257 maxT=1024"
    # No model in run.json: the records' shape.
    assert model_label(collect_run_metadata(make_run(tmp_path / "b", None))["model"]) == \
        "gpt2: L=2 NH=12 C=96 V=50257 maxT=1024"


def test_where_the_time_went(tmp_path):
    run = make_run(tmp_path / "run", {"name": "gpt2-tiny", **TINY})
    manifest = json.loads((run / "run.json").read_text())
    manifest["timing"] = {"total_s": 21.4, "stages": {"plan": 0.9, "runs": 18.2, "certificates": 0.4, "report": 1.1},
                          "pairs": [{"framework": "megatron", "case": "gpt2_1", "wall_s": 9.8, "step1_capture_s": 0.31,
                                     "phases": {"start-up": 1.97, "weights": 0.5, "data": 0.01, "training": 7.0,
                                                "teardown": 0.32}}]}
    (run / "run.json").write_text(json.dumps(manifest))
    data = gather(run)
    assert tables.timing_rows(data) == [["megatron", "gpt2_1", "9.8", "1.97", "0.50", "0.01", "7.00", "0.32", "0.31"]]
    assert tables.timing_note(data).startswith("lockstep run took 21.4 s (plan 0.9 s, runs 18.2 s, certificates 0.4 s, "
                                               "report 1.1 s)")
    html_path, md_path = write_report(run)
    assert "## Where the time went" in md_path.read_text() and "<h2>Where the time went</h2>" in html_path.read_text()
    manifest.pop("timing")
    (run / "run.json").write_text(json.dumps(manifest))
    assert "Where the time went" not in write_report(run)[1].read_text()  # an older run says nothing


def test_the_step1_certificates_are_in_both_reports(tmp_path):
    # issue 36, item 13: the terminal showed each pair's certificate, report.html and report.md did not.
    from lockstep.certify.certificate import Certificate, certificate_path, write_certificate
    from lockstep.certify.classify import GRADIENT_ONLY, Finding
    from lockstep.certify.tensors import FORWARD, GRADIENT, TensorDiff

    run = make_run(tmp_path / "run", {"name": "gpt2-tiny", **TINY})
    worst = {"forward": TensorDiff("lnf", FORWARD, 1e-7, 3.2e-7, 1.0, 8.0, (4, 64, 96)),
             "gradient": TensorDiff("wte", GRADIENT, 1e-9, 4.5e-7, 1.0, 2.0, (50304, 96))}
    write_certificate(certificate_path(run / "megatron", "gpt2_1"), Certificate(
        "gpt2_1", "pytorch", "megatron", tolerance=1e-5, worst=worst, compared={"forward": 27, "gradient": 26}))
    ln1b = TensorDiff("ln1b[0]", GRADIENT, 1e-3, 2.0e-2, 0.99, 1.0, (96,))
    write_certificate(certificate_path(run / "megatron", "gpt2_2"), Certificate(
        "gpt2_2", "pytorch", "megatron", tolerance=1e-5, worst={**worst, "gradient": ln1b},
        compared={"forward": 27, "gradient": 26},
        findings=[Finding(GRADIENT_ONLY, "ln1b[0]", "gradient of ln1b[0] only: the backward kernel of ln1[0]")]))
    data = gather(run)
    rows = {(r[0], r[1]): r[2:] for r in tables.certificate_rows(data)}
    assert rows == {
        ("megatron", "gpt2_1"): ["holds", "27 forward, 26 gradient", "forward 3.2e-07 (lnf); gradient 4.5e-07 (wte)",
                                 "1e-05", "none"],
        ("megatron", "gpt2_2"): ["differs", "27 forward, 26 gradient",
                                 "forward 3.2e-07 (lnf); gradient 2.0e-02 (ln1b[0])", "1e-05",
                                 "gradient of ln1b[0] only: the backward kernel of ln1[0]"]}
    html_path, md_path = write_report(run, history_path=None, data=data)
    html, md = html_path.read_text(), md_path.read_text()
    assert "<h2>Step-1 certificates</h2>" in html and "## Step-1 certificates" in md
    for text in (html, md):
        assert "gradient of ln1b[0] only: the backward kernel of ln1[0]" in text
        assert "gradient 2.0e-02 (ln1b[0])" in text and "gradient 4.5e-07 (wte)" in text
    # Negative control: a run without certificates (--no-certify) has no such section.
    for cert in run.glob("megatron/*.certificate.json"):
        cert.unlink()
    data = gather(run)
    assert tables.certificate_rows(data) == []
    html_path, md_path = write_report(run, history_path=None, data=data)
    assert "Step-1 certificates" not in html_path.read_text() and "Step-1 certificates" not in md_path.read_text()


def _one_framework_run(run: Path, manifest: dict) -> Path:
    put(run, "pytorch", "gpt2_1", LOSSES, "2026-11-30T05:00:10+00:00", "2026-11-30T05:00:20+00:00")
    (run / "run.json").write_text(json.dumps({"frameworks": ["pytorch"], "baseline": "pytorch",
                                              "cases": [{"name": "gpt2_1"}, {"name": "gpt2_2"}], **manifest}))
    return run


def test_resume_verdicts_are_a_table_in_both_reports_and_no_heading_stands_above_an_empty_table(tmp_path):
    run = _one_framework_run(tmp_path / "run", {"status": "finished", "verdict_lines": [
        "OK: pytorch only, its resumes compared with the runs that saved them | 0 PASS"]})
    sentence = "resume broken (optimizer state lost): max |dloss| 0.0123 at step 5 after step 3"
    (run / "summary.json").write_text(json.dumps({"comparisons": [], "resumes": [
        {"framework": "pytorch", "case": "gpt2_1_resume", "resume_case": "gpt2_1", "verdict": "resume broken",
         "resume_from": 3, "sentence": sentence, "passed": False},
        {"framework": "pytorch", "case": "gpt2_2_resume", "resume_case": "gpt2_2", "verdict": None,
         "error": "gpt2_2.jsonl: the uninterrupted run failed", "passed": False}]}))
    data = gather(run)
    assert tables.resume_rows(data) == [
        ["pytorch", "gpt2_1_resume", "gpt2_1 (step 3)", "resume broken", sentence],
        ["pytorch", "gpt2_2_resume", "gpt2_2", "ERROR", "gpt2_2.jsonl: the uninterrupted run failed"]]
    html_path, md_path = write_report(run, data=data)
    md, page = md_path.read_text(), html_path.read_text()
    assert "## Resumes" in md and f"| pytorch | gpt2_1_resume | gpt2_1 (step 3) | resume broken | {sentence.replace('|', chr(92) + '|')} |" in md
    assert "<h2>Resumes</h2>" in page and "resume broken (optimizer state lost)" in page
    # One framework: nothing compared across frameworks, so no Verdicts heading above an empty table.
    assert "## Verdicts" not in md and "<h2>Verdicts</h2>" not in page


def test_a_run_killed_without_a_word_or_still_running_is_said_so(tmp_path):
    import os
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that is no process any more: the run was SIGKILLed
    run = _one_framework_run(tmp_path / "killed", {"status": "running", "pid": dead.pid})
    line = tables.interrupted_line(gather(run))
    assert line == ("DID NOT FINISH: run.json says the run is running, but its process (pid "
                    f"{dead.pid}) is gone: it was killed (SIGKILL, out of memory, a lost machine); this report "
                    "covers the cases that finished, 1 (case, framework) pair(s) did not: pytorch/gpt2_2.")
    _, md_path = write_report(run)
    assert f"**{line}**" in md_path.read_text() and "not run: pytorch did not finish" in md_path.read_text()
    live = _one_framework_run(tmp_path / "live", {"status": "running", "pid": os.getpid()})
    assert tables.interrupted_line(gather(live)) == (
        f"STILL RUNNING: the run (pid {os.getpid()}) has not ended; this report covers the cases finished so far, "
        "1 (case, framework) pair(s) have not: pytorch/gpt2_2.")
    done = _one_framework_run(tmp_path / "done", {"status": "finished", "pid": dead.pid})
    assert tables.interrupted_line(gather(done)) is None
