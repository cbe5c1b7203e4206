"""lockstep/bytecode.py: where PYTHONDONTWRITEBYTECODE forbids bytecode beside the sources, lockstep's
processes and their children keep it in lockstep's cache; otherwise nothing changes."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = ("import subprocess, sys\n"
         "from lockstep.bytecode import own_bytecode_cache\n"
         "print(own_bytecode_cache())\n"
         "child = 'import sys; print(sys.flags.dont_write_bytecode, sys.pycache_prefix)'\n"
         "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout.strip())\n")


def _probe(tmp_path, **env) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, "LOCKSTEP_CACHE": str(tmp_path), **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_forbidden_bytecode_goes_to_lockstep_cache_for_it_and_its_children(tmp_path):
    prefix = tmp_path / "pycache"
    assert _probe(tmp_path, PYTHONDONTWRITEBYTECODE="1") == [str(prefix), f"0 {prefix}"]


def test_a_real_command_leaves_its_bytecode_there(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\0" * 64)
    run = subprocess.run([sys.executable, "-m", "lockstep", "inspect", str(junk)],
                         env={**env, "PYTHONDONTWRITEBYTECODE": "1", "LOCKSTEP_CACHE": str(tmp_path)},
                         capture_output=True, text=True)
    assert run.returncode == 1 and str(junk) in run.stderr  # the command ran (and refused the file)
    compiled = {p.relative_to(tmp_path / "pycache").as_posix() for p in (tmp_path / "pycache").rglob("*.pyc")}
    tag = "cpython-%d%d.pyc" % sys.version_info[:2]
    assert any(p.endswith(f"lockstep/commands/inspect.{tag}") for p in compiled), sorted(compiled)[:20]
    assert any(p.endswith(f"lockstep/cli.{tag}") for p in compiled)  # `python -m lockstep` asks before the CLI loads


def test_nothing_changes_otherwise(tmp_path):
    assert _probe(tmp_path) == ["None", "0 None"]  # bytecode allowed: Python's own place
    assert _probe(tmp_path, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(tmp_path / "mine")) == \
        ["None", f"1 {tmp_path / 'mine'}"]  # the user's own choice stands
    assert _probe(tmp_path, PYTHONDONTWRITEBYTECODE="1", LOCKSTEP_PYCACHE="off") == ["None", "1 None"]
    assert not (tmp_path / "pycache").exists()
