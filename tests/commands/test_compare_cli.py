"""`lockstep compare` through `lockstep.cli.main`: what it prints about the steps of a pair, and
what it adds to the history."""

from __future__ import annotations

from pathlib import Path

from lockstep.cli import main
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record
from lockstep.history import HistoryStore

LOSSES = [10.9, 10.8, 10.7]


def record(directory: Path, framework: str, case: str, losses: list[float], meta: dict | None = None) -> None:
    write_run_record(directory / f"{case}.jsonl",
                     RunRecord(framework, case, [StepRecord(i + 1, x) for i, x in enumerate(losses)], meta=meta or {}))


def test_a_failing_pair_names_its_first_failing_step(tmp_path, capsys):
    record(tmp_path / "base", "pytorch", "gpt2_1", LOSSES)
    record(tmp_path / "test", "infinitrain", "gpt2_1", [10.9, 10.8, 11.7])
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "test"), "--no-history"]) == 1
    out = capsys.readouterr().out
    assert "first failing step 3" in out and "None" not in out


def test_a_pair_of_other_inputs_prints_no_step_table_and_no_none(tmp_path, capsys):
    record(tmp_path / "base", "pytorch", "gpt2_1", LOSSES, {"case_spec": {"steps": 3, "lr": 1e-4}})
    record(tmp_path / "test", "infinitrain", "gpt2_1", LOSSES, {"case_spec": {"steps": 3, "lr": 3e-4}})
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "test"), "--no-history"]) == 1
    out = capsys.readouterr().out
    assert "lr 0.0001 vs 0.0003" in out
    assert "None" not in out and "first failing step" not in out


def test_directories_with_no_case_in_common_are_not_a_history_entry(tmp_path, capsys):
    record(tmp_path / "base", "pytorch", "gpt2_1", LOSSES)
    record(tmp_path / "test", "infinitrain", "llama3_1", LOSSES)
    history = tmp_path / "history.sqlite"
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "test"), "--history", str(history)]) == 1
    out = capsys.readouterr().out
    assert "nothing in common" in out and "share no case; not added to the history" in out
    assert not history.exists()
    # a pair in common (and one on one side only) is an entry, as before
    record(tmp_path / "test", "infinitrain", "gpt2_1", LOSSES)
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "test"), "--history", str(history)]) == 1
    [run] = HistoryStore(history).runs()
    assert {r.case for r in run.results} == {"gpt2_1", "llama3_1"}
