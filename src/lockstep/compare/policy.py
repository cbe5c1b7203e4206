"""The verdict policy: one place that says what PASS and FAIL mean.

- Thresholds (docs/reference/case-matrices.md#thresholds): |Δloss| per step against FP32 1e-5 / BF16 1e-2, with two
  exceptions: FP32 2e-3 against an upstream Megatron-LM GPT-2 log, FP32 2e-2 for the seed's
  sequence-parallel (`_sp_`) cases; a user's own threshold replaces the defaults.
- Classes, one per (baseline, test) pair of a case, decided from the loss steps and the pair's
  step-1 certificate (certify/):
  * PASS: every step within the threshold, and no certificate says the frameworks differ;
  * PASS within logging precision: some step beyond the threshold, but the certificate holds
    (step 1 agrees from inside) and every step is within the threshold plus what one side's way
    of logging its loss moves it by (computed per step from the other side's per-token losses);
  * FAIL, with its cause: the certificate names a difference (a module, a gradient, a lost tie,
    micro batches paired wrong) -- also when the loss alone would pass --, or the loss parts by
    the amplification of last-bit differences by Adam, shown by evidence (certificate holds,
    step-1 loss equal, the test no farther from an FP64 reference than the FP32 reference is);
  * FAIL unexplained: the loss parts and nothing above explains it (say so, and how to look);
  * not comparable: the two records trained from different inputs (initial weights, tokens,
    lr, batch, steps: compare/inputs.py), so their losses say nothing about the frameworks;
  * ERROR: the pair could not be compared (a file, a missing step).
  A threshold is never loosened: a PASS within logging precision needs both the computed bound
  and a certificate that holds.
- The run rule: a run passes when every pair that ran finished, something was compared, and
  every comparison is in a passing class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from lockstep.formats.logs import ORIGIN_MEGATRON_LM
from lockstep.formats.run_record import RunRecord
from lockstep.step_contract import LOGGED_FP32_SEQUENTIAL

# docs/reference/case-matrices.md#thresholds. FP32 from InfiniTrain's test config, BF16 looser.
THRESHOLDS = {"float32": 1e-5, "bfloat16": 1e-2}
DTYPES = tuple(THRESHOLDS)  # the dtypes a case may have (golden files name one per case)
# The seed's sequence-parallel cases (`_sp_` in the name, e.g. qwen3_tp8_sp_fp32) compare FP32 at
# 2e-2: SP reorders the reductions of every norm and matmul over the sequence.
SP_FP32_THRESHOLD = 2e-2
# Against an upstream Megatron-LM GPT-2 log (either side), InfiniTrain's config uses FP32 2e-3
# (upstream's kernels are not bit-faithful to llm.c's math); only when the user gave no FP32 threshold.
MEGATRON_LM_GPT2_FP32_THRESHOLD = 2e-3
# Evidence of Adam amplification: the test stays within this factor of how far the FP32 reference
# itself departs from an FP64 run of the same case.
AMPLIFICATION_FACTOR = 3.0


class VerdictClass(str, Enum):
    PASS = "PASS"
    PASS_WITHIN_PRECISION = "PASS within logging precision"
    FAIL = "FAIL"
    FAIL_UNEXPLAINED = "FAIL unexplained"
    # The two records trained from different inputs (weights, tokens, hyper-parameters, steps):
    # no verdict on the frameworks, never a FAIL (compare/inputs.py).
    NOT_COMPARABLE = "not comparable"
    # A speed anchor (a command-runner trainer declaring `speed_anchor`, such as a hand-tuned trainer)
    # trains its own recipe from the same weights and tokens: its tok/s is read, its loss never judged.
    SPEED_ONLY = "speed only"
    ERROR = "ERROR"
    # --expect identical (compare/identity.py): two builds of one framework, bit for bit.
    IDENTICAL = "IDENTICAL"
    NOT_IDENTICAL = "NOT IDENTICAL"

    @property
    def passes(self) -> bool:
        return self in (VerdictClass.PASS, VerdictClass.PASS_WITHIN_PRECISION, VerdictClass.IDENTICAL)

    @property
    def counted_when_absent(self) -> bool:
        """Whether a run's head line counts it even at 0 (the classes every run can have)."""
        return self not in (VerdictClass.NOT_COMPARABLE, VerdictClass.IDENTICAL, VerdictClass.NOT_IDENTICAL,
                            VerdictClass.SPEED_ONLY)

    @property
    def judged(self) -> bool:
        """Whether the class says something about the two frameworks agreeing (a speed anchor's does not,
        so it never fails a run)."""
        return self is not VerdictClass.SPEED_ONLY

    @property
    def short(self) -> str:
        return {"PASS within logging precision": "PASS*", "FAIL unexplained": "FAIL?",
                "not comparable": "N/C",
                "speed only": "SPEED"}.get(self.value, self.value)


def class_of(entry: dict) -> VerdictClass:
    """The class of a case entry of summary.json (older summaries: from `passed` and `error`); a
    pair below the minimum tok/s ratio the user asked for fails whatever its loss."""
    if entry.get("verdict") in {c.value for c in VerdictClass}:
        verdict = VerdictClass(entry["verdict"])
        return VerdictClass.FAIL if verdict.passes and entry.get("throughput_passed") is False else verdict
    if entry.get("error"):
        return VerdictClass.ERROR
    return VerdictClass.PASS if entry.get("passed") else VerdictClass.FAIL


# ---------------------------------------------------------------------- thresholds


def _is_gpt2(case: str, record: RunRecord) -> bool:
    spec = record.meta.get("case_spec") or {}
    return spec.get("model", "").startswith("gpt2") or case.startswith("gpt2")


def loss_threshold(case: str, dtype: str, baseline: RunRecord | None = None, test: RunRecord | None = None,
                   user_fp32: float | None = None, user_bf16: float | None = None) -> tuple[float, str]:
    """The |Δloss| threshold of a case, and where it comes from: what every consumer (compare, the
    certificate's step-1 loss, diagnose's drift, golden files, determinism warnings) asks here,
    never `THRESHOLDS` itself. Without the records (nothing compared yet) the Megatron-LM log rule
    cannot apply."""
    explicit = user_bf16 if dtype == "bfloat16" else user_fp32
    if explicit is not None:
        return explicit, "option"
    # The looser FP32 default is about upstream Megatron-LM's numerics, whichever side its log is on.
    if dtype == "float32" and any(r is not None and r.origin == ORIGIN_MEGATRON_LM and _is_gpt2(case, r)
                                  for r in (baseline, test)):
        return MEGATRON_LM_GPT2_FP32_THRESHOLD, "megatron-lm gpt2 default"
    if dtype == "float32" and "_sp_" in case:
        return SP_FP32_THRESHOLD, "sequence-parallel default (_sp_ case)"
    return THRESHOLDS[dtype], "default"


# ---------------------------------------------------------------------- logging precision


@dataclass(frozen=True)
class PrecisionBound:
    """How far one side's way of logging moves each step's value (beyond the threshold)."""

    per_step: dict[int, float]
    side: str  # "test" | "baseline": the side that logs imprecisely
    how: str

    @property
    def worst(self) -> float:
        return max(self.per_step.values(), default=0.0)

    def to_json(self) -> dict:
        return {"side": self.side, "how": self.how, "worst": self.worst,
                "per_step": {str(k): v for k, v in sorted(self.per_step.items())}}


def logging_precision_bound(baseline: RunRecord, test: RunRecord, resolution: float | None) -> PrecisionBound | None:
    """Where one side logs its loss as an FP32 sequential sum (InfiniTrain) and the other holds
    the same step's per-token losses (`loss_fp32_sum`, recorded by lockstep's own runners): per
    step, |that emulation - the exact mean|, plus the printed digits' rounding."""
    for side, imprecise, exact in (("test", test, baseline), ("baseline", baseline, test)):
        if imprecise.meta.get("logged_loss") != LOGGED_FP32_SEQUENTIAL:
            continue
        if exact.meta.get("logged_loss") == LOGGED_FP32_SEQUENTIAL:
            return None  # both sides sum in FP32: neither knows the exact mean
        per_step = {s.step: abs(s.loss_fp32_sum - s.loss) + (resolution or 0.0)
                    for s in exact.steps if s.loss_fp32_sum is not None}
        if len(per_step) != len(exact.steps):
            return None
        return PrecisionBound(per_step, side, f"{imprecise.framework} logs an FP32 sequential sum of the per-token "
                                              f"losses; {exact.framework}'s own token losses, summed that way, move "
                                              "each step's value by up to this")
    return None


# ---------------------------------------------------------------------- Adam amplification


@dataclass(frozen=True)
class AmplificationEvidence:
    """The test's and the FP32 reference's distance from an FP64 run of the same case (steps 2..N)."""

    test_vs_fp64: float
    reference_vs_fp64: float
    reference_fp64: str  # the FP64 record

    @property
    def holds(self) -> bool:
        return self.test_vs_fp64 <= AMPLIFICATION_FACTOR * self.reference_vs_fp64

    def to_json(self) -> dict:
        return {"test_vs_fp64": self.test_vs_fp64, "reference_vs_fp64": self.reference_vs_fp64,
                "factor": AMPLIFICATION_FACTOR, "holds": self.holds, "reference_fp64": self.reference_fp64}


def amplification_evidence(baseline: RunRecord, test: RunRecord, fp64: RunRecord | None) -> AmplificationEvidence | None:
    if fp64 is None or not fp64.ok:
        return None
    exact = {s.step: s.loss for s in fp64.steps}
    b = {s.step: s.loss for s in baseline.steps}
    t = {s.step: s.loss for s in test.steps}
    steps = [s for s in exact if s > 1 and s in b and s in t]
    if not steps:
        return None
    return AmplificationEvidence(max(abs(t[s] - exact[s]) for s in steps), max(abs(b[s] - exact[s]) for s in steps),
                                 fp64.source or "")


def wants_amplification_evidence(diffs, threshold: float, certificate, optimizer_kind: str | None) -> bool:
    """Only a clean step 1 (certificate holds, step-1 loss within the threshold) of an Adam family
    that fails later can be Adam amplifying last-bit differences."""
    if optimizer_kind != "adam" or certificate is None or not certificate.holds:
        return False
    first = next((d for d in diffs if d.step == 1), None)
    return first is not None and first.abs_diff <= threshold and any(d.abs_diff > threshold for d in diffs)


# ---------------------------------------------------------------------- one pair


@dataclass
class PairJudgement:
    verdict: VerdictClass
    cause: str | None = None  # one line: what differs, or why it still passes
    bound: PrecisionBound | None = None
    amplification: AmplificationEvidence | None = None
    notes: list[str] = field(default_factory=list)


def judge_pair(diffs, threshold: float, certificate=None, bound: PrecisionBound | None = None,
               amplification: AmplificationEvidence | None = None, error: str | None = None) -> PairJudgement:
    """`diffs`: the per-step StepDiffs (each with `within` the threshold); `certificate`: the pair's
    certify.Certificate or None (not asked for, e.g. BF16)."""
    if error:
        return PairJudgement(VerdictClass.ERROR, error)
    loss_ok = all(d.within for d in diffs)
    if certificate is not None and certificate.available and not certificate.holds:
        return PairJudgement(VerdictClass.FAIL, certificate.cause_line,
                             notes=[] if not loss_ok else ["the loss alone is within the threshold at every step"])
    if loss_ok:
        return PairJudgement(VerdictClass.PASS)
    first_bad = next(d for d in diffs if not d.within)
    worst = max(diffs, key=lambda d: d.abs_diff)
    if certificate is None or not certificate.available:
        why = certificate.problem if certificate is not None else "none was asked for"
        return PairJudgement(VerdictClass.FAIL_UNEXPLAINED,
                             f"|Δloss| {worst.abs_diff:.2e} at step {worst.step} > {threshold:.0e} from step "
                             f"{first_bad.step} on, and no step-1 certificate to say why ({why})")
    if bound is not None and all(d.abs_diff <= d.allowed + bound.per_step.get(d.step, float("inf")) for d in diffs):
        return PairJudgement(VerdictClass.PASS_WITHIN_PRECISION,
                             f"step {certificate.step} agrees from inside, and |Δloss| {worst.abs_diff:.2e} (step {worst.step}) is within "
                             f"{threshold:.0e} + the {bound.side}'s logging precision (up to {bound.worst:.2e} per step: "
                             f"{bound.how})", bound=bound)
    if amplification is not None and amplification.holds:
        return PairJudgement(VerdictClass.FAIL,
                             f"Adam amplifies last-bit differences (no defect found): step {certificate.step} agrees from inside and in "
                             f"its loss, then the losses part as a bounded random walk, |Δloss| up to "
                             f"{worst.abs_diff:.2e}; the test is {amplification.test_vs_fp64:.2e} from an FP64 run of "
                             f"the case, the FP32 reference itself {amplification.reference_vs_fp64:.2e}",
                             bound=bound, amplification=amplification)
    tried = [f"logging precision (up to {bound.worst:.2e})" if bound else None,
             (f"Adam amplification (the test is {amplification.test_vs_fp64:.2e} from FP64, the reference "
              f"{amplification.reference_vs_fp64:.2e}: more than {AMPLIFICATION_FACTOR:g}x)") if amplification else None]
    tried = [t for t in tried if t]
    unexplained = (f"not explained by {' nor by '.join(tried)}" if tried else "nothing measured explains it") + (
        "" if bound else " (no logging-precision bound applies)")
    # summary_line() already reads "step N agrees from inside (...)"
    return PairJudgement(VerdictClass.FAIL_UNEXPLAINED,
                         f"{certificate.summary_line()}, but |Δloss| reaches "
                         f"{worst.abs_diff:.2e} at step {worst.step} (> {threshold:.0e} from step {first_bad.step}); "
                         f"{unexplained}: the update differs "
                         "(lockstep diagnose measures the drift)", bound=bound, amplification=amplification)


# ---------------------------------------------------------------------- the run


def count_classes(summary: dict | None) -> dict[VerdictClass, list[str]]:
    """Every compared pair of a summary by class: `<test> vs <baseline>: <case>` names."""
    out: dict[VerdictClass, list[str]] = {c: [] for c in VerdictClass}
    for comp in (summary or {}).get("comparisons", []):
        for c in comp.get("cases", []):
            out[class_of(c)].append(c["case"])
        out[VerdictClass.ERROR] += [m.get("case") or "?" for m in comp.get("missing", []) if isinstance(m, dict)]
        out[VerdictClass.ERROR] += ["?" for e in comp.get("errors", []) if not (isinstance(e, dict) and e.get("case"))]
    out[VerdictClass.ERROR] += ["?" for _ in (summary or {}).get("errors", [])]
    return out


def comparison_passes(cases: list, missing: list, errors: list) -> bool:
    """A framework against the baseline: something compared, nothing missing or broken, every case passing."""
    return bool(cases) and not missing and not errors and all(c.passed or not c.verdict.judged for c in cases)


def run_passes(failed_runs: int, counts: dict[VerdictClass, list[str]]) -> bool:
    failing = sum(len(v) for c, v in counts.items() if c.judged and not c.passes)
    return failed_runs == 0 and failing == 0 and sum(len(v) for v in counts.values()) > 0
