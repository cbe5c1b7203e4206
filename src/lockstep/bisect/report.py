"""The end of `lockstep bisect`: OUT/bisect.json (everything) and OUT/bisect.md (for people): the
first bad commit, its verdict, its diagnose, and a table of every tested commit."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.bisect.build import BUILD_FAILED
from lockstep.bisect.evaluate import BUILDS_DIR, TestedCommit
from lockstep.bisect.git import Commit
from lockstep.compare.options import EXPECT_IDENTICAL
from lockstep.fsutil import atomic_write

RESULT_JSON, RESULT_MD = "bisect.json", "bisect.md"

TABLE_COLUMNS = ("#", "commit", "subject", "build", "verdict", "max |Δloss|", "seconds", "git told")
# Said under every table: a commit's verdict is `lockstep run`'s, not the loss alone.
JUDGED_AS = ("each commit is judged as `lockstep run` judges it: the loss curves and, for FP32 cases, the step-1 "
             "certificate (module outputs and gradients compared from inside); the verdict's cause names what decided it")


@dataclass
class BisectResult:
    plan: "BisectPlan"  # lockstep.bisect.run
    tested: list[TestedCommit]
    first_bad: TestedCommit | None = None
    reason: str = ""  # why there is no first bad commit
    candidates: list[Commit] = field(default_factory=list)  # only skipped commits left: any of these
    diagnose: dict | None = None
    seconds: float = 0.0

    @property
    def found(self) -> bool:
        return self.first_bad is not None

    @property
    def builds(self) -> int:
        """Builds this invocation made (reused and earlier ones not counted)."""
        return sum(t.build in ("ok", "failed") and not t.earlier for t in self.tested)


def build_label(t: TestedCommit) -> str:
    label = f"{t.build} (skipped)" if t.build == BUILD_FAILED else t.build
    return f"{label}, earlier run" if t.earlier else label


def verdict_label(t: TestedCommit) -> str:
    """The verdict, its cause, and what the step-1 certificate said (the verdict includes it)."""
    j = t.judgement
    return (j.verdict + (f" ({j.cause})" if j.cause else "")
            + (f"; step-1 certificate {j.certificate}" if j.certificate else ""))


def baseline_words(plan) -> str:
    """What each commit's build is judged against."""
    if plan.expect == EXPECT_IDENTICAL:
        return "the good commit's build, bit for bit"
    return ", ".join(plan.run.frameworks[:-1])


def format_diff(value: float | None) -> str:
    return "-" if value is None else f"{value:.3e}"


def table_rows(result: BisectResult) -> list[tuple[str, ...]]:
    return [(str(i), t.commit.short, t.commit.subject, build_label(t), verdict_label(t),
             format_diff(t.judgement.max_abs_diff), f"{t.seconds:.1f}", t.state)
            for i, t in enumerate(result.tested, 1)]


def headline(result: BisectResult) -> str:
    if not result.found:
        return f"no first bad commit: {result.reason}"
    t = result.first_bad
    return (f"first bad commit: {t.commit.sha} {t.commit.subject} ({t.commit.author_date}) | "
            f"{verdict_label(t)}, max |Δloss| {format_diff(t.judgement.max_abs_diff)}")


def result_json(result: BisectResult) -> dict:
    plan = result.plan
    first = None
    if result.first_bad is not None:
        t = result.first_bad
        first = {**t.to_json(), "build_dir": str(plan.out_dir / BUILDS_DIR / t.commit.sha)}
    return {
        "found": result.found, "headline": headline(result), "reason": result.reason or None,
        "first_bad": first, "candidates": [c.to_json() for c in result.candidates], "diagnose": result.diagnose,
        "repo": str(plan.repo), "good": plan.good.to_json(), "bad": plan.bad.to_json(),
        "build_command": plan.build_command, "frameworks": plan.run.frameworks,
        "framework_under_test": plan.framework.name, "commits_between": plan.commits,
        "bisect_steps_without_skips": plan.max_steps, "judged_as": JUDGED_AS, "builds": result.builds,
        "seconds": round(result.seconds, 1), "tested": [t.to_json() for t in result.tested],
    }


def result_markdown(result: BisectResult) -> str:
    plan = result.plan
    lines = ["# lockstep bisect", "",
             f"`{plan.repo}`: {plan.good.short} (good) .. {plan.bad.short} (bad), {plan.commits} commits; "
             f"{plan.framework.name} against {baseline_words(plan)}; build: `{plan.build_command}`", "",
             f"**{headline(result)}**", ""]
    if result.found:
        t = result.first_bad
        lines += [f"- reason: {t.judgement.reason}", f"- run: `{t.run_dir}`",
                  f"- build: `{plan.out_dir / BUILDS_DIR / t.commit.sha}`"]
    d = result.diagnose
    if d:
        lines += ["", "## Diagnose of the first bad commit", "", f"`{d.get('command', '')}`", ""]
        if d.get("error"):
            lines.append(f"diagnose could not run: {d['error']}")
        else:
            lines += [f"- verdict: {d['verdict']}", f"- first diverging module: {d.get('first_diverging_module') or '-'}"]
            lines += [f"- {f}" for f in d.get("findings", [])] + [f"- details: `{d['path']}`"]
    lines += ["", f"## Tested commits ({len(result.tested)}; {result.builds} built by this run, "
                  f"{result.seconds:.0f} s)", "",
              markdown_row(TABLE_COLUMNS), "|" + "---|" * len(TABLE_COLUMNS)]
    lines += [markdown_row(row) for row in table_rows(result)]
    lines += ["", JUDGED_AS[0].upper() + JUDGED_AS[1:] + "."]
    return "\n".join(lines) + "\n"


def markdown_row(cells) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def write_result(result: BisectResult) -> tuple[Path, Path]:
    out = result.plan.out_dir
    with atomic_write(out / RESULT_JSON, "w", what="bisect result") as f:
        json.dump(result_json(result), f, indent=2, allow_nan=True)
        f.write("\n")
    with atomic_write(out / RESULT_MD, "w", what="bisect report") as f:
        f.write(result_markdown(result))
    return out / RESULT_JSON, out / RESULT_MD
