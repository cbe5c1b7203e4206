"""`lockstep bisect` on a real InfiniTrain repository (CPU build): a locally committed defect
between real commits, found, named and diagnosed.

It runs only when the environment gives it a repository and a build command (lockstep holds no
InfiniTrain code and no recipe for building it):

    LOCKSTEP_BISECT_INFINITRAIN_REPO       a clone of InfiniTrain whose branch holds real commits, one local
                                           commit with a defect whose message contains [lockstep-bisect-defect],
                                           and more real commits on top of it
    LOCKSTEP_BISECT_INFINITRAIN_GOOD       a real commit before the defect (the good endpoint)
    LOCKSTEP_BISECT_INFINITRAIN_BAD        the bad endpoint (default: the repository's HEAD)
    LOCKSTEP_BISECT_INFINITRAIN_BUILD_CMD  a CPU-only build, as InfiniTrain's README says, of $LOCKSTEP_BISECT_SRC
                                           whose gpt2 executable ends up in $LOCKSTEP_BISECT_BUILD
    LOCKSTEP_BISECT_INFINITRAIN_OUT        optional: the bisect's OUT (kept, and resumed when run again);
                                           default a temporary directory

Each commit is a full build (minutes on a CPU; ccache helps), so this is for a machine with time.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from lockstep.cli import main
from support.fake_framework import git

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

REPO_ENV, GOOD_ENV, BAD_ENV = ("LOCKSTEP_BISECT_INFINITRAIN_REPO", "LOCKSTEP_BISECT_INFINITRAIN_GOOD",
                               "LOCKSTEP_BISECT_INFINITRAIN_BAD")
BUILD_ENV, OUT_ENV = "LOCKSTEP_BISECT_INFINITRAIN_BUILD_CMD", "LOCKSTEP_BISECT_INFINITRAIN_OUT"
DEFECT_MARK = "[lockstep-bisect-defect]"


@pytest.fixture(scope="module")
def infinitrain_bisect_inputs():
    missing = [v for v in (REPO_ENV, GOOD_ENV, BUILD_ENV) if not os.environ.get(v)]
    if missing:
        pytest.skip(f"needs a real InfiniTrain repository with a committed defect and its build command: set "
                    f"{', '.join(missing)} (see this file's docstring)")
    return Path(os.environ[REPO_ENV]), os.environ[GOOD_ENV], os.environ.get(BAD_ENV, "HEAD"), os.environ[BUILD_ENV]


def test_a_committed_defect_between_real_infinitrain_commits_is_found_and_named(infinitrain_bisect_inputs, tmp_path,
                                                                                shared_text):
    repo, good, bad, build = infinitrain_bisect_inputs
    defects = [line.split(" ", 1)[0] for line in
               git(repo, "log", "--format=%H %B", "--grep", DEFECT_MARK, "--fixed-strings", f"{good}..{bad}").splitlines()
               if line and DEFECT_MARK in line]
    assert len(defects) == 1, f"{repo}: {good}..{bad} must hold exactly one commit marked {DEFECT_MARK}"
    out = Path(os.environ.get(OUT_ENV) or tmp_path / "out")
    code = main(["bisect", "--repo", str(repo), "--good", good, "--bad", bad, "--build", build, "--cases", "gpt2_1",
                 "--device", "cpu", "--model", "gpt2-tiny", "--text", str(shared_text), "--out", str(out)])
    result = json.loads((out / "bisect.json").read_text())
    assert code == 0, result["reason"]
    first = result["first_bad"]
    assert first["sha"] == defects[0]
    assert first["verdict"].startswith("FAIL") and first["max_abs_diff"] > 1e-5
    # Between real commits that all pass: at most log2(N) + 1 bisection builds that get a verdict.
    verdict_builds = [r for r in result["tested"][2:] if r["build"] != "failed"]
    assert len(verdict_builds) <= math.log2(result["commits_between"]) + 1
    assert result["tested"][0]["state"] == "good" and result["tested"][1]["state"] == "bad"
    diagnose = result["diagnose"]
    assert "error" not in diagnose, diagnose
    assert diagnose["findings"], diagnose  # diagnose names where the defect commit's build parts from pytorch
