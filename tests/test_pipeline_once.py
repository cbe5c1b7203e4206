"""`lockstep run` computes each thing once: every record is parsed once across the comparison, the
report and the history (formats.logs.ParsedRuns), and summary.json is written once."""

from __future__ import annotations

import collections

import pytest

from lockstep.cli import main
from lockstep.compare import run_dir as compare_run_dir
from lockstep.formats import logs

pytestmark = pytest.mark.integration


def test_records_parsed_once_and_the_summary_written_once(tmp_path, tiny_checkpoint, tiny_shakespeare_train,
                                                          monkeypatch, capsys):
    parses, writes = collections.Counter(), []
    read = logs.read_run_record
    monkeypatch.setattr(logs, "read_run_record", lambda p, *a, **k: parses.update([str(p)]) or read(p, *a, **k))
    write = compare_run_dir.write_summary
    monkeypatch.setattr(compare_run_dir, "write_summary", lambda d, s: writes.append(d) or write(d, s))
    import lockstep.pipeline as pipeline

    monkeypatch.setattr(pipeline, "write_summary", compare_run_dir.write_summary)
    out = tmp_path / "o"
    rc = main(["run", "--cases", "gpt2_1", "--frameworks", "pytorch,pytorch-fast", "--steps", "2", "--llmc",
               str(tiny_checkpoint), "--data", str(tiny_shakespeare_train), "--device", "cpu", "--out", str(out),
               "--history", str(tmp_path / "h.db")])
    capsys.readouterr()
    assert rc == 0
    assert dict(parses) == {str(out / "pytorch" / "gpt2_1.jsonl"): 1, str(out / "pytorch-fast" / "gpt2_1.jsonl"): 1}
    assert len(writes) == 1 and (out / "summary.json").is_file() and (out / "report.html").is_file()
