"""The cached llm.c init that `lockstep run` makes (initial_weights.ensure_initial_checkpoint): written
once, by one process, when several need it at once (the others wait on its lock and reuse it);
never torn; refused before any drawing when the disk has no room for it."""

from __future__ import annotations

import hashlib
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lockstep.fsutil as fsutil
import lockstep.models.init as init
from lockstep.errors import WriteError
from lockstep.fsutil import exclusive_lock, lock_path_for
from lockstep.models import FAMILIES, SHAPES
from lockstep.initial_weights import ensure_initial_checkpoint

SRC = Path(__file__).resolve().parents[1] / "src"
TINY = SHAPES["gpt2-tiny"].config
CACHED_NAME = f"gpt2-tiny_llmc_init_seed42_{init.INIT_SCHEME}.bin"

# One `lockstep run`'s planning step as far as the init goes, counting the writes it makes.
NEEDS_THE_INIT = """
import json, os, sys
from pathlib import Path
import lockstep.models.init as init
from lockstep.models import FAMILIES, SHAPES
from lockstep.initial_weights import ensure_initial_checkpoint
writes, real = [], init.write_initial_checkpoint
def counting(*args, **kwargs):
    writes.append(1)
    real(*args, **kwargs)
init.write_initial_checkpoint = counting
path = ensure_initial_checkpoint(Path(sys.argv[1]), "gpt2-tiny", FAMILIES["gpt2"], SHAPES["gpt2-tiny"].config, 42)
print(json.dumps({"path": str(path), "writes": len(writes), "inode": os.stat(path).st_ino}))
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wait_for_line(proc: subprocess.Popen, text: str, timeout_s: float = 120.0) -> str:
    """The first stderr line of `proc` containing `text` (other lines, e.g. warnings, are passed over)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], deadline - time.monotonic())
        if not ready:
            break
        line = proc.stderr.readline()
        if not line:
            break  # the process ended
        if text in line:
            return line.strip()
    raise AssertionError(f"no line with {text!r} from the process within {timeout_s} s")


def test_two_runs_needing_the_same_init_at_once_write_it_once(tmp_path, tiny_checkpoint):
    cache = tmp_path / "cache"
    path = cache / "checkpoints" / CACHED_NAME
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    # Held here, the lock makes "at once" certain: both processes are waiting when it is released,
    # and then one of them writes while the other waits for it.
    with exclusive_lock(lock_path_for(path)):
        procs = [subprocess.Popen([sys.executable, "-c", NEEDS_THE_INIT, str(cache)], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
        for p in procs:
            assert wait_for_line(p, "waiting for another lockstep") == f"waiting for another lockstep writing {path}"
        assert not path.exists()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["writes"] for r in results) == [0, 1]  # one wrote; the other reused its file
    assert {r["path"] for r in results} == {str(path)}
    assert results[0]["inode"] == results[1]["inode"] == path.stat().st_ino  # not rewritten after
    assert sha256(path) == sha256(tiny_checkpoint)  # whole: the same bytes as a plain write
    assert sorted(p.name for p in path.parent.iterdir()) == [f".{CACHED_NAME}.lock", CACHED_NAME]  # no temporary


def test_a_good_cached_init_is_reused_and_a_damaged_one_rewritten(tmp_path, monkeypatch):
    path = ensure_initial_checkpoint(tmp_path, "gpt2-tiny", FAMILIES["gpt2"], TINY, 42)
    good, inode = sha256(path), path.stat().st_ino
    calls = []
    real = init.write_initial_checkpoint
    monkeypatch.setattr(init, "write_initial_checkpoint", lambda *a, **k: (calls.append(1), real(*a, **k)))
    assert ensure_initial_checkpoint(tmp_path, "gpt2-tiny", FAMILIES["gpt2"], TINY, 42) == path
    assert calls == [] and path.stat().st_ino == inode
    with open(path, "r+b") as f:  # cut short, as an older lockstep could leave it
        f.truncate(path.stat().st_size // 2)
    ensure_initial_checkpoint(tmp_path, "gpt2-tiny", FAMILIES["gpt2"], TINY, 42)
    assert calls == [1] and sha256(path) == good


def test_no_room_for_the_init_is_said_before_drawing_it_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(fsutil, "free_bytes", lambda directory: 5_000_000)
    monkeypatch.setattr(init, "init_tensors", lambda *a, **k: pytest.fail("drew the weights with no room to write them"))
    size = FAMILIES["gpt2"].layout(TINY).file_size
    with pytest.raises(WriteError) as info:
        ensure_initial_checkpoint(tmp_path, "gpt2-tiny", FAMILIES["gpt2"], TINY, 42)
    directory = tmp_path / "checkpoints"
    assert str(info.value) == (f"{directory / CACHED_NAME}: no space left on device for the llm.c init of gpt2-tiny "
                               f"(seed 42): it needs {fsutil.format_bytes(size)}, {directory} has 5 MB free")
    assert not (directory / CACHED_NAME).exists() and not [p for p in directory.iterdir() if p.suffix != ".lock"]


def test_a_cached_inits_digest_is_kept_beside_it_and_taken_again_when_the_file_changes(tmp_path, monkeypatch):
    """A 1B init takes seconds to hash on every plan: lockstep keeps the digest of its own cached
    init beside it, keyed by size and modification time; a changed file is hashed again, and a
    user's checkpoint outside the cache gets no file beside it."""
    import lockstep.initial_weights as initial_weights

    path = ensure_initial_checkpoint(tmp_path, "gpt2-tiny", FAMILIES["gpt2"], TINY, 42)
    side = Path(f"{path}.sha256.json")
    assert initial_weights._cached_digest(path) == sha256(path) and json.loads(side.read_text())["sha256"] == sha256(path)
    hashed = []
    monkeypatch.setattr(initial_weights, "sha256_file", lambda p: (hashed.append(p), fsutil.sha256_file(p))[1])
    assert initial_weights._cached_digest(path) == sha256(path) and hashed == []
    with open(path, "r+b") as f:  # the same size, other bytes, a later mtime
        f.seek(-4, os.SEEK_END)
        f.write(b"\x01\x02\x03\x04")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert initial_weights._cached_digest(path) == sha256(path) and hashed == [path]
    theirs = tmp_path / "user" / "model.bin"
    theirs.parent.mkdir()
    theirs.write_bytes(path.read_bytes())
    monkeypatch.setattr(initial_weights, "_digests", {})
    assert initial_weights.checkpoint_digest(theirs, cache=tmp_path / "checkpoints") == sha256(theirs)
    assert [p.name for p in theirs.parent.iterdir()] == ["model.bin"]
