"""JUnit XML for CI systems: one testcase per (case, framework), the usual
testsuites/testsuite/testcase layout with failure, error and skipped children. summary.json stays
the machine-readable truth; this is what a CI page shows."""

from __future__ import annotations

from lockstep.compare.policy import VerdictClass, class_of

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from lockstep.fsutil import atomic_write


@dataclass
class JUnitCase:
    suite: str  # e.g. "infinitrain vs pytorch", "golden"
    classname: str  # e.g. "lockstep.infinitrain"
    name: str  # the case
    outcome: str  # "passed" | "failure" | "error" | "skipped"
    message: str = ""
    details: str = ""
    properties: dict[str, str] = field(default_factory=dict)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3e}"


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def cases_from_comparisons(comparisons: list[dict], nothing_compared_is_error: bool = True) -> list[JUnitCase]:
    """From summary.json's comparisons (or one ComparisonReport.to_json() with the framework names
    added): PASS -> passed, FAIL -> failure with max |Δloss| and step, ERROR and missing -> error,
    skipped pairs -> skipped. When no case was judged at all, one error testcase says so (a CI page
    must not show a green 0 tests for a run that proved nothing); `nothing_compared_is_error=False`
    where something else was compared (a one-framework run's --repeat repeats)."""
    out = _judged_cases(comparisons)
    if nothing_compared_is_error and all(c.outcome == "skipped" for c in out):
        why = ("one framework ran alone: no test framework was compared with the baseline" if not comparisons
               else "no case ran on both the baseline and a test framework")
        out.append(JUnitCase("lockstep", "lockstep.run", "(comparison)", "error", f"nothing was compared: {why}"))
    return out


def _judged_cases(comparisons: list[dict]) -> list[JUnitCase]:
    out = []
    for comp in comparisons:
        base, test = comp["baseline_framework"], comp["test_framework"]
        suite, cls = f"{test} vs {base}", f"lockstep.{test}"
        for c in comp.get("cases", []):
            props = {"dtype": str(c.get("dtype")), "max_abs_diff": _fmt(c.get("max_abs_diff")),
                     "max_diff_step": str(c.get("max_diff_step")), "threshold": _fmt(c.get("threshold")),
                     "throughput_ratio": _ratio(c.get("throughput_ratio")),
                     "throughput_ratio_mean_of_steps": _ratio(c.get("throughput_ratio_mean_of_steps"))}
            verdict = class_of(c)
            props["verdict"] = verdict.value
            if c.get("error"):
                out.append(JUnitCase(suite, cls, c["case"], "error", c["error"], properties=props))
            elif verdict is VerdictClass.NOT_COMPARABLE:  # different inputs: no verdict on the frameworks
                out.append(JUnitCase(suite, cls, c["case"], "error", c.get("cause") or verdict.value, properties=props))
            elif not verdict.judged:  # a speed anchor: its tok/s is in the properties, its loss not judged
                out.append(JUnitCase(suite, cls, c["case"], "skipped", c.get("cause") or verdict.value, properties=props))
            elif not verdict.passes:
                if c.get("loss_passed", c.get("passed")):  # the certificate failed it
                    msg = f"{verdict.value}: {c.get('cause')}"
                else:
                    msg = (f"{verdict.value}: max |Δloss| {_fmt(c.get('max_abs_diff'))} at step {c.get('max_diff_step')} "
                           f"exceeds {_fmt(c.get('threshold'))} (first failing step {c.get('first_failing_step')})"
                           + (f"; {c['cause']}" if c.get("cause") else ""))
                details = "\n".join(f"step {s}: |Δloss| {d:.3e}" for s, d in
                                    zip((c.get("test") or {}).get("steps") or [], c.get("abs_diffs") or []))
                out.append(JUnitCase(suite, cls, c["case"], "failure", msg, details, props))
            elif c.get("throughput_passed") is False:
                out.append(JUnitCase(suite, cls, c["case"], "failure",
                                     f"tok/s ratio {props['throughput_ratio']} (test / baseline) is below "
                                     f"{c.get('min_tps_ratio')}", properties=props))
            else:
                out.append(JUnitCase(suite, cls, c["case"], "passed",
                                     f"{verdict.value}: max |Δloss| {_fmt(c.get('max_abs_diff'))} at step "
                                     f"{c.get('max_diff_step')}" + (f"; {c['cause']}" if c.get("cause") else ""),
                                     properties=props))
        for m in comp.get("missing", []):
            out.append(JUnitCase(suite, cls, m["case"], "error", m.get("message", "missing")))
        for e in comp.get("errors", []):
            if not e.get("case"):
                out.append(JUnitCase(suite, cls, "(comparison)", "error", e.get("message", "")))
        for s in comp.get("skipped", []):
            out.append(JUnitCase(suite, cls, s["case"], "skipped", s.get("reason", "")))
    return out


def to_xml(cases: list[JUnitCase], name: str = "lockstep") -> ET.Element:
    def counts(cs: list[JUnitCase]) -> dict[str, str]:
        return {"tests": str(len(cs)), "failures": str(sum(c.outcome == "failure" for c in cs)),
                "errors": str(sum(c.outcome == "error" for c in cs)),
                "skipped": str(sum(c.outcome == "skipped" for c in cs)), "time": "0"}

    root = ET.Element("testsuites", {"name": name, **counts(cases)})
    suites: dict[str, list[JUnitCase]] = {}
    for c in cases:
        suites.setdefault(c.suite, []).append(c)
    for suite_name, members in suites.items():
        suite = ET.SubElement(root, "testsuite", {"name": suite_name, **counts(members)})
        for c in members:
            tc = ET.SubElement(suite, "testcase", {"classname": c.classname, "name": c.name, "time": "0"})
            if c.outcome in ("failure", "error"):
                el = ET.SubElement(tc, c.outcome, {"message": c.message, "type": c.outcome})
                el.text = c.details or c.message
            elif c.outcome == "skipped":
                ET.SubElement(tc, "skipped", {"message": c.message})
            # The numbers go to system-out, not <properties>: the strict JUnit schema (xunit2,
            # Jenkins junit-10.xsd) allows no properties inside a testcase.
            lines = ([c.message] if c.outcome == "passed" and c.message else []) + \
                [f"{k}: {v}" for k, v in c.properties.items()]
            if lines:
                ET.SubElement(tc, "system-out").text = "\n".join(lines)
    return root


def write_junit(path: str | os.PathLike, cases: list[JUnitCase], name: str = "lockstep") -> None:
    tree = ET.ElementTree(to_xml(cases, name))
    ET.indent(tree)
    with atomic_write(path, "wb", what="JUnit XML") as f:
        tree.write(f, encoding="utf-8", xml_declaration=True)
