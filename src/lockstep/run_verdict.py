"""The overall verdict that ends `lockstep run`: one line with the counts by class (compare/policy.py),
then what it rests on.

    FAIL: 2 PASS, 1 PASS within logging precision, 1 FAIL, 0 FAIL unexplained, 0 errors | 1 failed run | 2 skipped
      FAIL megatron vs pytorch: gpt2_2 (gradient of ln1b only ...)
      failed runs: infinitrain/gpt2_1
      skipped (2): needs 8 devices, this machine has 2 CPU cores: pytorch/gpt2_3, megatron/gpt2_3
      report: out/report.html, out/report.md | summary: out/summary.json

A run passes only when every pair that ran finished, something was compared, and every
comparison is in a passing class (the policy's run rule). A run where nothing ran, or where nothing could be compared although two
frameworks were asked for, fails and says so: it has proven nothing. A run of one framework says RAN
(`_one_framework`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.compare.policy import VerdictClass, class_of, count_classes, run_passes
from lockstep.compare.twins import twin_line
from lockstep.execute import CaseOutcome

MAX_NAMES = 6  # per line; the rest is counted, the full list is in run.json and summary.json


@dataclass
class RunVerdict:
    word: str  # PASS | FAIL | RAN (one framework: nothing compared with another framework)
    exit_code: int
    lines: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"verdict": self.word, "exit_code": self.exit_code, "lines": self.lines}


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_NAMES])
    return shown + (f" and {len(items) - MAX_NAMES} more" if len(items) > MAX_NAMES else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def skip_lines(skips: list[tuple[str, str]]) -> list[str]:
    """(reason, "framework/case") pairs as one line per distinct reason, in first-seen order, with
    its count and the first MAX_NAMES pairs: a matrix that skips the same way many times says it once."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for reason, pair in skips:
        by_reason[reason].append(pair)
    return [f"skipped ({len(pairs)}): {reason}: {_names(pairs)}" for reason, pairs in by_reason.items()]


def _one_framework(framework: str, summary: dict | None, failed: bool) -> tuple[str, int, str]:
    """A run of one framework: "RAN" whatever it compared within (no other framework was there to
    agree or differ with), "FAIL" when a run failed or a resume broke. The exit code follows the
    one rule of every run: 0 only when something was compared and it all holds, so a run that
    compared nothing exits 1 (comparison.md, Exit status)."""
    said = f"{framework} only (one framework)"
    if (summary or {}).get("determinism"):
        within = "its repeats compared with each other"
    elif (summary or {}).get("resumes"):
        within = "its resumes compared with the runs that saved them"
    elif (summary or {}).get("twins"):
        within = "its recompute cases compared with their twins without recompute"
    else:
        return ("FAIL" if failed else "RAN", 1,
                f"{'FAIL' if failed else 'RAN'}: {said}: nothing was compared; name a framework to compare it with "
                f"(--frameworks {framework},megatron) or --repeat N to compare its repeats")
    word = "FAIL" if failed else "RAN"
    return word, 1 if failed else 0, f"{word}: {said}: {within}"


def run_verdict(outcomes: list[CaseOutcome], summary: dict | None, frameworks: list[str],
                out_dir: Path, report_paths: list[Path] | None = None) -> RunVerdict:
    ran = [o for o in outcomes if o.record is not None]
    skipped = [o for o in outcomes if o.skipped]
    failed_runs = [f"{o.framework}/{o.case.name}" for o in ran if not o.record.ok]

    counts = count_classes(summary)
    failing: list[str] = []
    for comp in (summary or {}).get("comparisons", []):
        pair = f"{comp['test_framework']} vs {comp['baseline_framework']}"
        for c in comp.get("cases", []):
            verdict = class_of(c)
            if (verdict.judged and not verdict.passes) or verdict is VerdictClass.PASS_WITHIN_PRECISION:
                why = c.get("cause") or c.get("error")
                failing.append(f"  {verdict.value} {pair}: {c['case']}" + (f" ({why})" if why else ""))
        bad = [m.get("case") or "?" for m in comp.get("missing", []) if isinstance(m, dict)]
        if bad:
            failing.append(f"  ERROR {pair}: missing {_names(bad)}")
    # Resumes (compare/resume.py): a broken or unjudged one fails the run whatever its losses.
    bad_resumes = [r for r in (summary or {}).get("resumes", []) if not r.get("passed")]
    for r in bad_resumes:
        why = r.get("sentence") or r.get("error")
        failing.append(f"  resume {r['framework']}/{r['case']} (from {r['resume_case']}): {why}")
    # Recompute twins (compare/twins.py): recompute that changes a bit fails the run.
    bad_twins = [t for t in (summary or {}).get("twins", []) if not t.get("passed")]
    failing += [f"  {twin_line(t)}" for t in bad_twins]
    bad_checks = bad_resumes + bad_twins  # judged per framework, beside the pairs
    n_err = len(counts[VerdictClass.ERROR])
    compared = sum(len(v) for v in counts.values())

    head = ", ".join(f"{len(counts[c])} {c.value}" for c in VerdictClass if c is not VerdictClass.ERROR
                     and (c.counted_when_absent or counts[c])) + \
        f", {_plural(n_err, 'error')} | {_plural(len(failed_runs), 'failed run')} | {len(skipped)} skipped"
    lines: list[str] = []
    if not ran:
        word, code = "FAIL", 1
        lines.append(f"FAIL: nothing was compared: all {_plural(len(outcomes), '(case, framework) pair')} "
                     "were skipped on this machine")
    elif len(frameworks) > 1 and compared == 0:
        word, code = "FAIL", 1
        lines.append(f"FAIL: nothing was compared: no case ran on both the baseline {frameworks[0]} and another "
                     f"framework | {head}")
    elif len(frameworks) == 1:
        word, code, line = _one_framework(frameworks[0], summary, bool(failed_runs or bad_checks))
        lines.append(f"{line} | {head}")
    else:
        passed = run_passes(len(failed_runs), counts) and (summary or {}).get("passed") is not False \
            and not bad_checks
        word, code = ("PASS", 0) if passed else ("FAIL", 1)
        lines.append(f"{word}: {head}")
    lines += failing
    if failed_runs:
        lines.append(f"  failed runs: {_names(failed_runs)} (errors above, and in each record)")
    lines += ["  " + line for line in skip_lines([(o.skipped, f"{o.framework}/{o.case.name}") for o in skipped])]
    where = [f"report: {', '.join(str(p) for p in report_paths)}"] if report_paths else []
    if summary is not None:
        where.append(f"summary: {out_dir / 'summary.json'}")
    where.append(f"run: {out_dir / 'run.json'}")
    lines.append("  " + " | ".join(where))
    return RunVerdict(word, code, lines)
