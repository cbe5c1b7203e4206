"""fsutil: every way a file cannot be read or written is one FormatError naming the file; every
failed write says why in words (no space, file too large, permission) and leaves no partial file."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lockstep.fsutil as fsutil
from lockstep.errors import FormatError, WriteError
from lockstep.fsutil import (atomic_write, check_free_space, move_aside, open_for_streaming, os_problem, read_bytes,
                             read_head, read_text, regular_file_size)

SRC = Path(__file__).resolve().parents[1] / "src"


def test_reads_regular_files(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes("héllo\n".encode())
    assert read_text(path) == "héllo\n" and read_bytes(path) == "héllo\n".encode()
    assert read_head(path, 2) == b"h\xc3" and regular_file_size(path) == 7


@pytest.mark.parametrize("kind, problem", [
    ("missing", "no such file"),
    ("directory", "is a directory, not a run record"),
    ("fifo", "is a FIFO, not a run record (only regular files are read)"),
    ("device", "is a device, not a run record"),
])
def test_what_is_not_a_regular_file_is_refused_before_opening(tmp_path, kind, problem):
    path = tmp_path / "x.jsonl"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # opening it for reading would block forever
    elif kind == "device":
        path = "/dev/zero"  # would never end
    with pytest.raises(FormatError) as info:
        read_text(path, "run record")
    assert info.value.path == str(path) and problem in info.value.problem


def test_not_utf8_names_the_byte_and_line(tmp_path):
    path = tmp_path / "m.toml"
    path.write_bytes(b"[defaults]\nname = \"caf\xe9\"\n")
    with pytest.raises(FormatError) as info:
        read_text(path, "case matrix")
    assert info.value.path == str(path)
    assert info.value.problem == "is not UTF-8 text: byte 0xe9 at offset 22 (line 2) cannot be decoded; is it a case matrix?"
    assert read_text(path, errors="replace").endswith("caf\ufffd\"\n")


def test_atomic_write_failures_name_the_target(tmp_path):
    (tmp_path / "file").write_text("x")
    for target, problem in ((tmp_path, "is a directory"),
                            (tmp_path / "file" / "out.json", f"{tmp_path / 'file'} is not a directory"),
                            (tmp_path / "file" / "deeper" / "out.json", f"{tmp_path / 'file'} is not a directory")):
        with pytest.raises(FormatError) as info:
            with atomic_write(target, "w", what="JSON report") as f:
                f.write("{}")
        assert info.value.path == str(target) and problem in info.value.problem


def test_atomic_write_turns_a_failing_write_into_a_sentence_and_leaves_nothing(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(FormatError, match="cannot write the run record: no space left on device"):
        with atomic_write(target, "w", what="run record"):
            raise OSError(28, "No space left on device")  # what a full disk raises from write()
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_into_dev_full_directory_is_not_possible_but_dev_full_file_is_refused():
    # /dev/full is a device: never a target to rename over.
    with pytest.raises(FormatError, match="exists and is not a regular file"):
        with atomic_write("/dev/full", "w"):
            pass


# ---- every failed write: the path, what it was, the reason in words; nothing under the final name

@pytest.mark.parametrize("code, words", [
    (errno.ENOSPC, "no space left on device"), (errno.EFBIG, "file too large"), (errno.EACCES, "permission denied"),
    (errno.EPERM, "permission denied"), (errno.EROFS, "read-only file system"), (errno.EDQUOT, "disk quota exceeded"),
])
def test_os_problem_says_the_reason_in_fixed_words(code, words):
    assert os_problem(OSError(code, "whatever the C library says in this locale")) == words


class FillsUp:
    """A file whose disk fills up after `room` bytes, as write() on a full disk does."""

    def __init__(self, f, room: int):
        self._f, self.room = f, room

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


def test_a_disk_filling_up_mid_write_is_one_sentence_and_leaves_nothing(tmp_path, monkeypatch):
    real_fdopen = os.fdopen
    monkeypatch.setattr(fsutil.os, "fdopen", lambda fd, mode: FillsUp(real_fdopen(fd, mode), room=100))
    target = tmp_path / "c.jsonl"
    with pytest.raises(WriteError) as info:
        with atomic_write(target, "w", what="run record") as f:
            f.write("x" * 80)
            f.write("y" * 80)  # the disk is full now
    assert str(info.value) == f"{target}: cannot write the run record: no space left on device"
    assert list(tmp_path.iterdir()) == []  # no partial file, under the final name or aside


def test_a_streamed_log_that_cannot_be_written_names_it(tmp_path, monkeypatch):
    real_open = open
    path = tmp_path / "c.log"
    monkeypatch.setattr("builtins.open", lambda p, mode="r", *a, **k: FillsUp(real_open(p, mode, *a, **k), room=10))
    with pytest.raises(WriteError) as info:
        with open_for_streaming(path, "native log") as log:
            print("step 1 | train loss 10.98", file=log, flush=True)
    assert str(info.value) == f"{path}: cannot write the native log: no space left on device"


def test_a_file_size_limit_is_file_too_large_and_leaves_nothing(tmp_path):
    """RLIMIT_FSIZE (what a quota or a full disk does to a write, without filling this machine's disk),
    through the CLI: exit 1, one sentence, no checkpoint under its name and no temporary beside it."""
    out = tmp_path / "tiny.bin"
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000)); "
              "from lockstep.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", script, "init-checkpoint", "--model", "gpt2-tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == f"lockstep: error: {out}: cannot write the LLMC checkpoint: file too large\n"
    assert list(tmp_path.iterdir()) == []


def test_a_directory_that_refuses_writes_is_permission_denied(tmp_path):
    if os.geteuid() == 0:
        # Root writes into a mode-0555 directory regardless; sysfs refuses root new files all the same.
        target = Path("/sys/lockstep-test-summary.json")
    else:
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
        target = tmp_path / "ro" / "summary.json"
    try:
        with pytest.raises(WriteError) as info:
            with atomic_write(target, "w", what="run summary") as f:
                f.write("{}")
        assert str(info.value) == f"{target}: cannot write the run summary: permission denied"
        assert not target.exists()
    finally:
        if os.geteuid() != 0:
            (tmp_path / "ro").chmod(0o755)


def test_no_room_is_said_before_writing_with_how_much_is_needed_and_free(tmp_path, monkeypatch):
    monkeypatch.setattr(fsutil, "free_bytes", lambda directory: 1_200_000_000)
    with pytest.raises(WriteError) as info:
        check_free_space(tmp_path, 4_970_000_000, "llm.c init of llama3 (seed 42)")
    assert str(info.value) == (f"{tmp_path}: no space left on device for the llm.c init of llama3 (seed 42): "
                               "it needs 4.97 GB, 1.2 GB are free")
    target = tmp_path / "tokens.bin"
    with pytest.raises(WriteError) as info:
        with atomic_write(target, what="token file", size=2_000_000_000):
            pytest.fail("wrote with no room")
    assert str(info.value) == (f"{target}: no space left on device for the token file: it needs 2 GB, "
                               f"{tmp_path} has 1.2 GB free")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    free = fsutil.free_bytes(tmp_path / "not" / "made" / "yet")  # the nearest existing directory's filesystem
    assert isinstance(free, int) and free > 0


def test_move_aside_never_replaces_anything(tmp_path):
    for name in ("run.json", "run.json.moved-by-lockstep-20261201T000000Z"):
        (tmp_path / name).write_text(name)
    moved = move_aside(tmp_path / "run.json", "20261201T000000Z")
    assert moved.name == "run.json.moved-by-lockstep-20261201T000000Z-2" and moved.read_text() == "run.json"
    assert (tmp_path / "run.json.moved-by-lockstep-20261201T000000Z").read_text() != "run.json"


def test_temporary_names_say_whose_they_are(tmp_path):
    seen = []
    with atomic_write(tmp_path / "model.bin") as f:
        seen = [p.name for p in tmp_path.iterdir()]
        f.write(b"x")
    assert len(seen) == 1
    prefix = f".model.bin.lockstep-{fsutil._host()}-{os.getpid()}-"
    assert seen[0].startswith(prefix) and seen[0].endswith(".tmp"), seen
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]


def test_a_later_write_removes_only_the_temporaries_of_ended_processes(tmp_path):
    """A write killed outright leaves its temporary; the next write of the same file removes it, but
    never that of a process still running, another host's (a shared filesystem), or another file's."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    live = subprocess.Popen(["sleep", "30"])
    target = tmp_path / "model.bin"
    try:
        stale = tmp_path / (fsutil.temp_prefix(target, ended.pid) + "k1_x.tmp")
        running = tmp_path / (fsutil.temp_prefix(target, live.pid) + "k2.tmp")
        other_host = tmp_path / f".model.bin.lockstep-elsewhere-{ended.pid}-k3.tmp"
        other_file = tmp_path / (fsutil.temp_prefix(tmp_path / "other.bin", ended.pid) + "k4.tmp")
        old_style = tmp_path / ".model.bin.k5abcdef.tmp"  # tempfile's own name: whose it is is unknown
        for p in (stale, running, other_host, other_file, old_style):
            p.write_bytes(b"\0" * 1000)
        assert fsutil.stale_temps(target) == [(stale, ended.pid)]
        with atomic_write(target) as f:
            f.write(b"new")
        assert target.read_bytes() == b"new" and not stale.exists()
        assert all(p.exists() for p in (running, other_host, other_file, old_style))
    finally:
        live.kill()
        live.wait()
    assert fsutil.remove_stale_temps(target) == [fsutil.StaleTemp(running, live.pid, 1000)]  # once it has ended
