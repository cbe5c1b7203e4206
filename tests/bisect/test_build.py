"""One commit's build for `lockstep bisect`: its variables, reuse only after success, a failure
kept with its log, and Ctrl-C stopping the whole build tree without leaving a reusable build."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from lockstep.bisect.build import BUILD_FAILED, BUILD_OK, BUILD_REUSED, BUILT_MARKER, build_commit, built_framework

SHA = "0123456789abcdef0123456789abcdef01234567"
INFINITRAIN = built_framework("infinitrain")


def test_the_command_runs_in_the_source_with_its_build_dir_and_is_reused_once_done(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.c").write_text("int main() {}\n")
    command = 'cp main.c "$LOCKSTEP_BISECT_BUILD/" && echo "$LOCKSTEP_BISECT_COMMIT $LOCKSTEP_BISECT_SRC" > "$LOCKSTEP_BISECT_BUILD/made"'
    built = build_commit(command, src, tmp_path / "builds", SHA, INFINITRAIN)
    assert built.status == BUILD_OK and built.build_dir == tmp_path / "builds" / SHA
    assert (built.build_dir / "made").read_text().split() == [SHA, str(src)]
    assert (built.build_dir / "main.c").is_file() and (built.build_dir / BUILT_MARKER).is_file()
    assert (built.build_dir / "INFINITRAIN_COMMIT").read_text().strip() == SHA  # what its runner records
    assert "[COMMAND] cp main.c" in built.log.read_text()
    again = build_commit("exit 1", src, tmp_path / "builds", SHA, INFINITRAIN)
    assert again.status == BUILD_REUSED and (again.build_dir / "made").is_file()


def test_a_failed_build_keeps_its_log_and_is_never_reused(tmp_path):
    built = build_commit("echo 'main.cc:12: error: expected ;' >&2; exit 2", tmp_path, tmp_path / "builds", SHA,
                         INFINITRAIN)
    assert built.status == BUILD_FAILED and "exited with status 2" in built.error and str(built.log) in built.error
    assert "main.cc:12: error: expected ;" in built.log.read_text()
    assert not (built.build_dir / BUILT_MARKER).exists()
    assert build_commit("touch \"$LOCKSTEP_BISECT_BUILD/ok\"", tmp_path, tmp_path / "builds", SHA,
                        INFINITRAIN).status == BUILD_OK


def test_ctrl_c_stops_the_build_tree_and_leaves_nothing_to_reuse(tmp_path):
    pid_file = tmp_path / "child.pid"
    command = f'touch "$LOCKSTEP_BISECT_BUILD/half.o"; sleep 60 & echo $! > {pid_file}; wait'

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            build_commit(command, tmp_path, tmp_path / "builds", SHA, INFINITRAIN)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    child = int(pid_file.read_text())
    assert not alive(child), "the build's own child (sleep 60) outlived Ctrl-C"
    build_dir = tmp_path / "builds" / SHA
    assert (build_dir / "half.o").exists() and not (build_dir / BUILT_MARKER).exists()
    rebuilt = build_commit('touch "$LOCKSTEP_BISECT_BUILD/whole.o"', tmp_path, tmp_path / "builds", SHA, INFINITRAIN)
    assert rebuilt.status == BUILD_OK and not (build_dir / "half.o").exists()  # the half build was cleared first


def alive(pid: int, wait_s: float = 5.0) -> bool:
    """Whether `pid` still runs (a zombie waiting for its reaper counts as stopped)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state == "Z":
            return False
        time.sleep(0.05)
    return True


def test_a_hanging_build_is_stopped_with_everything_it_started(tmp_path):
    """A build that ignores SIGTERM and whose child hangs: stopped at its timeout (SIGKILL once SIGTERM
    is ignored), counted as failed with one sentence, no process of it left."""
    pid_file = tmp_path / "child.pid"
    command = f"trap '' TERM; sleep 1000 & echo $! > {pid_file}; wait"
    start = time.monotonic()
    built = build_commit(command, tmp_path, tmp_path / "builds", SHA, INFINITRAIN, timeout_s=1.0)
    took = time.monotonic() - start
    assert built.status == BUILD_FAILED
    assert built.error == (f"the build command ran past its timeout of 1 s and was stopped (--build-timeout) "
                           f"(log: {built.log})")
    assert not alive(int(pid_file.read_text()), wait_s=1.0), "the hung build's sleep 1000 outlived its timeout"
    assert 1.0 <= took < 15.0  # 1 s, then at most the 5 s SIGTERM grace before SIGKILL
    assert not (built.build_dir / BUILT_MARKER).exists()


def test_bisect_has_a_default_build_timeout(capsys):
    """Without --build-timeout a hanging build once hung `lockstep bisect` forever."""
    import inspect

    from lockstep.bisect.build import DEFAULT_BUILD_TIMEOUT_S
    from lockstep.bisect.run import BisectRequest
    from lockstep.cli import build_parser, main

    assert DEFAULT_BUILD_TIMEOUT_S == 3600
    args = build_parser().parse_args(["bisect", "--repo", "r", "--good", "a", "--bad", "b"])
    assert args.build_timeout == 3600
    assert build_parser().parse_args(["bisect", "--repo", "r", "--good", "a", "--bad", "b",
                                      "--build-timeout", "0"]).build_timeout is None  # 0: no limit, said in --help
    assert BisectRequest("r", "a", "b", "make").build_timeout_s == 3600
    assert inspect.signature(build_commit).parameters["timeout_s"].default == 3600
    with pytest.raises(SystemExit):
        main(["bisect", "--help"])
    assert "(default 3600; 0: no limit)" in " ".join(capsys.readouterr().out.split())
