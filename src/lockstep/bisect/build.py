"""Building one commit of the framework under test with the user's command.

Each commit gets its own build directory, OUT/builds/<sha>, and its log, OUT/builds/<sha>.log
(kept whether the build worked or not). The command runs through the shell with the worktree as
its working directory and these variables set:

    LOCKSTEP_BISECT_SRC     the worktree, checked out at the commit
    LOCKSTEP_BISECT_BUILD   the commit's (empty) build directory
    LOCKSTEP_BISECT_COMMIT  the commit's full sha

lockstep writes a marker into the build directory only after the command succeeded, so a
build directory without it (an interrupted build) is never reused: it is emptied and built again.

A build that runs past its timeout (DEFAULT_BUILD_TIMEOUT_S unless the user says otherwise) is
stopped with everything it started (it runs in its own session: make's jobs, compilers, a hung
`sleep`) and counts as failed, so that one hanging commit cannot hang the whole bisection.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from lockstep.bisect.git import BisectError
from lockstep.fsutil import atomic_write
from lockstep.runners.launch import supervise, worker_env

SRC_ENV, BUILD_ENV, COMMIT_ENV = "LOCKSTEP_BISECT_SRC", "LOCKSTEP_BISECT_BUILD", "LOCKSTEP_BISECT_COMMIT"
BUILT_MARKER = ".lockstep-built"
BUILD_OK, BUILD_REUSED, BUILD_FAILED = "ok", "reused", "failed"
# An hour: a clean CUDA build of InfiniTrain takes minutes on a build machine, so a build still
# running after this is taken to hang (`--build-timeout` changes it; 0 waits forever).
DEFAULT_BUILD_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class BuiltFramework:
    """A framework whose runner takes a build directory: bisect hands it each commit's."""

    name: str  # the framework under test (e.g. infinitrain, or a command runner's trainer)
    spec: str  # its runner spec's name, the key of its options in RunRequest.framework_options
    build_option: str  # the field of those options that takes the build directory
    commit_file: str | None = None  # a file in the build dir, read by its runner, naming the source commit

    def with_build(self, framework_options: dict, build_dir: Path) -> dict:
        """The run's framework options with this framework's build directory set to `build_dir`."""
        from lockstep.runners.registry import specs

        options = specs()[self.spec].options(framework_options.get(self.spec))
        return {**framework_options, self.spec: dataclasses.replace(options, **{self.build_option: str(build_dir)})}


def built_framework(name: str, framework_options: dict | None = None) -> BuiltFramework | None:
    """The framework `name` as bisect builds it, or None when its runner takes no build directory
    (a runner says so in its capabilities: `build_option`)."""
    from lockstep.runners import spec_for

    spec = spec_for(name, framework_options)
    caps = spec.capabilities
    return BuiltFramework(name, spec.name, caps.build_option, caps.commit_file) if caps.build_option else None


@dataclass(frozen=True)
class BuildOutcome:
    status: str  # ok | reused | failed
    build_dir: Path
    log: Path
    seconds: float
    error: str = ""  # why a failed build failed, one sentence naming its log


def build_commit(command: str, src: Path, builds_dir: Path, sha: str, framework: BuiltFramework,
                 timeout_s: float | None = DEFAULT_BUILD_TIMEOUT_S) -> BuildOutcome:
    """Build `sha` (checked out in `src`) into builds_dir/<sha>, or reuse a finished build there.
    `timeout_s` None waits for the build however long it takes."""
    build_dir, log = builds_dir / sha, builds_dir / f"{sha}.log"
    if (build_dir / BUILT_MARKER).is_file():
        return BuildOutcome(BUILD_REUSED, build_dir, log, 0.0)
    try:
        if build_dir.exists():
            shutil.rmtree(build_dir)  # an interrupted build: its half is never trusted
        build_dir.mkdir(parents=True)
    except OSError as e:
        raise BisectError(f"{build_dir}: cannot make the build directory ({e.strerror or e})") from None
    env = worker_env({SRC_ENV: str(src), BUILD_ENV: str(build_dir), COMMIT_ENV: sha})
    start = time.monotonic()
    with open(log, "w") as out:
        out.write(f"[COMMAND] {command}\n[CWD] {src}\n[{BUILD_ENV}] {build_dir}\n")
        out.flush()
        try:
            # Its own session, so that Ctrl-C (or a timeout) stops the whole build tree: make's jobs, compilers.
            proc = subprocess.Popen(["/bin/sh", "-c", command], cwd=src, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        except OSError as e:
            raise BisectError(f"cannot start the build command ({e.strerror or e})") from None
        rc, timed_out = supervise(proc, lambda: None, timeout_s)
    seconds = time.monotonic() - start
    if timed_out or rc != 0:
        why = (f"ran past its timeout of {timeout_s:g} s and was stopped (--build-timeout)" if timed_out
               else f"exited with status {rc}")
        return BuildOutcome(BUILD_FAILED, build_dir, log, seconds, f"the build command {why} (log: {log})")
    if framework.commit_file:
        (build_dir / framework.commit_file).write_text(sha + "\n")
    with atomic_write(build_dir / BUILT_MARKER, "w") as f:
        json.dump({"sha": sha, "command": command, "seconds": round(seconds, 2)}, f)
    return BuildOutcome(BUILD_OK, build_dir, log, seconds)
