"""Does the suite catch real bugs? Apply known defects one at a time to a scratch copy of the repo
and run the tests that must catch each; print caught / not caught, with and without ../shared.

    python benchmarks/mutation_check.py [--modes with-shared,without-shared] [--only NAME,...]
                                        [--out TABLE.md] [--full] [--shared DIR]
                                        [--infinitrain-build CLEAN_DIR --infinitrain-defect NAME=DIR ...]

Each defect is a source patch applied to a copy made with `git archive HEAD` (the repo is never
touched); the copy's tests run with PYTHONPATH=<copy>/src, so torchrun workers import the
patched code too. "with-shared" puts a link to ../shared beside the copy (llm.c's Tiny
Shakespeare bytes); "without-shared" leaves it out, and the tests fall back to the offline
corpus. Before the defects, the same tests run on the unpatched copy and must pass; otherwise a
"caught" would mean nothing. A defect is caught when pytest exits 1 (tests failed) and at least
one selected test failed; an error in collecting or a crash is reported as such, not as caught.
`--full` runs the whole suite for every defect instead of the selected tests (slow).

A defect in InfiniTrain lives in a build, not in this repo: `--infinitrain-build` names a clean
build (the baseline and every other row run the InfiniTrain tests against it) and each
`--infinitrain-defect NAME=DIR` a build with one known defect, made by the user outside this
repo (this script builds nothing); that row runs the InfiniTrain tests against DIR.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

MEGA_VS_PT = "tests/runners/test_megatron_runner.py::test_megatron_trains_the_same_model_as_pytorch"
PP2 = "tests/runners/test_megatron_runner.py::test_tp2_and_pp2_train_the_same_model_as_tp1[pp2]"
TP2 = "tests/runners/test_megatron_runner.py::test_tp2_and_pp2_train_the_same_model_as_tp1[tp2]"
ACCUM = "tests/runners/test_pytorch_runner.py::test_grad_accumulation_split_trains_the_same_model"
DATA = ["tests/data/test_loader.py", "tests/runners/test_megatron_dataset.py"]
LLAMA3_LOGITS = "tests/runners/test_megatron_families.py::test_reference_and_megatron_logits_agree[llama3-tiny]"
INFINITRAIN = ("tests/runners/test_infinitrain_runner.py", "tests/diagnose/test_diagnose_cli.py")
INFINITRAIN_BUILD_ENV = "LOCKSTEP_INFINITRAIN_BUILD"


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str  # file in the repo
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # the tests that must catch it
    build: str = ""  # an external InfiniTrain build with the defect: no patch, the tests run against it


MUTATIONS = [
    Mutation("exact_gelu", "reference GPT-2 uses erf GELU instead of tanh GELU",
             "src/lockstep/models/gpt2/model.py",
             'F.gelu(self.c_fc(x), approximate="tanh")', "F.gelu(self.c_fc(x))", (MEGA_VS_PT,)),
    Mutation("frozen_layernorm", "reference SGD skips every LayerNorm parameter",
             "src/lockstep/runners/pytorch/train.py",
             "build_optimizer(family.optimizer, model.parameters(), case.lr)",
             'build_optimizer(family.optimizer, [p for n, p in model.named_parameters() if "ln_" not in n], case.lr)',
             (MEGA_VS_PT,)),
    Mutation("transposed_bias_grad", "reference c_attn bias gradient read as (3 x C) transposed",
             "src/lockstep/models/gpt2/model.py",
             "        self.c_attn = nn.Linear(cfg.channels, 3 * cfg.channels)",
             "        self.c_attn = nn.Linear(cfg.channels, 3 * cfg.channels)\n"
             "        self.c_attn.bias.register_hook(lambda g: g.reshape(3, -1).t().reshape(-1))",
             (MEGA_VS_PT,)),
    Mutation("broken_tie", "reference head gradient never reaches wte (tie broken)",
             "src/lockstep/models/gpt2/model.py",
             "logits = x @ self.wte.weight[: self.cfg.vocab_size].t()",
             "logits = x @ self.wte.weight[: self.cfg.vocab_size].detach().t()", (MEGA_VS_PT,)),
    Mutation("data_order_off_by_one", "contract data order (pytorch) one micro batch late",
             "src/lockstep/data/loader.py",
             "return ((step * case.accum + micro_step) * case.dp + dp_rank)",
             "return ((step * case.accum + micro_step + 1) * case.dp + dp_rank)", (*DATA, MEGA_VS_PT)),
    Mutation("megatron_data_order_off_by_one", "megatron GPTDataset order one micro batch late",
             "src/lockstep/runners/megatron/dataset.py",
             "first = ((step * case.accum + micro_step) * case.dp + dp_rank)",
             "first = ((step * case.accum + micro_step + 1) * case.dp + dp_rank)", (*DATA, MEGA_VS_PT)),
    Mutation("megatron_pp_tie_unsynced", "megatron PP=2 stops all-reducing the tied embedding gradient",
             "src/lockstep/runners/megatron/worker.py",
             "    config.finalize_model_grads_func = finalize_model_grads\n",
             "    config.finalize_model_grads_func = finalize_model_grads\n"
             "    sys.modules['megatron.core.distributed.finalize_model_grads']._allreduce_word_embedding_grads = "
             "lambda *a, **k: None\n", (PP2,)),
    Mutation("megatron_tp_input_grad_unreduced", "megatron TP=2 column-parallel layers skip the input-gradient all-reduce",
             "src/lockstep/runners/megatron/worker.py",
             "    config.finalize_model_grads_func = finalize_model_grads\n",
             "    config.finalize_model_grads_func = finalize_model_grads\n"
             "    from megatron.core.tensor_parallel.layers import ColumnParallelLinear\n"
             "    for m in (m for c in chunks for m in c.modules() if isinstance(m, ColumnParallelLinear)):\n"
             "        m.allreduce_dgrad, m.disable_grad_reduce = False, True\n", (TP2,)),
    Mutation("megatron_qkv_bias_not_regrouped", "megatron qkv bias mapped without the per-head regrouping",
             "src/lockstep/runners/megatron/families/gpt2.py",
             '"qkvb" + at, "rows", per_head, from_heads)', '"qkvb" + at, "rows")', (MEGA_VS_PT,)),
    Mutation("wrong_rope_pairing", "reference Llama 3 rotates pairs (i, i + hd/2) instead of (2i, 2i+1)",
             "src/lockstep/models/llama3/model.py",
             "even, odd = x[..., 0::2], x[..., 1::2]",
             "even, odd = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]", (LLAMA3_LOGITS,)),
]


def infinitrain_defect(spec: str) -> Mutation:
    """`NAME=DIR`: a row for an InfiniTrain build with a known defect (its INFINITRAIN_COMMIT file says which)."""
    name, sep, build = spec.partition("=")
    if not sep or not Path(build, "gpt2").is_file():
        raise SystemExit(f"--infinitrain-defect {spec!r}: expected NAME=DIR with DIR/gpt2 an InfiniTrain build")
    label = Path(build, "INFINITRAIN_COMMIT")
    what = f"InfiniTrain build {label.read_text().strip() if label.is_file() else build}"
    return Mutation(name, what, "", "", "", INFINITRAIN, build=str(Path(build).resolve()))


@dataclass
class Outcome:
    verdict: str  # caught | NOT CAUGHT | baseline failed | error
    failed: list[str]
    seconds: float


def scratch_copy(root: Path, with_shared: bool, shared: Path = SHARED) -> Path:
    copy = root / "repo"
    copy.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(copy)], input=archive, check=True)
    if with_shared:
        if not shared.is_dir():
            raise SystemExit(f"{shared} is not present: cannot run the with-shared mode (--shared DIR)")
        (root / "shared").symlink_to(shared.resolve())
    return copy


def apply(copy: Path, m: Mutation) -> None:
    if m.build:
        return  # the defect is in the build the tests run against
    path = copy / m.path
    text = path.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"{m.path}: the patch for {m.name} matches {text.count(m.old)} times (expected once); "
                         "update benchmarks/mutation_check.py")
    path.write_text(text.replace(m.old, m.new))


def run_tests(copy: Path, tests: list[str], log: Path, infinitrain_build: str = "") -> tuple[int, list[str], float]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCKSTEP_TEST_TEXT", "PYTHONPATH", INFINITRAIN_BUILD_ENV)}
    env["PYTHONPATH"] = str(copy / "src")
    if infinitrain_build:
        env[INFINITRAIN_BUILD_ENV] = infinitrain_build
    started = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider", *tests],
                            cwd=copy, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", log.read_text(), re.M)
    return rc, failed, time.perf_counter() - started


def check_mode(mode: str, mutations: list[Mutation], full: bool, logs: Path, shared: Path,
               clean_build: str = "") -> dict[str, Outcome]:
    with_shared = mode == "with-shared"
    selected = ["tests"] if full else sorted({t for m in mutations for t in m.tests})
    out: dict[str, Outcome] = {}
    with tempfile.TemporaryDirectory(prefix=f"mutation-{mode}-") as td:
        clean = scratch_copy(Path(td) / "clean", with_shared, shared)
        rc, failed, secs = run_tests(clean, selected, logs / f"{mode}-baseline.log", clean_build)
        out["(none: baseline)"] = Outcome("passes" if rc == 0 else "baseline failed", failed, secs)
        print(f"[{mode}] baseline: rc {rc} in {secs:.0f} s {failed}", flush=True)
        if rc != 0:
            return out
        for m in mutations:
            copy = scratch_copy(Path(td) / m.name, with_shared, shared)
            apply(copy, m)
            tests = ["tests"] if full else list(m.tests)
            rc, failed, secs = run_tests(copy, tests, logs / f"{mode}-{m.name}.log", m.build or clean_build)
            verdict = "caught" if rc == 1 and failed else ("NOT CAUGHT" if rc == 0 else f"error (pytest rc {rc})")
            out[m.name] = Outcome(verdict, failed, secs)
            print(f"[{mode}] {m.name}: {verdict} in {secs:.0f} s {failed}", flush=True)
            shutil.rmtree(copy, ignore_errors=True)
    return out


def table(results: dict[str, dict[str, Outcome]], mutations: list[Mutation]) -> str:
    modes = list(results)
    lines = ["| defect | what | " + " | ".join(modes) + " | first failing test |",
             "| --- | --- | " + " | ".join("---" for _ in modes) + " | --- |"]
    rows = [("(none: baseline)", "unpatched copy, the same tests")] + [(m.name, m.what) for m in mutations]
    for name, what in rows:
        cells, first = [], ""
        for mode in modes:
            o = results[mode].get(name)
            cells.append(f"{o.verdict} ({o.seconds:.0f} s)" if o else "not run")
            if o and o.failed and not first:
                first = o.failed[0].replace("tests/", "")
        lines.append(f"| {name} | {what} | " + " | ".join(cells) + f" | {first} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="with-shared,without-shared")
    ap.add_argument("--only", default="", help="comma-separated defect names")
    ap.add_argument("--full", action="store_true", help="run the whole suite for every defect")
    ap.add_argument("--out", type=Path, help="write the table (Markdown) here")
    ap.add_argument("--logs", type=Path, default=None, help="keep pytest logs here (default: a temp dir)")
    ap.add_argument("--shared", type=Path, default=SHARED, help=f"the shared folder to link (default {SHARED})")
    ap.add_argument("--infinitrain-build", default="", help="a clean InfiniTrain build for the InfiniTrain tests")
    ap.add_argument("--infinitrain-defect", action="append", default=[], metavar="NAME=DIR",
                    help="an InfiniTrain build with a known defect (repeatable); needs --infinitrain-build")
    args = ap.parse_args()
    if args.infinitrain_defect and not args.infinitrain_build:
        raise SystemExit("--infinitrain-defect needs --infinitrain-build (the clean build the baseline runs)")
    clean_build = str(Path(args.infinitrain_build).resolve()) if args.infinitrain_build else ""
    candidates = MUTATIONS + [infinitrain_defect(spec) for spec in args.infinitrain_defect]
    mutations = [m for m in candidates if not args.only or m.name in args.only.split(",")]
    logs = args.logs or Path(tempfile.mkdtemp(prefix="mutation-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    started = dt.datetime.now(dt.timezone.utc)
    results = {mode: check_mode(mode, mutations, args.full, logs, args.shared, clean_build)
               for mode in args.modes.split(",")}
    head = (f"Mutation check: {started:%Y-%m-%d %H:%M} UTC, commit {commit}, {platform.node()} "
            f"({os.cpu_count()} CPUs, {platform.machine()}), Python {platform.python_version()}; "
            f"tests: {'whole suite' if args.full else 'the selected tests per defect (-x)'}"
            + (f"; clean InfiniTrain build {clean_build}" if clean_build else "; no InfiniTrain build (its tests skip)"))
    text = head + "\n\n" + table(results, mutations) + "\n"
    print("\n" + text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(f"pytest logs: {logs}")
    caught = all(o.verdict == "caught" for r in results.values() for n, o in r.items() if not n.startswith("("))
    baselines = all(r["(none: baseline)"].verdict == "passes" for r in results.values())
    return 0 if caught and baselines else 1


if __name__ == "__main__":
    raise SystemExit(main())
