"""What one InfiniTrain executable accepts, found by asking the executable itself.

Builds of different branches differ in their flags (`--zero_stage` vs the older
`--use_distributed_optimizer`, `--save` or none) and in the LLMC version their loader CHECKs;
lockstep learns both from the binary, never from its commit: its gflags from `--helpfull`, and
the version from a header-only file of version 0, which its loader refuses at once with glog's
`Check failed: version == kQwen3FP32Version (0 vs. 3)` naming the version it reads (tiny_mixtral's:
`Check failed: infini_train::BytesToType<int32_t>(header, 1 * sizeof(int32_t)) == kTinyMixtralLLMCVersion
(0 vs. 2)`). A family may ask more of its executable with `loader_output` (a header of its choosing).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep.errors import LockstepError
from lockstep.formats.llmc import HEADER_INTS

PROBE_TIMEOUT_S = 60.0
_FLAG_LINE = re.compile(r"^\s+-([A-Za-z0-9_]+) \(", re.MULTILINE)
# glog's CHECK_EQ(read, kVersion) names the constant: `... == kQwen3FP32Version (0 vs. 3)`.
_VERSION_CHECK = re.compile(r"Check failed: [^\n]*? == \w*Version\w* \(0 vs\. (\d+)\)")


@dataclass(frozen=True)
class ExecutableFacts:
    """One executable's gflags, and the LLMC version its loader reads (None: not asked)."""

    path: Path
    flags: frozenset[str]
    llmc_version: int | None = None
    # The one shape (a family config) an executable with its model compiled in accepts, as its loader
    # stated it; None: it builds whatever shape the header states.
    compiled_model: object | None = None

    def has_flag(self, name: str) -> bool:
        return name in self.flags


def _run(cmd: list[str], cwd: str) -> str:
    env = {**os.environ, "GLOG_logtostderr": "1"}
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise LockstepError(f"{cmd[0]} did not answer `{' '.join(cmd[1:])}` within {PROBE_TIMEOUT_S:g} s") from None
    except OSError as e:
        raise LockstepError(f"cannot start {cmd[0]}: {e.strerror or e}") from None
    return done.stdout + done.stderr


def executable_flags(exe: Path) -> frozenset[str]:
    """Every gflag the executable defines (its own and its libraries'), from `--helpfull`."""
    with tempfile.TemporaryDirectory(prefix="lockstep-probe-") as cwd:
        text = _run([str(exe), "--helpfull"], cwd)
    flags = frozenset(_FLAG_LINE.findall(text))
    if not flags:
        raise LockstepError(f"{exe} --helpfull listed no flags: is it an InfiniTrain example executable?")
    return flags


def loader_output(exe: Path, header: np.ndarray, name: str = "probe.bin") -> str:
    """What the executable prints given a header-only LLMC file (`header`, HEADER_INTS int32 words):
    a loader that CHECKs its header refuses it before it allocates a model."""
    if header.shape != (HEADER_INTS,):
        raise ValueError(f"an LLMC header is {HEADER_INTS} int32 words, not {header.shape}")
    with tempfile.TemporaryDirectory(prefix="lockstep-probe-") as cwd:
        probe = Path(cwd) / name
        probe.write_bytes(header.astype("<i4").tobytes())
        return _run([str(exe), "--llmc_filepath", str(probe), "--device", "cpu", "--num_iteration", "1"], cwd)


def last_lines(text: str, n: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-n:])


def llmc_version_read(exe: Path, magic: int) -> int:
    """The LLMC version the executable's loader CHECKs, from its refusal of a version-0 header."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0] = magic
    text = loader_output(exe, header, "version0.bin")
    m = _VERSION_CHECK.search(text)
    if not m:
        tail = last_lines(text)
        raise LockstepError(f"cannot tell which LLMC version {exe} reads: given a version-0 header (magic {magic}) "
                            f"it did not refuse it with a `Check failed: version == ... (0 vs. N)` line; its output "
                            f"ended: {tail or '(nothing)'}")
    return int(m.group(1))
