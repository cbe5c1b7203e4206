"""The verdict on one case (docs/reference/comparison.md#loss): loss step by step against the dtype threshold, the
pair's step-1 certificate where `lockstep run` made one, the class the policy (policy.py) gives
them, and throughput (tokens over time after warm-up on each side, test/baseline ratio;
compare/throughput.py's `throughput_ratio`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pathlib import Path

from lockstep.cases.spec import DTYPES, dtype_of_case_name
from lockstep.compare.inputs import input_differences
from lockstep.compare.loading import LoadedSide
from lockstep.compare.identity import IdentityVerdict, judge_identity
from lockstep.compare.options import EXPECT_IDENTICAL, CompareOptions
from lockstep.compare.lr_check import lr_mismatch
from lockstep.compare.policy import (PairJudgement, VerdictClass, amplification_evidence, judge_pair,
                                     logging_precision_bound, loss_threshold, wants_amplification_evidence)
from lockstep.compare.throughput import (MEAN_RATIO_LABEL, RATIO_DEFINITION, Throughput, overall_tokens_per_s,
                                        throughput_of, throughput_ratio)
from lockstep.errors import FormatError, LockstepError
from lockstep.formats.run_record import RunRecord, read_run_record



@dataclass(frozen=True)
class StepDiff:
    step: int
    baseline: float
    test: float
    abs_diff: float
    allowed: float  # threshold + rtol * |baseline|

    @property
    def within(self) -> bool:
        return self.abs_diff <= self.allowed


@dataclass
class SideSummary:
    """One side of a case as the report shows it."""

    file: str
    framework: str | None = None
    origin: str | None = None
    losses: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    tokens_per_s_mean: float | None = None  # the mean of per-step tok/s after warm-up (the seed scripts')
    tokens_per_s_overall: float | None = None  # tokens / time after warm-up (the headline ratio's)
    step_ms_mean: float | None = None
    throughput_steps: list[int] = field(default_factory=list)  # the steps the mean is over
    step2_corrected: bool = False
    # A native log prints rounded losses: the unit of its last printed digit (1e-6 for "%.6f");
    # None for records, which hold the full float.
    loss_quantum: float | None = None
    throughput: Throughput | None = None  # median tok/s with spread, peak memory, MFU

    def to_json(self) -> dict:
        return {"file": self.file, "framework": self.framework, "origin": self.origin, "losses": self.losses,
                "steps": self.steps, "tokens_per_s_mean": self.tokens_per_s_mean,
                "tokens_per_s_overall": self.tokens_per_s_overall, "step_ms_mean": self.step_ms_mean,
                "throughput_steps": self.throughput_steps, "megatron_step2_corrected": self.step2_corrected,
                "loss_quantum": self.loss_quantum,
                "throughput": self.throughput.to_json() if self.throughput else None}


@dataclass
class CaseVerdict:
    case: str
    baseline: SideSummary
    test: SideSummary
    dtype: str | None = None
    threshold: float | None = None
    threshold_source: str | None = None  # "default" | "option" | "megatron-lm gpt2 default"
    rtol: float = 0.0
    diffs: list[StepDiff] = field(default_factory=list)
    loss_passed: bool = False
    throughput_ratio: float | None = None  # test / baseline, tokens over time after warm-up (the headline)
    throughput_ratio_mean_of_steps: float | None = None  # the ratio of per-step tok/s means (the seed scripts')
    min_tps_ratio: float | None = None
    throughput_passed: bool | None = None  # None: no minimum ratio asked for
    config: str = ""
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    certificate: dict | None = None  # the pair's step-1 certificate (certify.Certificate.to_json())
    judgement: PairJudgement | None = None
    evidence_wanted: str | None = None  # what would explain this pair further ("fp64-reference")
    not_comparable: str | None = None  # what differs between the inputs the two sides trained from
    identity: "IdentityVerdict | None" = None  # --expect identical: bit for bit, or where it first differs
    lr_mismatch: str | None = None  # a side that trained a step at another lr than the contract's (lr_check.py)
    speed_anchor: str | None = None  # a side trains its own recipe (why, from its record): tok/s only, no loss verdict

    @property
    def max_abs_diff(self) -> float | None:
        return max((d.abs_diff for d in self.diffs), default=None)

    @property
    def max_diff_step(self) -> int | None:
        if not self.diffs:
            return None
        return max(self.diffs, key=lambda d: d.abs_diff).step

    @property
    def first_failing_step(self) -> int | None:
        return next((d.step for d in self.diffs if not d.within), None)

    @property
    def verdict(self) -> VerdictClass:
        if self.error is not None:
            return VerdictClass.ERROR
        if self.not_comparable is not None:
            return VerdictClass.NOT_COMPARABLE
        if self.speed_anchor is not None:
            return VerdictClass.SPEED_ONLY
        if self.identity is not None:
            return VerdictClass.IDENTICAL if self.identity.identical else VerdictClass.NOT_IDENTICAL
        if self.lr_mismatch is not None:
            return VerdictClass.FAIL
        verdict = self.judgement.verdict if self.judgement else (VerdictClass.PASS if self.loss_passed else
                                                                 VerdictClass.FAIL_UNEXPLAINED)
        return VerdictClass.FAIL if verdict.passes and self.throughput_passed is False else verdict

    @property
    def cause(self) -> str | None:
        if self.error is not None:
            return self.error
        if self.not_comparable is not None:
            return f"not comparable: {self.not_comparable}"
        if self.speed_anchor is not None:
            return f"loss not judged ({self.speed_anchor})"
        if self.lr_mismatch is not None:
            return f"lr: {self.lr_mismatch}"
        if self.throughput_passed is False:
            return f"too slow: tok/s ratio {self.throughput_ratio} < {self.min_tps_ratio}"
        if self.identity is not None and not self.identity.identical:
            return self.identity.difference()
        return self.judgement.cause if self.judgement else None

    @property
    def passed(self) -> bool:
        return self.verdict.passes

    @property
    def failing_steps(self) -> int:
        return sum(not d.within for d in self.diffs)

    @property
    def resolution(self) -> float | None:
        """How far |Δloss| may be from the true difference because a side is a log that prints
        rounded losses: half a unit in the last printed digit, per side. None for two records."""
        qb, qt = self.baseline.loss_quantum, self.test.loss_quantum
        if qb is None and qt is None:
            return None
        return ((qb or 0.0) + (qt or 0.0)) / 2

    def resolution_note(self) -> str | None:
        """Which side's printed precision limits the comparison, in one sentence."""
        res = self.resolution
        if res is None:
            return None
        sides = [f"{name} ({s.file}) prints losses to {s.loss_quantum:.0e}"
                 for name, s in (("baseline", self.baseline), ("test", self.test)) if s.loss_quantum is not None]
        limit = (f", within 10x of the threshold {self.threshold:.0e}: the log's precision limits this comparison"
                 if self.threshold is not None and res * 10 >= self.threshold * (1 - 1e-9) else "")
        return f"loss precision: {' and '.join(sides)}: |Δloss| is known only to ±{res:.1e}{limit}"

    def to_json(self) -> dict:
        return {
            "case": self.case, "dtype": self.dtype, "threshold": self.threshold,
            "threshold_source": self.threshold_source, "rtol": self.rtol,
            "max_abs_diff": self.max_abs_diff, "max_diff_step": self.max_diff_step,
            "first_failing_step": self.first_failing_step, "failing_steps": self.failing_steps,
            "resolution": self.resolution,
            "passed": self.passed, "loss_passed": self.loss_passed if self.error is None else False,
            "verdict": self.verdict.value, "cause": self.cause,
            "precision_bound": self.judgement.bound.to_json() if self.judgement and self.judgement.bound else None,
            "amplification": (self.judgement.amplification.to_json()
                              if self.judgement and self.judgement.amplification else None),
            "certificate": self.certificate, "evidence_wanted": self.evidence_wanted,
            "steps": len(self.diffs),
            "abs_diffs": [d.abs_diff for d in self.diffs],
            "baseline": self.baseline.to_json(), "test": self.test.to_json(),
            "throughput_ratio": self.throughput_ratio, "throughput_ratio_definition": RATIO_DEFINITION,
            "throughput_ratio_mean_of_steps": self.throughput_ratio_mean_of_steps,
            "throughput_ratio_mean_of_steps_definition": MEAN_RATIO_LABEL,
            "min_tps_ratio": self.min_tps_ratio, "throughput_passed": self.throughput_passed,
            "config": self.config, "notes": self.notes, "error": self.error, "not_comparable": self.not_comparable,
            "speed_anchor": self.speed_anchor,
            "identity": self.identity.to_json() if self.identity is not None else None,
            "lr_mismatch": self.lr_mismatch,
        }


def _summarise(side: LoadedSide, options: CompareOptions) -> SideSummary:
    warmup_steps = options.warmup_steps
    summary = SideSummary(file=str(side.file.path), step2_corrected=side.step2_corrected)
    rec = side.record
    if rec is None:
        return summary
    quantum = rec.meta.get("loss_quantum")
    summary.loss_quantum = float(quantum) if isinstance(quantum, (int, float)) and quantum > 0 else None
    ordered = sorted(rec.steps, key=lambda s: s.step)
    summary.framework, summary.origin = rec.framework, rec.origin
    summary.losses = [s.loss for s in ordered]
    summary.steps = [s.step for s in ordered]
    summary.tokens_per_s_mean = rec.mean_tokens_per_s(warmup_steps)
    summary.tokens_per_s_overall = overall_tokens_per_s(rec, warmup_steps)
    summary.step_ms_mean = rec.mean_step_ms(warmup_steps)
    summary.throughput_steps = [s.step for s in ordered if s.step > warmup_steps and s.tokens_per_s is not None]
    summary.throughput = throughput_of(rec, warmup_steps, options.peak_tflops)
    return summary


def _dtype(case: str, baseline: RunRecord, test: RunRecord) -> str:
    """From the records' case specs, else the case name suffix (docs/reference/comparison.md#loss: the dtype is
    the case's)."""
    b, t = baseline.dtype, test.dtype
    if b and t and b != t:
        raise FormatError(test.source or case, f"dtype {t} differs from the baseline's {b} ({baseline.source})")
    dtype = b or t
    if dtype is None:
        names = {dtype_of_case_name(n) for n in (case, baseline.case, test.case)}
        dtype = "bfloat16" if "bfloat16" in names else "float32"
    if dtype not in DTYPES:
        raise FormatError(baseline.source or case, f"unknown dtype {dtype!r} in the case spec")
    return dtype


def _config(baseline: RunRecord, test: RunRecord) -> str:
    """A short label of the case's shape, from a case spec or what a native log states."""
    for rec in (test, baseline):
        spec = rec.meta.get("case_spec")
        if spec:
            parts = [f"DP={spec.get('dp', 1)}"]
            if spec.get("tp", 1) > 1:
                parts.append(f"TP={spec['tp']}" + ("+SP" if spec.get("sp") else ""))
            if spec.get("pp", 1) > 1:
                parts.append(f"PP={spec['pp']}" + (f"xVPP={spec['vpp']}" if spec.get("vpp", 1) > 1 else ""))
            parts += [f"B={spec.get('micro_batch')}", f"T={spec.get('seq_len')}", f"tokens/step={spec.get('total_batch')}"]
            return " ".join(parts)
    for rec in (test, baseline):
        par = rec.meta.get("parallel")
        if par:
            return " ".join(f"{k.upper()}={v}" for k, v in par.items() if k == "dp" or v > 1)
    return ""


def _align(case: str, baseline: RunRecord, test: RunRecord, threshold: float, rtol: float) -> list[StepDiff]:
    b = {s.step: s.loss for s in baseline.steps}
    t = {s.step: s.loss for s in test.steps}
    only_b, only_t = sorted(set(b) - set(t)), sorted(set(t) - set(b))
    if only_b or only_t:
        # Name the file that lacks steps: it is the one the user has to look at.
        lacking, other, gone = (test, baseline, only_b) if only_b else (baseline, test, only_t)
        raise FormatError(lacking.source or case,
                          f"lacks step(s) {_ranges(gone)} that {other.source or 'the other side'} has "
                          f"(steps {_ranges(sorted(b))} vs {_ranges(sorted(t))})")
    return [StepDiff(step, b[step], t[step], abs(b[step] - t[step]), threshold + rtol * abs(b[step]))
            for step in sorted(b)]


def _ranges(steps: list[int]) -> str:
    """[1,2,3,5] -> "1-3, 5"."""
    if not steps:
        return "none"
    out, start, prev = [], steps[0], steps[0]
    for s in steps[1:] + [None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if s is not None:
            start = prev = s
    return ", ".join(out)


def _record_notes(baseline: LoadedSide, test: LoadedSide) -> list[str]:
    """What the two records say of how they were made that a reader of the verdict must know."""
    notes = []
    for side, name in ((baseline, "baseline"), (test, "test")):
        rec = side.record
        if side.step2_corrected:
            notes.append(f"{name}: Megatron-LM step-2 running mean corrected "
                         f"(logged {rec.meta.get('megatron_step2_logged_loss'):.6f} -> "
                         f"{next(s.loss for s in rec.steps if s.step == 2):.6f})")
    for side, name in ((baseline, "baseline"), (test, "test")):
        if layout := side.record.meta.get("reference_layout"):
            # A trainer without TP/PP trained the case at its DP layout: said, never hidden.
            notes.append(f"{name} ({side.record.framework}) reference_layout: {layout}")
    for side, name in ((baseline, "baseline"), (test, "test")):
        # What a framework's record says its arithmetic does other than the contract's (TF32 GEMMs in FP32).
        notes += [f"{name} ({side.record.framework}) departs from the contract: {d}"
                  for d in side.record.meta.get("departures") or []]
    beta2 = (baseline.record.meta.get("case_spec") or {}).get("adam_beta2")
    if beta2 is not None:
        # A build hard-codes it (the plan says which): both sides trained with it, not the contract's.
        notes.append(f"trained with Adam beta2 {beta2:g}, a build's hard-coded value, not the family contract's")
    jobs = max(int(side.record.meta.get("jobs") or 1) for side in (baseline, test))
    if jobs > 1:
        notes.append(f"tok/s measured with --jobs {jobs}: runs of separate processes overlapped, so each may have "
                     "shared the machine with another")
    return notes


def judge_case(case: str, baseline: LoadedSide, test: LoadedSide, options: CompareOptions) -> CaseVerdict:
    verdict = CaseVerdict(case, _summarise(baseline, options), _summarise(test, options),
                          rtol=options.rtol, min_tps_ratio=options.min_tps_ratio)
    errors = [e for e in (baseline.error, test.error) if e]
    if errors:
        verdict.error = "; ".join(errors)
        return verdict
    b, t = baseline.record, test.record
    assert b is not None and t is not None
    verdict.notes += _record_notes(baseline, test)
    differs = input_differences(b, t)
    if differs:
        # Different inputs: the losses part because the inputs do (compare/inputs.py); no verdict.
        verdict.not_comparable = "; ".join(differs)
        return verdict
    try:
        verdict.dtype = _dtype(case, b, t)
        verdict.threshold, verdict.threshold_source = loss_threshold(case, verdict.dtype, b, t, options.threshold_fp32,
                                                                     options.threshold_bf16)
        verdict.config = _config(b, t)
        verdict.diffs = _align(case, b, t, verdict.threshold, options.rtol)
    except FormatError as e:
        verdict.error = str(e)
        return verdict
    verdict.loss_passed = all(d.within for d in verdict.diffs)
    verdict.speed_anchor = "; ".join(f"{r.framework}: {r.meta['speed_anchor']}" for r in (b, t)
                                     if r.meta.get("speed_anchor")) or None
    if verdict.speed_anchor is not None:
        _throughput(verdict, b, t, options)
        return verdict
    verdict.lr_mismatch = "; ".join(m for m in (lr_mismatch(b), lr_mismatch(t)) if m) or None
    verdict.judgement = _judge(case, baseline, test, verdict)
    if options.expect == EXPECT_IDENTICAL:
        verdict.identity = judge_identity(b, t)  # the loss's own class stays in the judgement, shown beside it
    verdict.notes += verdict.judgement.notes
    note = verdict.resolution_note()
    if note:
        verdict.notes.append(note)
    _throughput(verdict, b, t, options)
    if options.min_tps_ratio is not None:
        verdict.throughput_passed = verdict.throughput_ratio is not None and verdict.throughput_ratio >= options.min_tps_ratio
        if verdict.throughput_ratio is None:
            verdict.notes.append("throughput check failed: tok/s is unknown on "
                                 + ("the baseline" if not verdict.baseline.tokens_per_s_overall else "the test")
                                 + " side")
    return verdict


def _throughput(verdict: CaseVerdict, b: RunRecord, t: RunRecord, options: CompareOptions) -> None:
    ratio = throughput_ratio(b, t, options.warmup_steps)
    verdict.throughput_ratio, verdict.throughput_ratio_mean_of_steps = ratio.overall, ratio.mean_of_steps


def _judge(case: str, baseline: LoadedSide, test: LoadedSide, verdict: CaseVerdict) -> PairJudgement:
    """The policy's class of the pair, from the steps, its certificate and the evidence beside it."""
    b, t = baseline.record, test.record
    cert = _certificate(case, b, test)
    verdict.certificate = cert.to_json() if cert is not None else None
    bound = logging_precision_bound(b, t, verdict.resolution)
    evidence = None
    optimizer = (b.meta.get("optimizer") or {}).get("kind")
    if wants_amplification_evidence(verdict.diffs, verdict.threshold, cert, optimizer):
        evidence = amplification_evidence(b, t, _fp64_record(case, test))
        if evidence is None:
            verdict.evidence_wanted = "fp64-reference"
    return judge_pair(verdict.diffs, verdict.threshold, cert, bound, evidence)


def _run_dir_of(side: LoadedSide) -> Path | None:
    """The run directory a side's record sits in (`<run>/<framework>/<case>.jsonl`), or None."""
    from lockstep.compare.pairing import is_run_dir

    parent = Path(side.file.path).parent.parent
    return parent if is_run_dir(parent) else None


def _certificate(case: str, baseline: RunRecord, test: LoadedSide):
    """The certificate `lockstep run` left beside the test's record for this baseline, if any."""
    from lockstep.certify.certificate import certificate_path, read_certificate

    path = certificate_path(Path(test.file.path).parent, _bare(case))
    if not path.is_file():
        return None
    try:
        cert = read_certificate(path)
    except LockstepError:
        return None
    return cert if cert.baseline == baseline.framework else None


def _fp64_record(case: str, test: LoadedSide) -> RunRecord | None:
    run_dir = _run_dir_of(test)
    from lockstep.compare.pairing import EVIDENCE_DIR

    path = run_dir / EVIDENCE_DIR / f"{_bare(case)}.fp64.jsonl" if run_dir else None
    if path is None or not path.is_file():
        return None
    try:
        return read_run_record(path)
    except LockstepError:
        return None


def _bare(case: str) -> str:
    return case.rsplit("/", 1)[-1]
