"""Testing one commit: check it out, build it, `lockstep run` it into its own run directory,
judge it; and keep the outcome in OUT/tested/<sha>.json, where a resumed bisect finds it.

A commit whose build fails, or that cannot be run at all (e.g. the build made no executable), is
skipped (`git bisect skip`). An outcome is written only once the commit is judged, so an
interrupted build or run leaves nothing that a resumed bisect would trust.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lockstep.bisect.build import BUILD_FAILED, DEFAULT_BUILD_TIMEOUT_S, BuiltFramework, build_commit
from lockstep.bisect.git import Commit, Worktree
from lockstep.bisect.judge import SKIP, Judgement, judge_summary
from lockstep.compare.run_dir import SUMMARY_NAME
from lockstep.compare.options import EXPECT_IDENTICAL, EXPECT_WITHIN_THRESHOLD
from lockstep.errors import LockstepError
from lockstep.fsutil import atomic_write
from lockstep.plan import RunRequest

BUILDS_DIR, RUNS_DIR, TESTED_DIR = "builds", "runs", "tested"


@dataclass
class TestedCommit:
    """One row of the bisect's table."""

    commit: Commit
    build: str  # ok | reused | failed
    judgement: Judgement
    build_seconds: float
    run_seconds: float
    run_dir: str | None = None  # None when nothing ran
    earlier: bool = False  # answered from an earlier (interrupted) bisect into the same OUT

    @property
    def state(self) -> str:
        return self.judgement.state

    @property
    def seconds(self) -> float:
        return self.build_seconds + self.run_seconds

    def to_json(self) -> dict:
        return {**self.commit.to_json(), "build": self.build, "state": self.state,
                "verdict": self.judgement.verdict, "cause": self.judgement.cause,
                "max_abs_diff": self.judgement.max_abs_diff, "reason": self.judgement.reason,
                "failing_case": self.judgement.failing_case, "baseline": self.judgement.baseline,
                "test": self.judgement.test, "certificate": self.judgement.certificate, "build_seconds": round(self.build_seconds, 2),
                "run_seconds": round(self.run_seconds, 2), "run_dir": self.run_dir, "earlier": self.earlier}

    @classmethod
    def from_json(cls, d: dict) -> "TestedCommit":
        judgement = Judgement(state=d["state"], verdict=d["verdict"], reason=d["reason"], cause=d.get("cause"),
                              max_abs_diff=d.get("max_abs_diff"), failing_case=d.get("failing_case"),
                              baseline=d.get("baseline"), test=d.get("test"), certificate=d.get("certificate"))
        return cls(Commit(d["sha"], d["subject"], d["author_date"]), d["build"], judgement, d["build_seconds"],
                   d["run_seconds"], d.get("run_dir"), d.get("earlier", False))


class CommitTester:
    """Builds, runs and judges commits of one bisect, each at most once per OUT."""

    def __init__(self, out_dir: Path, worktree: Worktree, build_command: str, framework: BuiltFramework,
                 run_request: RunRequest, build_timeout_s: float | None = DEFAULT_BUILD_TIMEOUT_S,
                 say: Callable[[str], None] = lambda text: None, expect: str = EXPECT_WITHIN_THRESHOLD):
        self.out_dir = out_dir
        self.worktree = worktree
        self.build_command = build_command
        self.framework = framework
        self.run_request = run_request
        self.build_timeout_s = build_timeout_s
        self.say = say
        self.expect = expect
        self.identical_to: Path | None = None  # --expect identical: the good commit's run directory

    def earlier_outcome(self, sha: str) -> TestedCommit | None:
        path = self.out_dir / TESTED_DIR / f"{sha}.json"
        try:
            tested = TestedCommit.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # never tested (or a file nobody can trust): test it
        return dataclasses.replace(tested, earlier=True)

    def test(self, commit: Commit) -> TestedCommit:
        earlier = self.earlier_outcome(commit.sha)
        if earlier is not None:
            return earlier
        self.worktree.checkout(commit.sha)
        built = build_commit(self.build_command, self.worktree.path, self.out_dir / BUILDS_DIR, commit.sha,
                             self.framework, self.build_timeout_s)
        self.say(f"{commit.short} build {built.status} ({built.seconds:.1f} s)"
                 + (f": {built.error}" if built.error else ""))
        if built.status == BUILD_FAILED:
            tested = TestedCommit(commit, built.status, Judgement(SKIP, "NOT BUILT", built.error), built.seconds, 0.0)
        else:
            run_dir = self.out_dir / RUNS_DIR / commit.sha
            start = time.monotonic()
            judgement = self.run_and_judge(built.build_dir, run_dir)
            tested = TestedCommit(commit, built.status, judgement, built.seconds, time.monotonic() - start,
                                  str(run_dir))
        with atomic_write(self.out_dir / TESTED_DIR / f"{commit.sha}.json", "w", what="bisect outcome") as f:
            json.dump(tested.to_json(), f, indent=2)
            f.write("\n")
        return tested

    def run_and_judge(self, build_dir: Path, run_dir: Path) -> Judgement:
        """`lockstep run` of the commit's build into its own run directory (the same pipeline, step-1
        certificate included; no report, no history: the bisect's report is its table, and its runs
        are not the framework's history), then the judge. A run that cannot even be planned here
        (say, the build made no executable) skips the commit."""
        from lockstep.pipeline import RunOutputs, run_pipeline

        request = dataclasses.replace(self.run_request, out=str(run_dir),
                                      framework_options=self.framework.with_build(self.run_request.framework_options,
                                                                                  build_dir))
        try:
            result = run_pipeline(request, outputs=RunOutputs(report=False))
        except LockstepError as e:
            return Judgement(SKIP, "NOT RUN", f"lockstep run could not start: {e}")
        if self.expect == EXPECT_IDENTICAL:
            return self.judge_identity(run_dir)
        return judge_summary(result.summary, run_dir / SUMMARY_NAME)

    def judge_identity(self, run_dir: Path) -> Judgement:
        """The commit's records against the good commit's, bit for bit (the good commit against itself)."""
        from lockstep.compare import compare_paths
        from lockstep.compare.options import CompareOptions

        name = self.framework.name
        base = (self.identical_to or run_dir) / name
        report = compare_paths(base, run_dir / name, CompareOptions(expect=EXPECT_IDENTICAL))
        entry = {"baseline_framework": f"{name} (good commit)", "test_framework": name, **report.to_json()}
        return judge_summary({"comparisons": [entry]}, run_dir / name)
