"""The verdicts of four recorded kinds of run, as numbers, for comparing two commits of lockstep.

Run it once with each commit's sources first on the path; the two JSON files must hold the same
verdicts and the same numbers (a refactor of how lockstep looks inside a step changes none):

    PYTHONPATH=<tree>/src:tests python benchmarks/same_verdicts.py OUT.json [--text input.txt]
        [--infinitrain-build DIR --test-config test_config.json]

1. the CPU main job (`lockstep run`: the GPT-2 matrix, pytorch vs megatron on gpt2-tiny);
2. a defect only the step-1 certificate sees: the tests' fake InfiniTrain whose LayerNorm bias
   gradients are x1.05 (tests/support/fake_framework.py), gpt2_1, 3 steps;
3. `diagnose --at-step 5` of pytorch-fast's Adam bias-corrected as step 1 at every step
   (tests/support/defects.py), the small Llama 3 case of tests/support/at_step.py;
4. with an InfiniTrain build: the `checkpoint` group's resumed GPT-2 case of InfiniTrain's own
   test_config.json, pytorch vs InfiniTrain on gpt2-tiny.
The tests' support modules (tests/ on the path) are the harness: the same for both commits.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def lockstep(*args: str) -> int:
    from lockstep.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        return main(list(args))


def judged(summary_path: Path) -> list[dict]:
    """Every compared case's verdict and numbers from a run's summary.json."""
    summary = json.loads(summary_path.read_text())
    rows = []
    for comp in summary.get("comparisons", []):
        for c in comp.get("cases", []):
            cert = c.get("certificate") or {}
            rows.append({"pair": f"{comp['test_framework']} vs {comp['baseline_framework']}", "case": c["case"],
                         "verdict": c.get("verdict"), "max_abs_diff": c.get("max_abs_diff"),
                         "at_step": c.get("max_diff_step"), "abs_diffs": c.get("abs_diffs"),
                         "certificate_holds": cert.get("holds"),
                         "cause": (c.get("cause") or "")[:160]})
    return rows


def main_job(work: Path, text: list[str]) -> dict:
    code = lockstep("run", "--out", str(work / "main"), "--no-history", "--no-report", *text)
    return {"exit": code, "cases": judged(work / "main" / "summary.json")}


def certificate_only_defect(work: Path) -> dict:
    from support.fake_framework import make_fake_repo
    from lockstep.formats.tokens import write_token_stream
    from lockstep.models import FAMILIES, SHAPES
    from lockstep.models.init import write_initial_checkpoint
    import numpy as np

    repo = make_fake_repo(work / "repo", commits=1, defect_index=1, broken_index=None, defect="ln_bias_grad")
    build = work / "build"
    build.mkdir()
    subprocess.run([sys.executable, "build.py"], cwd=repo.path, check=True,
                   env={**os.environ, "LOCKSTEP_BISECT_BUILD": str(build), "LOCKSTEP_BISECT_COMMIT": repo.shas[-1]})
    ckpt, tokens = work / "gpt2_tiny.bin", work / "tokens.bin"
    write_initial_checkpoint(ckpt, FAMILIES["gpt2"], SHAPES["gpt2-tiny"].config, seed=42)
    write_token_stream(tokens, np.random.default_rng(0).integers(0, 50257, size=20000))
    code = lockstep("run", "--frameworks", "pytorch,infinitrain", "--infinitrain-build", str(build), "--cases", "gpt2_1",
                    "--steps", "3", "--device", "cpu", "--llmc", str(ckpt), "--data", str(tokens),
                    "--out", str(work / "cert"), "--no-history", "--no-report")
    return {"exit": code, "cases": judged(work / "cert" / "summary.json")}


def diagnose_at_step(work: Path) -> dict:
    import statistics

    from support import at_step, defects

    defects.inject("fast_adam_bias_correction_step1", defects._Forever())
    inputs = at_step.write_inputs(work)
    with contextlib.redirect_stdout(io.StringIO()):
        code = at_step.diagnose(inputs, work / "at5", "pytorch,pytorch-fast", "--at-step", "5")
    v = json.loads((work / "at5" / "diagnose" / "adam_pytorch_vs_pytorch-fast.at_step5.json").read_text())
    rels = [r["rel_error"] for r in v["optimizer_updates"]]
    return {"exit": code, "findings": [f["classification"] for f in v["findings"]],
            "updates_compared": len(rels), "update_rel_median": statistics.median(rels) if rels else None,
            "forward_and_gradients_worst": max(r["rel_error"] for r in v["forward"] + v["gradients"]),
            "loss_abs_diff": v["loss_step1"]["abs_diff"]}


def resumed_infinitrain(work: Path, build: str, test_config: str, text: list[str]) -> dict:
    code = lockstep("run", "--matrix", test_config, "--model", "gpt2-tiny", "--groups", "checkpoint",
                    "--cases", "gpt2_ckpt_no_resume,gpt2_ckpt_resume", "--frameworks", "pytorch,infinitrain",
                    "--infinitrain-build", build, "--device", "cpu", "--out", str(work / "resume"),
                    "--no-history", "--no-report", *text)
    return {"exit": code, "cases": judged(work / "resume" / "summary.json")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--text", help="the corpus (Tiny Shakespeare's input.txt) for the main job and the resumed case")
    p.add_argument("--infinitrain-build")
    p.add_argument("--test-config", help="InfiniTrain's scripts/test_config.json (b24d92f)")
    a = p.parse_args()
    text = ["--text", a.text] if a.text else []
    import lockstep as ls

    results = {"lockstep": str(Path(ls.__file__).parent)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for d in ("1", "3", "4"):
            (work / d).mkdir()
        results["main_job"] = main_job(work / "1", text)
        results["certificate_only_defect"] = certificate_only_defect(work / "2")
        if a.infinitrain_build and a.test_config:
            results["resumed_infinitrain"] = resumed_infinitrain(work / "4", a.infinitrain_build, a.test_config, text)
        results["diagnose_at_step"] = diagnose_at_step(work / "3")  # last: its defect stays for the process's life
    Path(a.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
