"""Every kind of input lockstep reads, made unreadable or undecodable, through the CLI: exit 1,
one line on stderr starting `lockstep: error:` naming the file, no traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lockstep.cli import main
from lockstep.formats.logs import llmc_step_line
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record
from lockstep.formats.tokens import write_token_stream
from lockstep.models.gpt2 import FAMILY as GPT2_FAMILY
from lockstep.models.gpt2.config import GPT2Config

SRC = Path(__file__).resolve().parents[2] / "src"
TINY = GPT2Config(max_seq_len=8, vocab_size=16, num_layers=1, num_heads=2, channels=4, padded_vocab_size=16)


def make_input(kind: str, directory: Path) -> tuple[Path, list[str]]:
    """A valid input of `kind` and the command that reads it ({} is the file)."""
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "checkpoint":
        path = directory / "model.bin"
        GPT2_FAMILY.write(path, TINY, {n: np.zeros(shape, "float32") for n, shape in TINY.tensor_shapes()})
        return path, ["inspect", "{}"]
    if kind == "token file":
        path = directory / "tokens.bin"
        write_token_stream(path, list(range(10)))
        return path, ["inspect", "{}"]
    if kind == "matrix":
        path = directory / "m.toml"
        path.write_text('[[case]]\nname = "a"\nmodel = "gpt2"\ndtype = "float32"\nmicro_batch = 1\nseq_len = 4\n'
                        "total_batch = 4\nsteps = 1\nlr = 1e-4\n")
        return path, ["run", "--matrix", "{}", "--out", str(directory / "out")]
    losses = [10.9, 10.8]
    if kind == "log":
        good = directory / "base" / "gpt2_1.log"
        good.parent.mkdir()
        text = "\n".join(llmc_step_line(i + 1, 2, x, 1e-4, 10.0, 100.0) for i, x in enumerate(losses)) + "\n"
        good.write_text(text)
        path = directory / "test" / "gpt2_1.log"
        path.parent.mkdir()
        path.write_text(text)
        return path, ["compare", str(good), "{}"]
    assert kind == "record"
    for name in ("base", "test"):
        write_run_record(directory / name / "gpt2_1.jsonl",
                         RunRecord(name, "gpt2_1", [StepRecord(i + 1, x) for i, x in enumerate(losses)]))
    return directory / "test" / "gpt2_1.jsonl", ["compare", str(directory / "base"), str(directory / "test")]


KINDS = ["checkpoint", "token file", "matrix", "log", "record"]


def damage(path: Path, how: str) -> None:
    if how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif how == "not utf-8":
        path.write_bytes(b"\xff\xfe\x00garbage \xc3\x28\n")


def check_one_error_line(rc: int, err: str, path: Path, problem: str) -> None:
    lines = err.strip().splitlines()
    assert rc == 1 and "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("lockstep: error: "), err
    assert str(path) in lines[0] and problem in lines[0], lines[0]


EXPECTED = {"directory": "is a directory", "fifo": "is a FIFO", "not utf-8": "not UTF-8"}


@pytest.mark.parametrize("how", ["directory", "fifo", "not utf-8"])
@pytest.mark.parametrize("kind", KINDS)
def test_bad_input_of_every_kind(tmp_path, capsys, kind, how):
    if how == "not utf-8" and kind in ("checkpoint", "token file"):
        pytest.skip("binary formats: undecodable bytes are a wrong magic number (tests/formats)")
    path, argv = make_input(kind, tmp_path)
    damage(path, how)
    if how == "not utf-8" and kind == "log":
        # A native log holds what a crashing process printed: bad bytes are tolerated, and a log
        # with no step lines left is still an error naming it.
        check_one_error_line(main([a.replace("{}", str(path)) for a in argv]), capsys.readouterr().err, path,
                             "holds no step records")
        return
    rc = main([a.replace("{}", str(path)) for a in argv])
    if how == "directory" and kind in ("log", "record"):
        # In a compared tree a directory is walked, not read: it holds no case files.
        where = path if kind == "log" else path.parent
        check_one_error_line(rc, capsys.readouterr().err, where, "no case files")
        return
    check_one_error_line(rc, capsys.readouterr().err, path, EXPECTED[how])


def _without_root_privilege() -> list[str]:
    """A prefix that runs a command without the capability to ignore file permissions (root's
    CAP_DAC_OVERRIDE), so that chmod 000 really makes a file unreadable."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make a file unreadable to this process")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]


@pytest.mark.parametrize("kind", KINDS)
def test_unreadable_input_of_every_kind(tmp_path, kind):
    path, argv = make_input(kind, tmp_path)
    path.chmod(0)
    cmd = _without_root_privilege() + [sys.executable, "-m", "lockstep", *(a.replace("{}", str(path)) for a in argv)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    check_one_error_line(proc.returncode, proc.stderr, path, "permission denied")


@pytest.mark.parametrize("where, problem", [("dir", "is a directory"), ("under a file", "is not a directory"),
                                            ("/proc", "cannot write the JSON report")])
def test_compare_json_that_cannot_be_written(tmp_path, capsys, where, problem):
    path, argv = make_input("record", tmp_path)
    target = {"dir": tmp_path, "under a file": path / "v.json", "/proc": Path("/proc/lockstep/v.json")}[where]
    rc = main([a.replace("{}", str(path)) for a in argv] + ["--json", str(target)])
    out, err = capsys.readouterr()
    check_one_error_line(rc, err, target, problem)
    assert out == ""  # refused before comparing, not after


def test_report_that_cannot_be_written(tmp_path, capsys):
    _, argv = make_input("record", tmp_path / "run")
    (tmp_path / "run" / "base").rename(tmp_path / "run" / "pytorch")
    (tmp_path / "run" / "report.html").mkdir()
    rc = main(["report", str(tmp_path / "run")])
    check_one_error_line(rc, capsys.readouterr().err, tmp_path / "run" / "report.html", "is a directory")
