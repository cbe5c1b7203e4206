"""`lockstep run --repeat N` on a real gpt2-tiny pytorch run, and the run's history, JUnit and a
history file that cannot be written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lockstep.cli import main
from lockstep.formats.run_record import read_run_record
from lockstep.formats.tokens import write_token_stream
from lockstep.history import HistoryStore

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)


@pytest.fixture
def random_tokens(tmp_path):
    """Any valid GPT-2 token stream will do for determinism (no ../shared needed)."""
    tokens = tmp_path / "tokens.bin"
    write_token_stream(tokens, np.random.default_rng(0).integers(0, 50257, size=4000).tolist())
    return tokens


def test_gpt2_tiny_pytorch_repeat_2_is_bitwise_identical(tmp_path, capsys, tiny_checkpoint, random_tokens,
                                                         private_history):
    tokens = random_tokens
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
    pooled = det["pairs"][0].pop("tokens_per_s_over_repeats")
    assert det["pairs"] == [{"framework": "pytorch", "case": "gpt2_1", "repeats": 2, "bitwise_identical": True,
                             "max_abs_diff": 0.0, "max_diff_step": None, "max_diff_repeat": None, "problems": [],
                             "dtype": "float32"}]
    measured = sorted(s.tokens_per_s for r in (first, second) for s in r.steps[1:])
    assert pooled["repeats"] == 2 and pooled["pooled"]["median"] == pytest.approx(sum(measured[1:3]) / 2)
    assert pooled["repeat_medians"]["values"] == [pytest.approx(np.median([s.tokens_per_s for s in r.steps[1:]]))
                                                  for r in (first, second)]
    assert "determinism over 2 repeats" in stdout and "tok/s over repeats" in stdout
    assert json.loads((out / "summary.json").read_text())["frameworks"] == ["pytorch"]  # repeats/ is no framework
    (run,) = HistoryStore(private_history).runs()
    (row,) = run.results
    assert (row.case, row.framework, row.role, row.losses) == ("gpt2_1", "pytorch", "baseline", first.losses())
    assert row.tps_median is not None and row.tps_min <= row.tps_median <= row.tps_max
    assert junit.is_file()


def test_unusable_history_is_refused_before_anything_trains(tmp_path, capsys, tiny_checkpoint, random_tokens):
    """A history file that is no lockstep history is said before the first case trains (issue 36,
    item 3), not after the run: nothing is trained or written, exit 1."""
    bad = tmp_path / "history.sqlite"
    bad.write_bytes(b"not a database" * 100)
    out = tmp_path / "out"
    rc = main(["run", "--frameworks", "pytorch", "--cases", "gpt2_1", "--steps", "2", "--llmc", str(tiny_checkpoint),
               "--data", str(random_tokens), "--device", "cpu", "--out", str(out), "--no-report", "--history", str(bad)])
    _, stderr = capsys.readouterr()
    assert rc == 1 and not out.exists()
    assert f"lockstep: error: {bad}: cannot use it as the lockstep history database (SQLite: file is not a" \
           in " ".join(stderr.split())


def test_no_history_appends_nothing(tmp_path, capsys, tiny_checkpoint, random_tokens, private_history):
    rc = main(["run", "--frameworks", "pytorch", "--cases", "gpt2_1", "--steps", "2", "--llmc", str(tiny_checkpoint),
               "--data", str(random_tokens), "--device", "cpu", "--out", str(tmp_path / "out"), "--no-report",
               "--no-history"])
    assert rc == 1 and not private_history.exists()  # rc 1: pytorch alone compared nothing
