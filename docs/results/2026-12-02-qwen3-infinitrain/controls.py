"""The controls of this folder's README, on a CPU build of InfiniTrain's feat/add_Qwen3-8B:

    python controls.py BUILD_DIR OUT_DIR no_permutation   # v3 file with Q/K rows as lockstep stores them
    python controls.py BUILD_DIR OUT_DIR contract_10      # 10 steps, the 2-step rule lifted
    python controls.py BUILD_DIR OUT_DIR beta095_10       # 10 steps, the reference also on Adam(0.9, 0.95)

Each patches one thing in-process and runs `lockstep run` on qwen3_1 (qwen3-tiny, FP32, CPU).
"""

import sys

import lockstep.models.qwen3 as qwen3_family
import lockstep.models.qwen3.checkpoint_v3 as v3
import lockstep.runners.infinitrain.families.qwen3 as adapter
from lockstep.cli import main

build, out, which = sys.argv[1:4]
steps = "10"
if which == "no_permutation":
    steps = "2"
    v3.interleaved_rope_tensors = lambda config, tensors: tensors
elif which == "contract_10":
    adapter.BETA_FREE_STEPS = 100
elif which == "beta095_10":
    object.__setattr__(qwen3_family.FAMILY, "optimizer", adapter.V3_HARD_CODED_ADAM)
else:
    sys.exit(f"unknown control {which!r}")
sys.exit(main(["run", "--matrix", "qwen3", "--cases", "qwen3_1", "--model", "qwen3-tiny", "--frameworks",
               "pytorch,infinitrain", "--infinitrain-build", build, "--steps", steps, "--device", "cpu",
               "--out", out, "--no-report"]))
