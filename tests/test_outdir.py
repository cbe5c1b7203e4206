"""The run directory: refused when unusable or someone else's (by run.json's schema marker, not
by its name), locked for one run at a time, cleared only under the lock and only of what lockstep
wrote, marked running / finished / interrupted in run.json; nothing it did not write is deleted."""

from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path

import pytest

from lockstep.outdir import (LOCK_NAME, REPORT_MARK, RUN_SCHEMA, STATUS_FINISHED, OutDirError, check_out_dir,
                             open_run_dir)

FRAMEWORKS = ["pytorch", "megatron", "repeats"]
MOVED = r"\.moved-by-lockstep-\d{8}T\d{6}Z"


def lockstep_run_dir(path: Path) -> Path:
    """A directory as an earlier `lockstep run` of case gpt2_1 on pytorch left it."""
    (path / "pytorch").mkdir(parents=True)
    (path / "pytorch" / "gpt2_1.jsonl").write_text('{"type": "meta"}\n')
    (path / "pytorch" / "gpt2_1.log").write_text("step 1\n")
    (path / "run.json").write_text(json.dumps({"schema": RUN_SCHEMA, "status": "finished", "frameworks": ["pytorch"],
                                               "cases": [{"name": "gpt2_1"}]}))
    (path / "summary.json").write_text('{"run_dir": "o", "baseline": "pytorch", "frameworks": ["pytorch"], '
                                       '"passed": null, "comparisons": []}\n')
    (path / "report_files").mkdir()
    (path / "report_files" / "gpt2_1.png").write_bytes(b"\x89PNG tEXtSoftware matplotlib, " + REPORT_MARK.encode())
    (path / "report.html").write_text(f'<html><head><meta name="generator" content="{REPORT_MARK}"></head></html>\n')
    (path / "report.md").write_text(f"# lockstep report: o\n\n<!-- written by lockstep ({REPORT_MARK}) -->\n")
    return path


def tree(path: Path) -> dict[str, str]:
    """Every file under `path` -> its content (what must survive)."""
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


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
    # The folder named like lockstep's is moved aside whole, never merged into or cleared.
    [moved] = rd.moved_aside
    assert moved.original == "pytorch" and re.fullmatch("pytorch" + MOVED, moved.moved_to)
    assert (out / moved.moved_to / "notes.txt").read_text() == "mine" and not (out / "pytorch").exists()
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "finished" and manifest["schema"] == RUN_SCHEMA
    assert manifest["moved_aside"] == [{"from": "pytorch", "to": moved.moved_to}]


@pytest.mark.parametrize("content, why", [
    ('{"tool": "trainer-x", "status": "finished"}', r'its run.json was not written by lockstep \(it has no "schema": '
                                                    r'"lockstep.run/1"\)'),
    ("epochs: 3\n", "its run.json is not JSON, so lockstep did not write it"),
    ('{"schema": "lockstep.run/9"}', r"its run.json is of another lockstep version \(lockstep.run/9; this one reads"),
])
def test_another_tools_run_json_makes_a_foreign_dir(tmp_path, content, why):
    """The issue's case: a folder holding a run.json and a pytorch/ of someone else's."""
    out = tmp_path / "o"
    (out / "pytorch").mkdir(parents=True)
    (out / "pytorch" / "model.pt").write_text("weights")
    (out / "run.json").write_text(content)
    before = tree(out)
    with pytest.raises(OutDirError, match=rf"not empty \(pytorch, run.json\) and was not written by lockstep run: "
                                          rf"{why}.*--force \(lockstep then moves what is in its way aside"):
        check_out_dir(out)
    with pytest.raises(OutDirError):
        open_run_dir(out, FRAMEWORKS, {})
    assert tree(out) == before and not (out / LOCK_NAME).exists()

    with open_run_dir(out, FRAMEWORKS, {"cases": [{"name": "gpt2_1"}]}, force=True) as rd:
        rd.mark(STATUS_FINISHED)
    moved = {m.original: m.moved_to for m in rd.moved_aside}
    assert sorted(moved) == ["pytorch", "run.json"]
    assert (out / moved["run.json"]).read_text() == content  # not overwritten
    assert (out / moved["pytorch"] / "model.pt").read_text() == "weights"  # not deleted
    assert json.loads((out / "run.json").read_text())["schema"] == RUN_SCHEMA
    # Now it is lockstep's: the next run needs no --force and moves nothing more.
    with open_run_dir(out, FRAMEWORKS, {"cases": []}) as again:
        assert again.moved_aside == []
    assert (out / moved["pytorch"] / "model.pt").read_text() == "weights"


def test_reusing_its_own_dir_removes_only_what_the_earlier_run_wrote(tmp_path):
    out = lockstep_run_dir(tmp_path / "o")
    (out / "pytorch" / "notes.txt").write_text("the user's")  # kept where it is
    (out / "pytorch" / "old_case.jsonl").write_text("{}")  # not the earlier run's: would be read as a record
    (out / "repeats" / "2" / "pytorch").mkdir(parents=True)
    (out / "repeats" / "2" / "pytorch" / "gpt2_1.jsonl").write_text("{}")  # the earlier run's repeat 2
    (out / "report_files" / "gpt2_2.png").write_bytes(b"user's plot")  # this run's gpt2_2 would overwrite it
    with open_run_dir(out, FRAMEWORKS, {"cases": [{"name": "gpt2_1"}, {"name": "gpt2_2"}]}) as rd:
        moved = {m.original: m.moved_to for m in rd.moved_aside}
        assert sorted(moved) == ["pytorch/old_case.jsonl", "report_files/gpt2_2.png"]
        assert all(re.fullmatch(re.escape(k) + MOVED, v) for k, v in moved.items())
        left = tree(out)
        assert left.pop("pytorch/notes.txt") == "the user's"
        assert left.pop(moved["pytorch/old_case.jsonl"]) == "{}"
        assert left.pop(moved["report_files/gpt2_2.png"]) == "user's plot"
        assert sorted(left) == [LOCK_NAME, "run.json"]  # summary, reports, records and repeats went
        assert not (out / "repeats").exists()  # emptied, and it was lockstep's
        assert json.loads((out / "run.json").read_text())["moved_aside"] == [
            {"from": k, "to": v} for k, v in moved.items()]


def test_reports_and_summary_it_did_not_write_are_moved_aside_not_deleted(tmp_path):
    # issue 36, item 1: the user's own report.md / report.html in a run dir of lockstep's were deleted.
    out = lockstep_run_dir(tmp_path / "o")
    mine = {"report.md": "# my notes on the run\n", "report.html": "<p>my report</p>\n",
            "summary.json": '{"passed": true}\n', "report_files/gpt2_1.png": "my plot"}
    for name, text in mine.items():
        (out / name).write_text(text)
    with open_run_dir(out, FRAMEWORKS, {"cases": [{"name": "gpt2_1"}]}) as rd:
        moved = {m.original: m.moved_to for m in rd.moved_aside}
    assert sorted(moved) == sorted(mine)
    for name, text in mine.items():
        assert re.fullmatch(re.escape(name) + MOVED, moved[name])
        assert (out / moved[name]).read_text() == text  # nothing lost
        assert not (out / name).exists()  # out of this run's way
    assert json.loads((out / "run.json").read_text())["moved_aside"] == [
        {"from": k, "to": v} for k, v in moved.items()]


def test_the_reports_lockstep_writes_carry_its_mark(tmp_path):
    # Negative control of the test above: lockstep's own reports are recognised, so they are cleared.
    from lockstep.outdir import is_lockstep_output
    from lockstep.report.html import render_html
    from lockstep.report.markdown import render_markdown
    from lockstep.report.data import ReportData

    data = ReportData(tmp_path, "pytorch", ["pytorch"])
    for name, text in (("report.html", render_html(data, {})), ("report.md", render_markdown(data, {}))):
        (tmp_path / name).write_text(text)
        assert is_lockstep_output(tmp_path / name)
        (tmp_path / name).write_text(text.replace(REPORT_MARK, "lockstep.report/0"))
        assert not is_lockstep_output(tmp_path / name)


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


@pytest.mark.parametrize("earlier_status", ["running", "finished"])
def test_checkpoint_folders_of_a_killed_run_are_moved_aside_and_a_recorded_runs_kept(tmp_path, earlier_status):
    """A SIGKILLed run leaves run.json "running", and its workers may have gone on writing step
    folders after it died: no recorded run vouches for them, so the re-run moves them aside. A run
    that ended (finished, failed, interrupted) keeps them for a later resume."""
    out = lockstep_run_dir(tmp_path / "o")
    manifest = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**manifest, "status": earlier_status, "frameworks": ["pytorch", "megatron"]}))
    (out / "megatron" / "gpt2_1.checkpoints" / "step_000004").mkdir(parents=True)
    (out / "megatron" / "gpt2_1.checkpoints" / "step_000004" / "common.pt").write_bytes(b"written after the kill")
    with open_run_dir(out, FRAMEWORKS, {"cases": [{"name": "gpt2_1"}]}) as rd:
        moved = {m.original: m.moved_to for m in rd.moved_aside}
        if earlier_status == "running":
            assert list(moved) == ["megatron/gpt2_1.checkpoints"]
            assert re.fullmatch(re.escape("megatron/gpt2_1.checkpoints") + MOVED, moved["megatron/gpt2_1.checkpoints"])
            assert not (out / "megatron" / "gpt2_1.checkpoints").exists()
            assert (out / moved["megatron/gpt2_1.checkpoints"] / "step_000004" / "common.pt").read_bytes() == (
                b"written after the kill")
        else:
            assert moved == {} and (out / "megatron" / "gpt2_1.checkpoints" / "step_000004").is_dir()
