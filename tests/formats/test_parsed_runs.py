"""formats.logs.ParsedRuns: a run's files parsed once, a file written again read again."""

from __future__ import annotations

import os

from lockstep.formats import logs
from lockstep.formats.logs import ParsedRuns

LINE = "step    1/2 | train loss 10.980000 | lr 1.00e-04 | (12.34 ms | 20746 tok/s)\n"


def test_a_file_is_parsed_once_until_it_changes(tmp_path, monkeypatch):
    path = tmp_path / "gpt2_1.log"
    path.write_text(LINE)
    calls = []
    parse = logs.parse_log_file
    monkeypatch.setattr(logs, "parse_log_file", lambda p, **k: calls.append(p) or parse(p, **k))
    files = ParsedRuns()
    first = files.load(path)
    assert files.load(path) is first and len(calls) == 1
    assert first.steps[0].loss == 10.98
    path.write_text(LINE + LINE.replace("step    1/2", "step    2/2").replace("10.98", "10.50"))
    os.utime(path, ns=(1, 1))  # a different time as well as a different size
    assert [s.loss for s in files.load(path).steps] == [10.98, 10.5] and len(calls) == 2
