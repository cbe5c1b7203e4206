"""The one place that turns a commit's `lockstep run` into good, bad or skip for git's bisection.

It reads only the run's summary (the RunResult's, or summary.json as `lockstep run` wrote it),
whose every case verdict already holds the pair's step-1 certificate: a commit is good when every
compared (case, framework) pair passes (`passed`), bad when any compared pair fails or could not
be compared (a crashed run, a missing case: lockstep's own run verdict fails those too), and
untestable (skipped) when nothing was compared at all. A case entry's class and cause (compare/policy.py,
from the loss and the step-1 certificate) are shown as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lockstep.compare.policy import VerdictClass, class_of
from lockstep.compare.run_dir import SUMMARY_NAME

GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclass(frozen=True)
class Judgement:
    state: str  # good | bad | skip: what git is told
    verdict: str  # PASS, FAIL, ERROR, or the summary's own verdict word
    reason: str  # one sentence: which pair decided it
    cause: str | None = None
    max_abs_diff: float | None = None  # the largest |Δloss| of any compared pair
    failing_case: str | None = None  # the worst failing case (for `lockstep diagnose`)
    baseline: str | None = None  # its comparison's frameworks
    test: str | None = None
    certificate: str | None = None  # the deciding pair's step-1 certificate (certificate_word)


def judge_run(run_dir: Path) -> Judgement:
    """The judgement of a run directory's summary.json."""
    path = Path(run_dir) / SUMMARY_NAME
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return Judgement(SKIP, "NO SUMMARY", f"{path} is missing or unreadable: the run did not reach its comparison")
    return judge_summary(summary, path)


def certificate_word(case: dict) -> str | None:
    """What the pair's step-1 certificate said: "agrees", "differs", "not made" (why is in
    the certificate), or None (the case had no certificate, e.g. BF16 or --no-certify)."""
    cert = case.get("certificate")
    if not isinstance(cert, dict):
        return None
    if not cert.get("available", True):
        return "not made"
    return "agrees" if cert.get("holds") else "differs"


def judge_summary(summary: dict, path: Path) -> Judgement:
    """good / bad / skip from a run's summary (`path`: where it is, for the sentences)."""
    compared: list[tuple[dict, dict]] = [(comp, case) for comp in summary.get("comparisons", [])
                                         for case in comp.get("cases", [])]
    diffs = [c["max_abs_diff"] for _, c in compared if isinstance(c.get("max_abs_diff"), (int, float))]
    max_diff = max(diffs, default=None)
    problems = [(comp, p) for comp in summary.get("comparisons", [])
                for p in comp.get("missing", []) + comp.get("errors", [])]
    problems += [({}, e) for e in summary.get("errors", [])]
    failing = [(comp, c) for comp, c in compared if not c.get("passed")]
    if failing:
        # Errors (a crashed run) first, then the largest |Δloss|: the pair a user looks at first.
        comp, worst = max(failing, key=lambda pc: (bool(pc[1].get("error")), pc[1].get("max_abs_diff") or 0.0))
        verdict = class_of(worst).value
        where = f"{worst['case']} {comp.get('test_framework')} vs {comp.get('baseline_framework')}"
        detail = (worst["error"] if worst.get("error") else
                  f"max |Δloss| {worst['max_abs_diff']:.3e} at step {worst.get('max_diff_step')}, "
                  f"threshold {worst.get('threshold'):.0e}")
        if not worst.get("error") and certificate_word(worst) == "differs" and \
                worst["max_abs_diff"] <= worst.get("threshold", 0.0):
            detail = f"the step-1 certificate differs while the loss agrees ({detail})"
        more = f" ({len(failing) - 1} more failing)" if len(failing) > 1 else ""
        # Identity has no threshold: its cause says where the bits first differ ("from step 1: ...").
        said = (f"{verdict} {worst['cause']}" if verdict == VerdictClass.NOT_IDENTICAL.value and worst.get("cause")
                else f"{verdict}, {detail}")
        return Judgement(BAD, verdict, f"{where}: {said}{more}", cause=worst.get("cause"),
                         max_abs_diff=max_diff, failing_case=worst["case"],
                         baseline=comp.get("baseline_framework"), test=comp.get("test_framework"),
                         certificate=certificate_word(worst))
    if problems:
        comp, problem = problems[0]
        message = problem.get("message", str(problem)) if isinstance(problem, dict) else str(problem)
        case = problem.get("case") if isinstance(problem, dict) else None
        return Judgement(BAD, "ERROR", message, max_abs_diff=max_diff, failing_case=case,
                         baseline=comp.get("baseline_framework"), test=comp.get("test_framework"))
    if not compared:
        return Judgement(SKIP, "NOT COMPARED", f"{path}: nothing was compared (every pair was skipped)")
    # Every pair passed: show the weakest pass ("PASS within logging precision" over "PASS").
    verdicts = [class_of(c).value for _, c in compared]
    verdict = next((v for v in verdicts if v != "PASS"), "PASS")
    causes = [c.get("cause") for _, c in compared if c.get("cause")]
    words = {certificate_word(c) for _, c in compared} - {None}
    certificate = "agrees" if words == {"agrees"} else ("/".join(sorted(words)) if words else None)
    return Judgement(GOOD, verdict, f"{len(compared)} compared pair(s) passed", cause=causes[0] if causes else None,
                     max_abs_diff=max_diff, certificate=certificate)
