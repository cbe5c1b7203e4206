"""A small git repository of a fake framework for `lockstep bisect`'s tests.

Its "build" (build.py) turns train.py into an InfiniTrain-compatible executable `gpt2` in
$LOCKSTEP_BISECT_BUILD: it takes the gflags lockstep's infinitrain runner passes, trains with
lockstep's own reference training loop (CPU, no network) and prints InfiniTrain's glog step
lines. One commit multiplies the learning rate by LR_DEFECT (the defect to find), and one commit
leaves train.py with a syntax error, so that its build fails (fixed by the next commit). It
cannot show its step 1 (it refuses --save), so no step-1 certificate is made for it.

With `defect="ln_bias_grad"` the defect is instead every LayerNorm bias gradient x1.05 (the
InfiniTrain CPU defect build's fault), which the loss at the contract's lr does not see and only
the step-1 certificate catches. For that certificate this executable shows its step 1 as InfiniTrain
does: `--save DIR --save_interval N` writes its weights after step N as InfiniTrain's model.ckpt
(under InfiniTrain's names); it has no `--precision_check`, which it refuses as an old build's
gflags do, so its forward is judged from the step-1 loss and the gradients.
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
LN_BIAS_GRAD_DEFECT = 1.05  # every LayerNorm bias gradient 5% too large: the loss hides it
DEFECT_SUBJECT = "[sched] scale the learning rate for the new scheduler"  # brackets: not rich markup
LN_DEFECT_SUBJECT = "[norm] fuse the LayerNorm backward"
BUILD_LOG_ENV = "FAKE_FRAMEWORK_BUILD_LOG"  # each build appends its sha here (counts builds)

TRAIN = '''#!{python}
"""A fake InfiniTrain gpt2: InfiniTrain's gflags in, its glog step lines out."""
import argparse
import datetime
import os
import sys

sys.path.insert(0, {src!r})
LR_SCALE = {lr_scale!r}
LN_BIAS_GRAD_SCALE = {ln_bias_grad_scale!r}
SHOWS_STEP1 = {shows_step1!r}  # takes --save (the step-1 certificate's way in), or refuses it
FLAGS = ("input_bin", "llmc_filepath", "device", "dtype", "batch_size", "sequence_length", "total_batch_size",
         "num_iteration", "learning_rate", "nthread_per_process")


def main():
    if any(arg.startswith("--precision_check") for arg in sys.argv[1:]):
        sys.exit("ERROR: unknown command line flag 'precision_check'")  # as an older build's gflags say it
    parser = argparse.ArgumentParser()
    for flag in FLAGS:
        parser.add_argument("--" + flag, required=True)
    if SHOWS_STEP1:
        parser.add_argument("--save")
        parser.add_argument("--save_interval", type=int)
        parser.add_argument("--save_optimizer_state")
    a = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    if LN_BIAS_GRAD_SCALE != 1.0:
        built = torch.nn.LayerNorm.__init__

        def init_with_wrong_bias_grad(self, *args, **kwargs):
            built(self, *args, **kwargs)
            self.bias.register_hook(lambda g: g * LN_BIAS_GRAD_SCALE)

        torch.nn.LayerNorm.__init__ = init_with_wrong_bias_grad
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

    saving = SHOWS_STEP1 and a.save
    final = os.path.join(os.getcwd(), "fake_final.npz") if saving else None
    with open(os.devnull, "w") as quiet:
        train_case(case, a.llmc_filepath, a.input_bin, a.device, ProcessGroupInfo(), emit, quiet,
                   final_params_path=final)
    if saving:
        save(final, os.path.join(a.save, "checkpoint_step_%06d" % case.steps, "model.ckpt"))


def save(final, path):
    """The weights after the last step as InfiniTrain's model.ckpt, under its module names."""
    import numpy as np

    from lockstep.formats.infinitrain_checkpoint import write_infinitrain_checkpoint
    from lockstep.runners.infinitrain.families.gpt2 import _GPT2_LAYER, _GPT2_TOP

    layer = {{v: k for k, v in _GPT2_LAYER.items()}}
    top = {{v: k for k, v in _GPT2_TOP.items()}}
    out = {{}}
    with np.load(final) as params:
        for name in params.files:
            base, _, index = name.rstrip("]").partition("[")  # "ln1b[0]" -> ln1b, layer 0
            out[top[name] if not index else "transformer.h.%s.%s" % (index, layer[base])] = params[name]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_infinitrain_checkpoint(path, out)
    os.remove(final)
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


def write_fake_build(build_dir: Path, ln_bias_grad_scale: float = 1.0) -> Path:
    """A built fake InfiniTrain that shows its step 1 (`--save`): `build_dir/gpt2`, its LayerNorm bias
    gradients x`ln_bias_grad_scale`."""
    build_dir.mkdir(parents=True, exist_ok=True)
    exe = build_dir / "gpt2"
    exe.write_text(TRAIN.format(python=sys.executable, src=str(LOCKSTEP_SRC), lr_scale=1.0,
                                ln_bias_grad_scale=ln_bias_grad_scale, shows_step1=True, broken=""))
    exe.chmod(0o755)
    return build_dir


def make_fake_repo(path: Path, commits: int = 16, defect_index: int = 11, broken_index: int | None = 8,
                   defect: str = "lr") -> FakeRepo:
    """commits+1 commits on one branch: index 0 (good) .. `commits` (bad), the defect (`defect`: "lr",
    the learning rate x1.5; "ln_bias_grad", the LayerNorm bias gradients x1.05) introduced at
    `defect_index`, a build-breaking syntax error at `broken_index` (fixed at the next; None: none)."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    repo = FakeRepo(path, defect_index=defect_index, broken_index=broken_index)
    (path / "build.py").write_text(BUILD.format(log_env=BUILD_LOG_ENV))
    for i in range(commits + 1):
        lr_scale = LR_DEFECT if i >= defect_index and defect == "lr" else 1.0
        ln_scale = LN_BIAS_GRAD_DEFECT if i >= defect_index and defect == "ln_bias_grad" else 1.0
        broken = "\ndef half_done_refactor(:\n    pass\n" if i == broken_index else ""
        (path / "train.py").write_text(TRAIN.format(python=sys.executable, src=str(LOCKSTEP_SRC), lr_scale=lr_scale,
                                                    ln_bias_grad_scale=ln_scale, shows_step1=defect == "ln_bias_grad",
                                                    broken=broken))
        (path / "NOTES.txt").write_text(f"change {i}\n")
        subject = ((DEFECT_SUBJECT if defect == "lr" else LN_DEFECT_SUBJECT) if i == defect_index else
                   "start a refactor (does not build)" if i == broken_index else f"change {i}")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", subject)
        repo.shas.append(git(path, "rev-parse", "HEAD"))
    return repo
