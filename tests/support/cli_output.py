"""Reading what a subcommand printed, for the CLI tests."""

from __future__ import annotations

import re


def printed(out: str, key: str) -> str:
    """The value printed on the line that starts (indented) with `key`."""
    match = re.search(rf"^\s+{key}\s+(.+)$", out, re.M)
    assert match, f"{key!r} not printed in:\n{out}"
    return match.group(1).strip()
