"""`lockstep` command line. Errors become one sentence and an exit code only here."""

from __future__ import annotations

import argparse
import importlib
import sys

from lockstep import __version__
from lockstep.commands import COMMAND_MODULES
from lockstep.errors import LockstepError
from lockstep.fsutil import os_problem


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lockstep",
        description="Run one training case on several frameworks and compare them step by step.")
    parser.add_argument("--version", action="version", version=f"lockstep {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"lockstep.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"lockstep.commands.{name}":
                continue  # a subcommand not written yet
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except LockstepError as e:
        print(f"lockstep: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        # Reads and writes go through fsutil, which names the file; this is the net for any
        # other I/O failure, so that it is still one sentence naming the file, not a traceback.
        where = f"{e.filename}: " if e.filename else ""
        print(f"lockstep: error: {where}{os_problem(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lockstep: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
