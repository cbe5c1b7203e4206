"""Argument types more than one subcommand takes (a module of its own, so that subcommands never
import each other)."""

from __future__ import annotations

import argparse
import math


def seed_argument(text: str) -> int:
    """argparse type of every `--seed` (the llm.c init's seed)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; the llm.c init takes a seed of 0 or more")
    return value


def timeout_argument(text: str) -> float:
    """argparse type of every `--timeout` (seconds per framework run): a positive, finite number, as the
    TOML's `timeout` must be; no limit is the option left out."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds (leave --timeout out for "
                                         "no limit)")
    return value


def split_list(text: str | None) -> list[str] | None:
    return [s.strip() for s in text.split(",") if s.strip()] if text else None
