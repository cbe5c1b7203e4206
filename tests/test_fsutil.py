"""fsutil: every way a file cannot be read or written is one FormatError naming the file."""

from __future__ import annotations

import os

import pytest

from lockstep.errors import FormatError
from lockstep.fsutil import atomic_write, read_bytes, read_head, read_text, regular_file_size


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
