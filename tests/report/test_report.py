"""lockstep report: report.html is self-contained (embedded PNGs, no external references) and
report.md points at PNG files beside it."""

from __future__ import annotations

import re
from pathlib import Path

from lockstep.cli import main
from lockstep.formats.logs import infinitrain_step_line
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record
from lockstep.report import write_report

LOSSES = [5.3 - 0.05 * i for i in range(6)]


def make_run(run: Path) -> Path:
    spec = {"name": "gpt2_1", "model": "gpt2", "dtype": "float32", "micro_batch": 4, "seq_len": 64,
            "total_batch": 256, "steps": 6, "lr": 1e-4}
    meta = {"case_spec": spec, "device": "cpu", "device_name": "x86_64", "lockstep_commit": "deadbeef",
            "lockstep_version": "0.1.0", "torch_version": "2.13.0"}
    for fw, delta, tps in (("pytorch", 0.0, 1000.0), ("megatron", 0.0, 800.0)):
        steps = [StepRecord(i + 1, x + delta, 256 / tps * 1000, tps) for i, x in enumerate(LOSSES)]
        write_run_record(run / fw / "gpt2_1.jsonl",
                         RunRecord(fw, "gpt2_1", steps, meta={**meta, "framework_version": f"{fw} 1.0"}))
    # InfiniTrain: a native log only, drifting past the threshold at step 4.
    glog = "E20251021 14:16:23.511394 140590029197312 main.cc:262] "
    lines = [infinitrain_step_line(glog, i + 1, 6, x + (5e-5 if i >= 3 else 0.0), 1e-4, 300.0, 853)
             for i, x in enumerate(LOSSES)]
    (run / "infinitrain").mkdir(parents=True)
    (run / "infinitrain" / "gpt2_1.log").write_text("\n".join(lines) + "\n")
    return run


def test_write_report_produces_self_contained_html_and_markdown(tmp_path):
    run = make_run(tmp_path / "run")
    html_path, md_path = write_report(run, "pytorch")
    assert html_path == run / "report.html" and md_path == run / "report.md"
    html = html_path.read_text()
    assert html.count("data:image/png;base64,") == 1  # one figure for the one case
    # Self-contained: no external resource of any kind.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", html, re.I)
    assert "<script" not in html.lower() and "<link" not in html.lower()
    assert "http://" not in html and "https://" not in html
    # The verdict table and the metadata.
    assert "infinitrain" in html and "megatron" in html and "FAIL" in html and "PASS" in html
    assert "deadbeef" in html and "x86_64" in html and "megatron 1.0" in html

    md = md_path.read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert images == ["report_files/gpt2_1.png"]
    png = run / images[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| infinitrain | gpt2_1 |" in md and "FAIL" in md and "deadbeef" in md


def test_report_cli(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    assert main(["report", str(run), "--baseline", "megatron"]) == 0
    out = capsys.readouterr().out
    assert "report.html" in out and "report.md" in out
    assert "pytorch (baseline)" not in (run / "report.md").read_text()
    assert "megatron (baseline)" in (run / "report.md").read_text()


def test_report_cli_unknown_baseline_is_an_error_without_traceback(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    assert main(["report", str(run), "--baseline", "nope"]) == 1
    err = capsys.readouterr().err
    assert "nope" in err and "Traceback" not in err
    assert main(["report", str(tmp_path / "nowhere")]) == 2


def test_report_of_a_run_with_unreadable_records_is_written_but_exits_1_naming_each(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    junk = run / "pytorch" / "notes.jsonl"
    junk.write_text('{"tool": "another tool"}\n')  # JSON lines, but no lockstep record
    cut = run / "megatron" / "gpt2_2.jsonl"
    cut.write_bytes(b'{"type": "meta", "caf\xe9')  # not UTF-8
    assert main(["report", str(run), "--no-history"]) == 1
    out, err = capsys.readouterr()
    assert "wrote " + str(run / "report.html") in out  # the rest is still reported
    lines = err.strip().splitlines()
    assert lines[0] == (f"lockstep report: error: {cut}: is not UTF-8 text: byte 0xe9 at offset 21 (line 1) "
                        "cannot be decoded; is it a run record?")
    assert lines[1].startswith(f"lockstep report: error: {junk}: not a lockstep run record")
    assert lines[2] == (f"lockstep report: the report is incomplete: 2 file(s) of {run} could not be read or are not "
                        "lockstep records (listed above and under Problems in the report)")
    md = (run / "report.md").read_text()
    assert md.startswith("# lockstep report: run\n\n**INCOMPLETE: 2 file(s) of this run could not be read")
    assert str(junk) in md and "| infinitrain | gpt2_1 |" in md
    assert "INCOMPLETE: 2 file(s)" in (run / "report.html").read_text()


def test_a_report_html_lockstep_did_not_write_is_never_overwritten(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    mine = run / "report.html"
    mine.write_text("<html><title>my lab notes</title></html>")
    assert main(["report", str(run), "--no-history"]) == 1
    err = capsys.readouterr().err
    assert err == (f"lockstep: error: {mine}: exists and was not written by lockstep; lockstep does not overwrite it: "
                   "move it away, or report into a directory of lockstep's\n")
    assert mine.read_text() == "<html><title>my lab notes</title></html>"
    assert not (run / "report.md").exists() and not (run / "report_files").exists()  # nothing written
    mine.unlink()
    assert main(["report", str(run), "--no-history"]) == 0
    assert main(["report", str(run), "--no-history"]) == 0  # its own report: rewritten
