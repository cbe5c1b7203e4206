"""`lockstep bisect`'s data flow: plan (every check before any build) -> the two endpoints, which
must judge good and bad -> git's bisection, one CommitTester.test per commit git picks -> the
first bad commit, its diagnose -> OUT/bisect.json and OUT/bisect.md.

OUT holds:

    bisect-request.json   what was asked (a re-run with other options is refused, not mixed in)
    src/                  the worktree, only while the bisect runs
    builds/<sha>/         each commit's build (kept), builds/<sha>.log its log
    runs/<sha>/           each commit's `lockstep run` directory
    tested/<sha>.json     each commit's outcome: what a resumed bisect reuses
    bisect.json, bisect.md
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from lockstep.bisect.build import DEFAULT_BUILD_TIMEOUT_S, BuiltFramework, built_framework
from lockstep.bisect.evaluate import BUILDS_DIR, CommitTester, TestedCommit
from lockstep.bisect.git import (BisectError, Commit, Worktree, check_repository, commit_info, commits_between,
                                 is_ancestor, resolve_commit)
from lockstep.bisect.judge import BAD, GOOD
from lockstep.bisect.report import BisectResult, write_result
from lockstep.errors import LockstepError
from lockstep.fsutil import atomic_write
from lockstep.outdir import LOCK_NAME, locked_dir
from lockstep.plan import RunRequest, plan_run
from lockstep.compare.options import EXPECT_IDENTICAL, EXPECT_WITHIN_THRESHOLD
from lockstep.runners import built_frameworks

DEFAULT_FRAMEWORKS = ["pytorch", "infinitrain"]
REQUEST_NAME = "bisect-request.json"
WORKTREE_DIR = "src"
# RunRequest fields that change a commit's verdict: a re-run into the same OUT must keep them.
VERDICT_FIELDS = ("matrix", "cases", "frameworks", "model", "llmc", "data", "text", "steps", "device", "seed",
                  "record_step1")


@dataclass
class BisectRequest:
    repo: str
    good: str
    bad: str
    build: str | None
    out: str = "lockstep-bisect"
    run: RunRequest = field(default_factory=RunRequest)  # its out and build dir are set per commit
    build_timeout_s: float | None = DEFAULT_BUILD_TIMEOUT_S
    diagnose: bool = True
    # within-threshold: each commit's build against the baseline frameworks (the default); identical:
    # each commit's build against the good commit's, bit for bit (the baseline frameworks do not run).
    expect: str = EXPECT_WITHIN_THRESHOLD


@dataclass
class BisectPlan:
    repo: Path
    good: Commit
    bad: Commit
    build_command: str
    out_dir: Path
    run: RunRequest
    framework: BuiltFramework  # the framework under test: the last of run.frameworks
    commits: int  # commits git chooses among (good..bad)
    build_timeout_s: float | None = DEFAULT_BUILD_TIMEOUT_S
    diagnose: bool = True
    expect: str = EXPECT_WITHIN_THRESHOLD

    @property
    def max_steps(self) -> int:
        """About how many commits git's bisection tests when none is skipped: the first bad commit is
        one of the n commits of good..bad, so ceil(log2(n))."""
        return math.ceil(math.log2(self.commits)) if self.commits > 1 else 0

    def request_record(self) -> dict:
        """What a re-run into the same OUT must repeat for its verdicts and builds to be reused."""
        run = asdict(self.run)
        return {"repo": str(self.repo), "build": self.build_command, "framework": self.framework.name,
                "expect": self.expect, **{k: run[k] for k in VERDICT_FIELDS}}


def plan_bisect(req: BisectRequest) -> BisectPlan:
    """Every check that needs no build: the build command, the frameworks, the repository and both
    revisions, good an ancestor of bad, OUT usable, and the run options (via a baseline-only plan)."""
    if not (req.build or "").strip():
        raise BisectError("no build command: pass --build 'CMD' (it runs in the worktree with LOCKSTEP_BISECT_SRC "
                          "and LOCKSTEP_BISECT_BUILD set, and must leave the framework's executables in "
                          "$LOCKSTEP_BISECT_BUILD)")
    frameworks = req.run.frameworks or list(DEFAULT_FRAMEWORKS)
    identical = req.expect == EXPECT_IDENTICAL
    if identical:
        frameworks = frameworks[-1:]  # the good commit's build is its baseline
    elif len(frameworks) < 2:
        raise BisectError(f"--frameworks {','.join(frameworks)}: bisect needs a baseline and the framework under "
                          "test (the last one listed), e.g. pytorch,infinitrain")
    under_test = frameworks[-1]
    framework = built_framework(under_test, req.run.framework_options)
    if framework is None:
        built = [n for n, s in built_frameworks().items() if n in s.names()]
        raise BisectError(f"--frameworks {','.join(frameworks)}: the framework under test (the last one) must run "
                          f"from a build directory ({', '.join(built)}, or a --command-runner trainer), "
                          f"not {under_test}")
    if len(set(frameworks)) != len(frameworks):
        raise BisectError(f"--frameworks lists a framework twice: {','.join(frameworks)}")
    repo = check_repository(Path(req.repo))
    good = resolve_commit(repo, req.good, "--good")
    bad = resolve_commit(repo, req.bad, "--bad")
    if good == bad:
        raise BisectError(f"{repo}: --good {req.good} and --bad {req.bad} are the same commit {good[:10]}")
    if not is_ancestor(repo, good, bad):
        raise BisectError(f"{repo}: --good {req.good} ({good[:10]}) is not an ancestor of --bad {req.bad} "
                          f"({bad[:10]}); git bisects from an older good commit to a newer bad one")
    # identical: each commit records its step 1 from inside, judged bit for bit against the good
    # commit's (a change the loss never shows -- Adam's update is blind to a gradient's scale --
    # shows there).
    run = dataclasses.replace(req.run, frameworks=frameworks, record_step1=identical, **absolute_inputs(req.run))
    plan = BisectPlan(repo=repo, good=commit_info(repo, good), bad=commit_info(repo, bad), build_command=req.build,
                      out_dir=Path(req.out).absolute(), run=run, framework=framework,
                      commits=commits_between(repo, good, bad), build_timeout_s=req.build_timeout_s,
                      diagnose=req.diagnose and not identical, expect=req.expect)
    check_bisect_out(plan)
    # The matrix, cases, model, weights and tokens, checked (and made, cached) once with the baseline
    # frameworks alone: a typo in --cases must not wait for the first build.
    if not identical:
        plan_run(dataclasses.replace(run, frameworks=frameworks[:-1], out=str(plan.out_dir / "runs")))
    return plan


def absolute_inputs(run: RunRequest) -> dict:
    """The run's input files as absolute paths: every commit runs them, and a resumed bisect from
    another directory must find (and compare equal to) the same ones."""
    paths = {k: str(Path(v).expanduser().absolute()) for k in ("llmc", "data", "text")
             if (v := getattr(run, k))}
    if run.matrix and Path(run.matrix).expanduser().is_file():  # a TOML file, not a built-in name
        paths["matrix"] = str(Path(run.matrix).expanduser().absolute())
    return paths


def check_bisect_out(plan: BisectPlan) -> None:
    out = plan.out_dir
    if out.exists() and not out.is_dir():
        raise BisectError(f"{out}: --out is a file, not a directory; choose another --out")
    if not out.is_dir():
        return
    entries = sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME)
    if not entries:
        return
    if REQUEST_NAME not in entries:
        raise BisectError(f"{out}: --out is not empty ({', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''}) "
                          "and was not written by lockstep bisect; choose another --out")
    try:
        earlier = json.loads((out / REQUEST_NAME).read_text())
    except (OSError, ValueError):
        earlier = {}
    differs = [k for k, v in plan.request_record().items() if earlier.get(k) != _jsonable(v)]
    if differs:
        raise BisectError(f"{out}: holds a bisect with other options ({', '.join(differs)} differ), whose builds and "
                          "verdicts would not be this one's; choose another --out, or repeat its options to resume it")


def _jsonable(value):
    return json.loads(json.dumps(value))


def run_bisect(plan: BisectPlan, say: Callable[[str], None] = lambda text: None) -> BisectResult:
    start = time.monotonic()
    with locked_dir(plan.out_dir):
        check_bisect_out(plan)  # again, now that nobody else can be writing
        with atomic_write(plan.out_dir / REQUEST_NAME, "w", what="bisect request") as f:
            json.dump(plan.request_record(), f, indent=2)
            f.write("\n")
        worktree = Worktree(plan.repo, plan.out_dir / WORKTREE_DIR)
        worktree.add(plan.good.sha)
        try:
            result = _bisect(plan, worktree, say)
        finally:
            worktree.remove()
        if result.found and plan.diagnose:
            result.diagnose = diagnose_first_bad(result.first_bad, plan, say)
        result.seconds = time.monotonic() - start
        write_result(result)
    return result


def _bisect(plan: BisectPlan, worktree: Worktree, say: Callable[[str], None]) -> BisectResult:
    tester = CommitTester(plan.out_dir, worktree, plan.build_command, plan.framework, plan.run,
                          plan.build_timeout_s, say, expect=plan.expect)
    tested: list[TestedCommit] = []

    def test(commit: Commit, what: str) -> TestedCommit:
        say(f"{what}: {commit.short} {commit.subject}")
        outcome = tester.test(commit)
        tested.append(outcome)
        earlier = " (from an earlier run into this --out)" if outcome.earlier else ""
        say(f"{commit.short}: {outcome.state}, {outcome.judgement.verdict}{earlier}: {outcome.judgement.reason}")
        return outcome

    good = test(plan.good, "good endpoint")
    if plan.expect == EXPECT_IDENTICAL and good.run_dir:
        tester.identical_to = Path(good.run_dir)  # every later commit is judged against this build's run
    bad = test(plan.bad, "bad endpoint")
    if good.state != GOOD or bad.state != BAD:
        return BisectResult(plan, tested, reason=endpoint_problem(good, bad))
    say(f"bisecting {plan.commits} commits ({plan.good.short}..{plan.bad.short}): "
        f"about {plan.max_steps} to test")
    step = worktree.bisect_start(plan.good.sha, plan.bad.sha)
    number = 0
    while step.next_sha:
        number += 1
        outcome = test(commit_info(plan.repo, step.next_sha), f"step {number}")
        step = worktree.bisect_mark(outcome.commit.sha, outcome.state)
    by_sha = {t.commit.sha: t for t in tested}
    if step.first_bad:
        first_bad = by_sha.get(step.first_bad)
        if first_bad is None:  # git names only commits it was told are bad: tested above
            raise BisectError(f"git named {step.first_bad[:10]} the first bad commit, which lockstep did not test")
        return BisectResult(plan, tested, first_bad=first_bad)
    candidates = [commit_info(plan.repo, sha) for sha in step.candidates]
    return BisectResult(plan, tested, candidates=candidates,
                        reason="only skipped commits are left to test: the first bad commit could be any of "
                               + ", ".join(f"{c.short} ({c.subject})" for c in candidates))


def endpoint_problem(good: TestedCommit, bad: TestedCommit) -> str:
    """Why the bisection cannot start, with both endpoints' verdicts."""
    def said(t: TestedCommit) -> str:
        return f"{t.commit.short} is {t.state} ({t.judgement.verdict}: {t.judgement.reason})"

    return (f"--good must judge good and --bad bad, so there is nothing to bisect: --good {said(good)}; "
            f"--bad {said(bad)}")


def diagnose_first_bad(first_bad: TestedCommit, plan: BisectPlan, say: Callable[[str], None]) -> dict:
    """`lockstep diagnose` on the first bad commit's run directory, for its failing case. A diagnose
    that cannot run is said in the result; it never hides the commit that was found."""
    from lockstep.diagnose.run import DiagnoseRequest, plan_diagnose, run_diagnose, verdict_path

    j = first_bad.judgement
    if not j.failing_case or not first_bad.run_dir:
        return {"error": "no failing case to diagnose (the run was not compared)"}
    frameworks = [j.baseline or plan.run.frameworks[0], j.test or plan.framework.name]
    command = f"lockstep diagnose {first_bad.run_dir} --case {j.failing_case} --frameworks {','.join(frameworks)}"
    say(f"diagnose: {command}")
    try:
        dplan = plan_diagnose(DiagnoseRequest(case=j.failing_case, run_dir=first_bad.run_dir, frameworks=frameworks,
                                              timeout_s=plan.run.timeout_s,
                                              framework_options=plan.framework.with_build(
                                                  plan.run.framework_options,
                                                  plan.out_dir / BUILDS_DIR / first_bad.commit.sha)))
        verdicts = run_diagnose(dplan, say=say)
    except LockstepError as e:
        return {"command": command, "error": str(e)}
    v = verdicts[0]
    return {"command": command, "case": j.failing_case, "verdict": v.headline,
            "first_diverging_module": v.first_diverging_module,
            "findings": [f.line for f in v.findings], "path": str(verdict_path(dplan.out_dir, v))}
