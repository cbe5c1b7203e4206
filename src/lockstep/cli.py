"""`lockstep` command line. Errors become one sentence and an exit code only here."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import signal
import sys
import threading

from lockstep import __version__
from lockstep.bytecode import own_bytecode_cache
from lockstep.commands import COMMAND_MODULES
from lockstep.errors import Interrupted, LockstepError
from lockstep.fsutil import os_problem

# Signals that stop lockstep the way Ctrl-C does (exit status 128 + the number: 130, 143, 129).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class LockstepParser(argparse.ArgumentParser):
    """Every lockstep parser, subcommands' included (argparse makes them of the parent's class).

    No abbreviations: `run --case` must not quietly mean `--cases`, and a prefix that is
    unique today would change meaning when an option is added. An unknown option is reported
    by the subcommand it was given to, with that subcommand's usage (argparse's default is the
    top-level usage, which does not list the option the user meant), and the nearest option."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(unrecognized_sentence(self, extras))
        return namespace, extras


def unrecognized_sentence(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    text = f"unrecognized arguments: {' '.join(extras)}"
    first = next((x.split("=", 1)[0] for x in extras if x.startswith("--")), None)
    if first is not None:
        options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
        near = difflib.get_close_matches(first, options, n=1)
        if near:
            text += f" (did you mean {near[0]}?)"
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = LockstepParser(
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
    own_bytecode_cache()  # before the imports that matter, torch's first (bytecode.py says why)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with stop_on_signals():
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
    except KeyboardInterrupt as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        print(f"lockstep: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum


@contextlib.contextmanager
def stop_on_signals():
    """Turn SIGTERM and SIGHUP into the KeyboardInterrupt that SIGINT gives, so that the cleanup
    written for Ctrl-C (stop the running case's process group, mark the run interrupted) runs
    for them too; by default they would end Python at once and leave torchrun's workers running.
    Only the first signal interrupts: a second one must not cut that cleanup short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = []

    def handler(signum, frame):
        if stopping:
            return
        stopping.append(signum)
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


if __name__ == "__main__":
    raise SystemExit(main())
