"""The argument types several subcommands share, through the real parser: a bad value is one
sentence from argparse (exit 2), before anything runs."""

from __future__ import annotations

import pytest

from lockstep.cli import build_parser

TIMEOUT_COMMANDS = [
    ["run", "--out", "o"],
    ["bisect", "--repo", "r", "--good", "a", "--bad", "b"],
    ["diagnose", "--case", "gpt2_1"],
]


@pytest.mark.parametrize("command", TIMEOUT_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("value", ["0", "-5", "-0.5", "nan", "inf"])
def test_a_timeout_that_is_not_positive_is_refused_by_the_parser(command, value, capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args([*command, f"--timeout={value}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--timeout" in err and "positive number of seconds" in err


@pytest.mark.parametrize("command", TIMEOUT_COMMANDS, ids=lambda c: c[0])
def test_a_positive_timeout_is_taken_as_seconds(command):
    assert build_parser().parse_args([*command, "--timeout", "90.5"]).timeout == 90.5
