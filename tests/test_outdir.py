"""The run directory: refused when unusable or someone else's, locked for one run at a time,
cleared only under the lock, and marked running / finished / interrupted in run.json."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from lockstep.outdir import (LOCK_NAME, STATUS_FINISHED, OutDirError, check_out_dir, open_run_dir)

FRAMEWORKS = ["pytorch", "megatron"]


def lockstep_run_dir(path: Path) -> Path:
    """A directory as an earlier `lockstep run` left it."""
    (path / "pytorch").mkdir(parents=True)
    (path / "pytorch" / "gpt2_1.jsonl").write_text('{"type": "meta"}\n')
    (path / "run.json").write_text('{"status": "finished"}\n')
    (path / "summary.json").write_text('{"passed": true}\n')
    (path / "report_files").mkdir()
    return path


def test_out_that_is_a_file_is_one_sentence(tmp_path):
    f = tmp_path / "out.txt"
    f.write_text("x")
    with pytest.raises(OutDirError, match="is a file, not a directory"):
        check_out_dir(f)
    with pytest.raises(OutDirError, match=r"cannot create the output directory \(.*out.txt is a file\)"):
        check_out_dir(f / "sub")
    assert f.read_text() == "x"


def test_out_that_cannot_be_created_is_one_sentence():
    # /sys refuses mkdir even for root.
    with pytest.raises(OutDirError, match="/sys/lockstep-test-out: cannot create the output directory"):
        open_run_dir(Path("/sys/lockstep-test-out"), FRAMEWORKS, {})


def test_read_only_out_is_one_sentence(tmp_path):
    if os.geteuid() == 0:
        # Root writes into any mode-0555 directory; sysfs refuses it new files all the same.
        with pytest.raises(OutDirError, match=r"^/sys: output directory is not writable \(cannot create "):
            open_run_dir(Path("/sys"), FRAMEWORKS, {}, force=True)
        return
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(OutDirError, match="output directory is not writable"):
            open_run_dir(ro, FRAMEWORKS, {})
        with pytest.raises(OutDirError, match=r"cannot create the output directory \(.*ro is not writable\)"):
            open_run_dir(ro / "new", FRAMEWORKS, {})
    finally:
        ro.chmod(0o755)


def test_foreign_files_are_refused_unless_forced_and_are_never_removed(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "thesis.tex").write_text("keep me")
    (out / "pytorch").mkdir()  # named like a framework dir, but not in a lockstep run dir
    (out / "pytorch" / "notes.txt").write_text("mine")
    with pytest.raises(OutDirError, match=r"not empty \(pytorch, thesis.tex\) and was not written by lockstep run.*--force"):
        open_run_dir(out, FRAMEWORKS, {})
    assert sorted(p.name for p in out.iterdir()) == ["pytorch", "thesis.tex"]  # not even a lock file

    with open_run_dir(out, FRAMEWORKS, {"cases": []}, force=True) as rd:
        rd.mark(STATUS_FINISHED)
    assert (out / "thesis.tex").read_text() == "keep me"
    assert json.loads((out / "run.json").read_text())["status"] == "finished"


def test_a_held_lock_refuses_the_second_run_and_touches_nothing(tmp_path):
    out = lockstep_run_dir(tmp_path / "o")
    before = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*"))
    with open_run_dir(out, FRAMEWORKS, {"cases": ["first"]}) as first:
        during = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*"))
        with pytest.raises(OutDirError, match=rf"another lockstep run is writing to this directory \(pid {os.getpid()}, "):
            open_run_dir(out, FRAMEWORKS, {"cases": ["second"]})
        with pytest.raises(OutDirError, match="another lockstep run"):
            check_out_dir(out)
        assert sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*")) == during
        assert json.loads(first.manifest_path.read_text())["cases"] == ["first"]
        first.mark(STATUS_FINISHED)
    assert before != during  # the first run did clear the old outputs (below)
    with open_run_dir(out, FRAMEWORKS, {"cases": ["third"]}) as third:  # released: usable again
        assert json.loads(third.manifest_path.read_text())["status"] == "running"


def test_an_earlier_runs_outputs_are_cleared_only_once_the_lock_is_held(tmp_path):
    out = lockstep_run_dir(tmp_path / "o")
    (out / "keep.txt").write_text("not lockstep's")
    with open(out / LOCK_NAME, "w") as held:  # another process's lock, as flock sees it
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(OutDirError, match="another lockstep run"):
            open_run_dir(out, FRAMEWORKS, {})
        assert (out / "pytorch" / "gpt2_1.jsonl").is_file() and (out / "summary.json").is_file()
    with open_run_dir(out, FRAMEWORKS, {"cases": []}):
        assert not (out / "pytorch").exists() and not (out / "summary.json").exists()
        assert not (out / "report_files").exists() and (out / "keep.txt").is_file()
        manifest = json.loads((out / "run.json").read_text())
        assert manifest["status"] == "running" and manifest["pid"] == os.getpid()


@pytest.mark.parametrize("exc,status", [(KeyboardInterrupt, "interrupted"), (RuntimeError, "failed")])
def test_a_run_that_does_not_finish_says_so_and_leaves_no_summary(tmp_path, exc, status):
    out = tmp_path / "o"
    with pytest.raises(exc):
        with open_run_dir(out, FRAMEWORKS, {"cases": []}):
            (out / "summary.json").write_text('{"passed": true}')  # as if compared before the end
            raise exc("stop")
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == status and "finished_at" in manifest
    assert not (out / "summary.json").exists()
    with open_run_dir(out, FRAMEWORKS, {}):  # the lock was released
        pass
