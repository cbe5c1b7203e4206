"""The exceptions lockstep raises; the CLI turns them into one sentence and an exit code."""

from __future__ import annotations

import os


class LockstepError(Exception):
    """An error with a message meant for the user (no traceback needed)."""


class FormatError(LockstepError):
    """A file is not what it claims to be. The message names the file and the problem."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class WriteError(FormatError):
    """A file could not be written: no space left, a file-size limit, no permission. The message
    names the file and the reason in words. A FormatError, so that every caller that already
    reports a bad file by its path reports a failed write the same way."""


class CaseError(LockstepError):
    """A case cannot run as specified (impossible batch split, too few tokens, ...)."""


class RunError(LockstepError):
    """A framework run failed (crash, non-zero exit, timeout, non-finite loss)."""


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived: stop what runs (child process groups included), keep
    what finished, and exit 128 + the signal's number. A KeyboardInterrupt so that every cleanup
    written for Ctrl-C also runs for the others."""

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        super().__init__(self.signal_name)
