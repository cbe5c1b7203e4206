"""The report's tables as plain rows (header + rows of strings), shared by the HTML and Markdown
writers so both show the same numbers."""

from __future__ import annotations

from lockstep.cases.spec import dtype_of_case_name
from lockstep.compare.metadata import model_label
from lockstep.compare.policy import VerdictClass
from lockstep.compare.throughput import NOISY_CV, format_tokens_per_s, throughput_of
from lockstep.formats.run_manifest import read_manifest
from lockstep.report.data import ReportData


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


VERDICT_HEADER = ["test framework", "case", "dtype", "config", "steps", "max |Δloss|", "step of max", "threshold",
                  "verdict", "baseline tok/s (median ±CV)", "test tok/s (median ±CV)", "test/baseline (tokens ÷ time)",
                  "test/baseline (mean of steps 2..N, as the seed scripts)", "notes"]


def verdict_rows(data: ReportData) -> list[list[str]]:
    rows = []
    for fw, report in data.comparisons.items():
        for c in report.cases:
            verdict = c.verdict.value
            notes = "; ".join(([c.cause] if c.cause else []) + c.notes)
            rows.append([fw, c.case, c.dtype or "-", c.config or "-", str(len(c.diffs)) if c.diffs else "-",
                         _num(c.max_abs_diff, ".3e"), _num(c.max_diff_step, "d"), _num(c.threshold, ".0e"), verdict,
                         format_tokens_per_s(c.baseline.throughput), format_tokens_per_s(c.test.throughput),
                         _num(c.throughput_ratio, ".3f"), _num(c.throughput_ratio_mean_of_steps, ".3f"), notes])
        for case, reason in sorted(report.skipped.items()):
            rows.append([fw, case, dtype_of_case_name(case), "-", "-", "-", "-", "-", "SKIPPED", "-", "-", "-", "-",
                         reason])
    return rows


def skipped_lines(data: ReportData) -> list[str]:
    """The pairs `lockstep run` skipped on purpose, with the reason: expected, not problems."""
    return [f"{fw} / {case}: skipped ({reason})"
            for fw in data.frameworks + sorted(set(data.skipped) - set(data.frameworks))
            for case, reason in sorted(data.skipped.get(fw, {}).items())]


THROUGHPUT_HEADER = ["case", "framework", "tok/s median", "min", "max", "CV", "spread", "MFU", "model TFLOP/s",
                     "roofline tok/s", "% of roofline", "peak allocated MB", "peak reserved MB"]
THROUGHPUT_NOTE = (f"Over the steps after warm-up; every step's time is the slowest rank's. CV = sample standard "
                   f"deviation / mean; NOISY above {NOISY_CV:.0%}. MFU = FLOPs per token (PaLM: 6·N_matmul + "
                   f"12·L·T·C) × median tok/s ÷ (dense peak of the device for the dtype × devices); none on a CPU. "
                   f"Roofline tok/s = devices × B·T ÷ the time of the case's own GEMMs (forward and backward) timed "
                   f"alone on the run's device in its dtype; % of roofline = median tok/s ÷ roofline tok/s.")


TIMING_HEADER = ["framework", "case", "wall s", "start-up", "weights", "data", "training", "teardown",
                 "step-1 capture"]


def timing_note(data: ReportData) -> str:
    t = data.timing or {}
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in (t.get("stages") or {}).items())
    return (f"lockstep run took {t.get('total_s', 0):.1f} s ({stages}). Per framework and case, in seconds: start-up "
            "(process, imports, a worker group picking the case up), weights (reading the checkpoint, building "
            "the model and optimizer), data, training (every step; step 1 includes recording it for the "
            "certificate), teardown (after the last step)." + "".join(
                f" {line[0].upper()}{line[1:]}." for line in worker_startup_lines(t)))


def worker_startup_lines(timing: dict) -> list[str]:
    """Per worker group started: how long it took to be ready, by stage, and how long its first case waited."""
    lines = []
    for pair in timing.get("pairs", []):
        startup = pair.get("worker_startup")
        if not startup:
            continue
        stages = ", ".join(f"{k} {v:.1f}" for k, v in (startup.get("stages") or {}).items())
        lines.append(f"{pair['framework']} workers ready {startup.get('ready_after_s', 0):.1f} s after their start "
                     f"({stages}), {pair['case']} waited {startup.get('case_waited_s', 0):.1f} s for them")
    return lines


def timing_rows(data: ReportData) -> list[list[str]]:
    rows = []
    for pair in (data.timing or {}).get("pairs", []):
        phases = pair.get("phases") or {}
        rows.append([pair.get("framework", "-"), pair.get("case", "-"), _num(pair.get("wall_s"), ".1f"),
                     *[_num(phases.get(p), ".2f") for p in ("start-up", "weights", "data", "training", "teardown")],
                     _num(pair.get("step1_capture_s"), ".2f")])
    return rows


def throughput_rows(data: ReportData) -> list[list[str]]:
    rows = []
    for case in data.cases:
        for fw in data.frameworks:
            rec = data.records.get(case, {}).get(fw)
            if rec is None:
                continue
            t = throughput_of(rec, data.options.warmup_steps, data.options.peak_tflops)
            s = t.tokens_per_s
            rows.append([case, fw, _num(s and s.median, ",.0f"), _num(s and s.min, ",.0f"), _num(s and s.max, ",.0f"),
                         _num(s and s.cv, ".1%"), "-" if s is None else "NOISY" if s.noisy else "ok",
                         _num(t.mfu, ".1%"), _num(t.model_tflops, ".2f"), *roofline_cells(t),
                         _num(t.peak_allocated_mb, ",.0f"), _num(t.peak_reserved_mb, ",.0f")])
    return rows


def roofline_cells(t) -> list[str]:
    """The throughput table's "roofline tok/s" and "% of roofline" of one run."""
    return [_num(t.roofline_tokens_per_s, ",.0f"), _num(t.roofline_fraction, ".1%")]


def problem_lines(data: ReportData) -> list[str]:
    """Missing cases and unreadable files, one sentence each (skipped pairs are not problems)."""
    lines = list(data.problems)
    for fw, report in data.comparisons.items():
        lines += [f"{fw}: {m.message}" for m in report.missing]
        lines += [f"{fw}: {e.message}" for e in report.errors if e.case is None]
    for case, by_fw in sorted(data.unreadable.items()):
        lines += [f"{fw}/{case}: {err}" for fw, err in by_fw.items()]
    return lines


CERTIFICATE_HEADER = ["test framework", "case", "step 1 inside", "tensors compared", "worst relative error (tensor)",
                      "tolerance", "findings"]
CERTIFICATE_NOTE = ("The step-1 certificate: every module output and gradient of step 1 of the test compared with "
                    "the baseline's under canonical names (docs/reference/comparison.md). It holds when no finding "
                    "says the frameworks compute differently.")


def certificate_rows(data: ReportData) -> list[list[str]]:
    """One row per pair that has a certificate (what the terminal's "step 1 inside" column says,
    with the numbers behind it): holds / differs / none, the worst tensor per kind, the findings."""
    rows = []
    for fw, report in data.comparisons.items():
        for c in report.cases:
            cert = c.certificate
            if not cert:
                continue
            if not cert.get("available", True):
                rows.append([fw, c.case, "none", "-", "-", "-", cert.get("problem") or "no certificate"])
                continue
            compared = ", ".join(f"{n} {what}" for what, n in (cert.get("compared") or {}).items() if n) or "-"
            worst = "; ".join(f"{what} {d['rel_error']:.1e} ({d['tensor']})"
                              for what, d in (cert.get("worst") or {}).items() if d) or "-"
            findings = "; ".join(f.get("classification") or f.get("where", "") for f in cert.get("findings") or [])
            rows.append([fw, c.case, "holds" if cert.get("holds") else "differs", compared, worst,
                         _num(cert.get("tensor_tolerance"), ".0e"), findings or "none"])
    return rows


METADATA_HEADER = ["key", "value"]


def metadata_rows(data: ReportData) -> list[list[str]]:
    return [[k, model_label(v) if k == "model" else str(v)] for k, v in data.metadata.items() if k != "frameworks"]


FRAMEWORK_HEADER = ["framework", "version", "device", "torch", "started", "finished"]


def framework_rows(data: ReportData) -> list[list[str]]:
    rows = []
    for fw in data.frameworks:
        m = data.metadata.get("frameworks", {}).get(fw, {})
        rows.append([fw + (" (baseline)" if fw == data.baseline else ""), str(m.get("framework_version", "-")),
                     str(m.get("device_name", "-")), str(m.get("torch_version", "-")),
                     str(m.get("started_at", "-")), str(m.get("finished_at", "-"))])
    return rows


def incomplete_line(data: ReportData) -> str | None:
    """Said above everything else when files of the run could not be read: the verdicts below
    cover only what could."""
    n = len(data.unreadable_files())
    if not n:
        return None
    return (f"INCOMPLETE: {n} file(s) of this run could not be read or are not lockstep records (listed under "
            "Problems); the verdicts below leave them out.")


def interrupted_line(data: ReportData) -> str | None:
    """Said at the top of the report of a run that did not end (stopped by a signal, killed without
    a word, or still running): what it holds is what finished."""
    pairs = [f"{fw}/{case}" for fw, cases in data.interrupted.items() for case in cases]
    if not pairs:
        return None
    shown = ", ".join(pairs[:6]) + (f" and {len(pairs) - 6} more" if len(pairs) > 6 else "")
    n = f"{len(pairs)} (case, framework) pair(s)"
    pid = read_manifest(data.run_dir).get("pid")
    if data.unfinished == "running":
        return (f"STILL RUNNING: the run (pid {pid}) has not ended; this report covers the cases finished so far, "
                f"{n} have not: {shown}.")
    if data.unfinished == "killed":
        return (f"DID NOT FINISH: run.json says the run is running, but its process (pid {pid}) is gone: it was "
                f"killed (SIGKILL, out of memory, a lost machine); this report covers the cases that finished, "
                f"{n} did not: {shown}.")
    return (f"INTERRUPTED: the run was stopped before it ended; this report covers the cases that finished, "
            f"{n} did not: {shown}.")


RESUME_HEADER = ["framework", "case", "resumed from", "verdict", "sentence"]
RESUME_NOTE = ("Each resumed case against the run of the case that saved its checkpoint, after the resume point "
               "(docs/reference/checkpoints.md, \"Judging a resume\"): exact, within the dtype's threshold, or "
               "broken with its cause.")


def resume_rows(data: ReportData) -> list[list[str]]:
    """summary.json's resume verdicts; ERROR where the resume could not be judged."""
    rows = []
    for r in data.resumes:
        source = str(r.get("resume_case", "-"))
        if r.get("resume_from") is not None:
            source += f" (step {r['resume_from']})"
        rows.append([str(r.get("framework", "-")), str(r.get("case", "-")), source,
                     str(r.get("verdict") or "ERROR"), str(r.get("sentence") or r.get("error") or "-")])
    return rows


TWIN_HEADER = ["framework", "recompute case", "twin", "verdict"]
TWIN_NOTE = ("Each recompute case against the same framework's run of its twin without recompute, bit for bit: "
             "recompute trades compute for memory and must not change the math.")


def twin_rows(data: ReportData) -> list[list[str]]:
    """summary.json's recompute twins (compare/twins.py)."""
    return [[str(t.get("framework", "-")), str(t.get("case", "-")), str(t.get("twin", "-")),
             str(t.get("sentence", "-"))] for t in data.twins]


def overall_line(data: ReportData) -> str:
    if data.run_lines:
        return data.run_lines[0]  # the run's own verdict, as the terminal said it
    if data.passed is None:
        return f"Nothing ran on both {data.baseline} and another framework: nothing to compare."
    counts: dict[str, int] = {}
    for report in data.comparisons.values():
        for k, v in {**report.counts, **report.classes}.items():
            counts[k] = counts.get(k, 0) + v
    word = "PASS" if data.passed else "FAIL"
    skipped = f", {counts['skipped']} skipped" if counts.get("skipped") else ""
    within = counts.get(VerdictClass.PASS_WITHIN_PRECISION.value, 0)
    unexplained = counts.get(VerdictClass.FAIL_UNEXPLAINED.value, 0)
    return (f"{word}: {counts.get('passed', 0)} passed" + (f" ({within} within logging precision)" if within else "")
            + f", {counts.get('failed', 0)} failed" + (f" ({unexplained} unexplained)" if unexplained else "")
            + f", {counts.get('missing', 0)} missing, {counts.get('errors', 0)} errors"
            + (f", {counts['not_comparable']} not comparable" if counts.get("not_comparable") else "")
            + (f", {counts['speed_only']} speed only" if counts.get("speed_only") else "") + f"{skipped} "
            f"(against baseline {data.baseline})")
