"""A small git repository of a fake framework for `lockstep bisect`'s tests.

Its "build" (build.py) turns train.py into an InfiniTrain-compatible executable `gpt2` in
$LOCKSTEP_BISECT_BUILD: it takes the gflags lockstep's infinitrain runner passes, trains with
lockstep's own reference training loop (CPU, no network) and prints InfiniTrain's glog step
lines. One commit multiplies the learning rate by LR_DEFECT (the defect to find), and one commit
leaves train.py with a syntax error, so that its build fails (fixed by the next commit).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import lockstep

LOCKSTEP_SRC = Path(lockstep.__file__).resolve().parents[1]
LR_DEFECT = 1.5  # moves gpt2-tiny's step-2 loss by ~2e-3, far past FP32's 1e-5
DEFECT_SUBJECT = "[sched] scale the learning rate for the new scheduler"  # brackets: not rich markup
BUILD_LOG_ENV = "FAKE_FRAMEWORK_BUILD_LOG"  # each build appends its sha here (counts builds)

TRAIN = '''#!{python}
"""A fake InfiniTrain gpt2: InfiniTrain's gflags in, its glog step lines out."""
import argparse
import datetime
import os
import sys

sys.path.insert(0, {src!r})
LR_SCALE = {lr_scale!r}
FLAGS = ("input_bin", "llmc_filepath", "device", "dtype", "batch_size", "sequence_length", "total_batch_size",
         "num_iteration", "learning_rate", "nthread_per_process")


def main():
    parser = argparse.ArgumentParser()
    for flag in FLAGS:
        parser.add_argument("--" + flag, required=True)
    a = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    from lockstep.cases.spec import CaseSpec
    from lockstep.formats.logs import infinitrain_step_line
    from lockstep.runners.pytorch.train import ProcessGroupInfo, train_case

    case = CaseSpec(name="gpt2", model="gpt2", dtype=a.dtype, micro_batch=int(a.batch_size),
                    seq_len=int(a.sequence_length), total_batch=int(a.total_batch_size), steps=int(a.num_iteration),
                    lr=float(a.learning_rate) * LR_SCALE).check()

    def emit(rec):
        prefix = datetime.datetime.now().strftime("E%Y%m%d %H:%M:%S.%f ") + str(os.getpid()) + " main.cc:493] "
        print(infinitrain_step_line(prefix, rec.step, case.steps, rec.loss, rec.lr, rec.step_ms, rec.tokens_per_s,
                                    0, 0), flush=True)

    with open(os.devnull, "w") as quiet:
        train_case(case, a.llmc_filepath, a.input_bin, a.device, ProcessGroupInfo(), emit, quiet)
{broken}

main()
'''

BUILD = '''import os
import py_compile
import shutil
import sys

out = os.environ["LOCKSTEP_BISECT_BUILD"]
try:
    py_compile.compile("train.py", cfile=os.path.join(out, "train.pyc"), doraise=True)
except py_compile.PyCompileError as e:
    sys.exit(f"error: train.py does not compile: {{e.msg}}")
shutil.copy("train.py", os.path.join(out, "gpt2"))
os.chmod(os.path.join(out, "gpt2"), 0o755)
log = os.environ.get({log_env!r})
if log:
    with open(log, "a") as f:
        f.write(os.environ["LOCKSTEP_BISECT_COMMIT"] + "\\n")
'''


@dataclass
class FakeRepo:
    path: Path
    shas: list[str] = field(default_factory=list)  # shas[0] good ... shas[-1] bad
    defect_index: int = 0
    broken_index: int = 0

    @property
    def build_command(self) -> str:
        return f"{sys.executable} build.py"


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "Fake Dev", "GIT_AUTHOR_EMAIL": "dev@example.com",
           "GIT_COMMITTER_NAME": "Fake Dev", "GIT_COMMITTER_EMAIL": "dev@example.com", "LC_ALL": "C"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


def make_fake_repo(path: Path, commits: int = 16, defect_index: int = 11, broken_index: int = 8) -> FakeRepo:
    """commits+1 commits on one branch: index 0 (good) .. `commits` (bad), the learning-rate defect
    introduced at `defect_index`, a build-breaking syntax error at `broken_index` (fixed at the next)."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    repo = FakeRepo(path, defect_index=defect_index, broken_index=broken_index)
    (path / "build.py").write_text(BUILD.format(log_env=BUILD_LOG_ENV))
    for i in range(commits + 1):
        lr_scale = LR_DEFECT if i >= defect_index else 1.0
        broken = "\ndef half_done_refactor(:\n    pass\n" if i == broken_index else ""
        (path / "train.py").write_text(TRAIN.format(python=sys.executable, src=str(LOCKSTEP_SRC), lr_scale=lr_scale,
                                                    broken=broken))
        (path / "NOTES.txt").write_text(f"change {i}\n")
        subject = (DEFECT_SUBJECT if i == defect_index else
                   "start a refactor (does not build)" if i == broken_index else f"change {i}")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", subject)
        repo.shas.append(git(path, "rev-parse", "HEAD"))
    return repo
