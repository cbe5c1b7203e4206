"""Throughput as engineers read it, computed in one place for summary.json, the terminal tables
and the report: the median tok/s of a run with its spread (min, max, coefficient of variation)
over the steps after warm-up, peak device memory, MFU, and the share of the case's shape roofline.

Every step's time is already the slowest rank's (docs/reference/training-contract.md#timing), so a step's tok/s is the whole
job's. MFU = model FLOPs per token (the family config's `flops_per_token`, PaLM's convention)
× tok/s ÷ (the device's dense peak for the case's dtype × the number of devices). The peak comes
from `DEVICE_PEAKS` by device name, or from `--peak-tflops`; an unknown device (a CPU) gets no
MFU rather than a guess. "% of roofline" = median tok/s ÷ the case's shape roofline tok/s, its
own GEMMs timed alone on the run's device (lockstep/roofline.py), where `lockstep run` measured it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from lockstep.formats.run_record import RunRecord
from lockstep.step_contract import WARMUP_STEPS

# A measurement whose coefficient of variation over the measured steps is above this is "noisy":
# its median is shown, but the reader is told not to trust small differences.
NOISY_CV = 0.10


def coefficient_of_variation(values: list[float]) -> float:
    """The one CV of tok/s that every output shows (the compare tables, summary.json, the report,
    the history): the sample standard deviation over the mean; 0 for a single value, infinite
    for a mean of 0."""
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return sd / mean if mean > 0 else math.inf


def is_noisy(cv: float | None) -> bool:
    """NOISY: a CV above NOISY_CV (an unknown CV is not noisy)."""
    return cv is not None and cv > NOISY_CV


@dataclass(frozen=True)
class DevicePeak:
    match: str  # a substring of torch.cuda.get_device_name (case-insensitive)
    bf16_tflops: float  # dense BF16 tensor-core peak
    tf32_tflops: float  # dense TF32 tensor-core peak (for --peak-tflops users; the contract turns TF32 off)
    fp32_tflops: float  # IEEE FP32 (TF32 off, as the contract runs FP32 cases)


# NVIDIA's datasheets, dense: their tensor-core figures are "with sparsity", so halved here
# (H100/H200 SXM: BF16 1,979 -> 989.5, TF32 989 -> 494.5; FP32 66.9 per the H100 whitepaper, the
# datasheets' "67"). Sources: H100 datasheet (SXM, PCIe, NVL), H200 datasheet (SXM, NVL), GH200
# datasheet, A100 datasheet (SXM and PCIe alike), L40S, L40 and L4 datasheets. Order matters: the
# first match wins, so a name that contains another comes first (GH200 before H200, L40S before L40
# before L4, the PCIe and NVL parts before their SXM family).
DEVICE_PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("GH200", 989.5, 494.5, 66.9),
    DevicePeak("H200 NVL", 835.5, 417.5, 60.0),
    DevicePeak("H200", 989.5, 494.5, 66.9),  # SXM
    DevicePeak("H100 PCIe", 756.0, 378.0, 51.2),
    DevicePeak("H100 NVL", 835.5, 417.5, 60.0),
    DevicePeak("H100", 989.5, 494.5, 66.9),  # SXM ("NVIDIA H100 80GB HBM3")
    DevicePeak("A100", 312.0, 156.0, 19.5),
    DevicePeak("L40S", 362.05, 183.0, 91.6),
    DevicePeak("L40", 181.05, 90.5, 90.5),
    DevicePeak("L4", 121.0, 60.0, 30.3),
)


def device_peak_tflops(device_name: str | None, dtype: str | None, tf32: bool = False) -> float | None:
    """The device's dense peak TFLOP/s for a case's dtype (FP32 as IEEE FP32 unless `tf32`), or
    None for an unknown device."""
    if not device_name:
        return None
    for peak in DEVICE_PEAKS:
        if peak.match.lower() in device_name.lower():
            if dtype == "bfloat16":
                return peak.bf16_tflops
            return peak.tf32_tflops if tf32 else peak.fp32_tflops
    return None


@dataclass(frozen=True)
class Spread:
    """Median tok/s over the measured steps with its spread; `cv`: `coefficient_of_variation`."""

    steps: tuple[int, ...]
    median: float
    mean: float
    min: float
    max: float
    cv: float

    @property
    def noisy(self) -> bool:
        return is_noisy(self.cv)

    @classmethod
    def of(cls, steps: list[int], values: list[float]) -> "Spread | None":
        if not values:
            return None
        return cls(tuple(steps), statistics.median(values), statistics.fmean(values), min(values), max(values),
                   coefficient_of_variation(values))

    @classmethod
    def from_json(cls, d: dict) -> "Spread":
        return cls(tuple(d["steps"]), d["median"], d["mean"], d["min"], d["max"], d["cv"])

    def to_json(self) -> dict:
        return {"steps": list(self.steps), "median": self.median, "mean": self.mean, "min": self.min,
                "max": self.max, "cv": self.cv, "noisy": self.noisy}


@dataclass(frozen=True)
class Throughput:
    """One run's throughput figures (any of them may be unknown: None)."""

    tokens_per_s: Spread | None
    peak_allocated_mb: float | None  # torch max_memory_allocated / InfiniTrain "peak used", max over ranks
    peak_reserved_mb: float | None  # torch max_memory_reserved / InfiniTrain "peak reserved"
    flops_per_token: int | None
    devices: int
    peak_tflops: float | None  # per device, for the case's dtype
    peak_tflops_source: str | None  # "device table (NAME)" | "--peak-tflops"
    # The case's shape roofline (lockstep/roofline.py), for the whole job; None where not measured.
    roofline_tokens_per_s: float | None = None

    @property
    def noisy(self) -> bool:
        return self.tokens_per_s is not None and self.tokens_per_s.noisy

    @property
    def model_tflops(self) -> float | None:
        """Achieved model TFLOP/s (all devices together) at the median tok/s."""
        if self.tokens_per_s is None or self.flops_per_token is None:
            return None
        return self.flops_per_token * self.tokens_per_s.median / 1e12

    @property
    def mfu(self) -> float | None:
        achieved = self.model_tflops
        if achieved is None or not self.peak_tflops:
            return None
        return achieved / (self.peak_tflops * self.devices)

    @property
    def roofline_fraction(self) -> float | None:
        """The median tok/s as a fraction of the case's shape roofline."""
        if self.tokens_per_s is None or not self.roofline_tokens_per_s:
            return None
        return self.tokens_per_s.median / self.roofline_tokens_per_s

    def to_json(self) -> dict:
        return {"tokens_per_s": self.tokens_per_s.to_json() if self.tokens_per_s else None,
                "noisy": self.noisy, "noisy_cv_threshold": NOISY_CV,
                "peak_allocated_mb": self.peak_allocated_mb, "peak_reserved_mb": self.peak_reserved_mb,
                "flops_per_token": self.flops_per_token,
                "flops_per_token_convention": "PaLM: 6*N_matmul + 12*L*T*C (no causal discount)",
                "devices": self.devices, "peak_tflops_per_device": self.peak_tflops,
                "peak_tflops_source": self.peak_tflops_source, "model_tflops": self.model_tflops, "mfu": self.mfu,
                "roofline_tokens_per_s": self.roofline_tokens_per_s, "roofline_fraction": self.roofline_fraction}

    @classmethod
    def from_json(cls, d: dict | None) -> "Throughput | None":
        """Back from summary.json's block (for tables drawn from the summary)."""
        if not d:
            return None
        spread = Spread.from_json(d["tokens_per_s"]) if d.get("tokens_per_s") else None
        return cls(spread, d.get("peak_allocated_mb"), d.get("peak_reserved_mb"), d.get("flops_per_token"),
                   d.get("devices", 1), d.get("peak_tflops_per_device"), d.get("peak_tflops_source"),
                   d.get("roofline_tokens_per_s"))


def _flops_per_token(record: RunRecord) -> int | None:
    """From the record's model config and case spec; None for foreign logs that state neither."""
    from lockstep.models import config_from_dict

    model, spec = record.meta.get("model"), record.meta.get("case_spec") or {}
    seq_len = spec.get("seq_len")
    if not isinstance(model, dict) or "family" not in model or not seq_len:
        return None
    try:
        config = config_from_dict({k: v for k, v in model.items() if k != "name"})
    except Exception:  # an older or foreign record's model block: no MFU rather than a crash
        return None
    return config.flops_per_token(int(seq_len))


def _devices(record: RunRecord) -> int:
    spec = record.meta.get("case_spec") or {}
    if spec:
        return int(spec.get("dp", 1)) * int(spec.get("tp", 1)) * int(spec.get("pp", 1))
    if record.meta.get("world_size"):
        return int(record.meta["world_size"])
    par = record.meta.get("parallel") or {}
    return max(1, math.prod(int(v) for k, v in par.items() if k in ("dp", "tp", "pp")))


def _peak_memory(record: RunRecord) -> tuple[float | None, float | None]:
    mem = record.meta.get("peak_memory_mb") or {}
    allocated = mem.get("allocated")
    per_step = [s.peak_mem_mb for s in record.steps if s.peak_mem_mb is not None]
    if allocated is None and per_step:
        allocated = max(per_step)
    reserved = mem.get("reserved", record.meta.get("peak_reserved_mb"))
    return allocated, reserved


def throughput_of(record: RunRecord, warmup_steps: int = WARMUP_STEPS, peak_tflops: float | None = None) -> Throughput:
    """The figures of one run: tok/s over the steps after `warmup_steps`; `peak_tflops`
    (per device) overrides the device table; the shape roofline where `lockstep run` measured
    one for the record's case (`roofline_of`)."""
    measured = sorted((s for s in record.steps if s.step > warmup_steps and s.tokens_per_s is not None),
                      key=lambda s: s.step)
    spread = Spread.of([s.step for s in measured], [float(s.tokens_per_s) for s in measured])
    allocated, reserved = _peak_memory(record)
    if peak_tflops is not None:
        peak, source = peak_tflops, "--peak-tflops"
    else:
        name = record.meta.get("device_name")
        peak = device_peak_tflops(name, record.dtype) if record.meta.get("device", "cuda") != "cpu" else None
        source = f"device table ({name})" if peak is not None else None
    return Throughput(spread, allocated, reserved, _flops_per_token(record), _devices(record), peak, source,
                      roofline_of(record))


def roofline_of(record: RunRecord) -> float | None:
    """The job's shape-roofline tok/s that run.json beside the record holds for its case."""
    from lockstep.roofline import roofline_of_record

    roofline = roofline_of_record(record)
    return roofline.tokens_per_s if roofline is not None else None


# The headline test/baseline ratio and the seed scripts' figure beside it, for summary.json's
# `throughput_ratio` / `throughput_ratio_mean_of_steps`.
RATIO_DEFINITION = "test / baseline: tokens / time over the steps after warm-up (each step's time the slowest rank's)"
MEAN_RATIO_LABEL = "mean of steps 2..N, as the seed scripts"


def overall_tokens_per_s(record: RunRecord, warmup_steps: int = WARMUP_STEPS) -> float | None:
    """Total tokens ÷ total time over the steps after warm-up: what a run of many steps achieves.
    A mean of per-step tok/s lets one fast step dominate (a 10 ms step at 100x the rate counts as
    much as a 1 s step); here each step weighs by its time. Each step's time is already the
    slowest rank's (step_contract.slowest_rank). A step without its time (some foreign logs) falls
    back to the harmonic mean of tok/s, which is the same quotient when every step holds the same
    tokens, as the contract's steps do."""
    measured = [s for s in record.steps if s.step > warmup_steps and s.tokens_per_s is not None]
    if not measured:
        return None
    if all(s.step_ms is not None for s in measured):
        seconds = sum(s.step_ms for s in measured) / 1e3
        tokens = sum(s.tokens_per_s * s.step_ms / 1e3 for s in measured)
        return tokens / seconds if seconds > 0 else None
    if any(s.tokens_per_s <= 0 for s in measured):
        return 0.0
    return len(measured) / sum(1.0 / s.tokens_per_s for s in measured)


@dataclass(frozen=True)
class ThroughputRatio:
    """test ÷ baseline of one pair (above 1 the test is faster); None where a side lacks tok/s."""

    overall: float | None  # tokens ÷ time after warm-up, test over baseline: the headline
    mean_of_steps: float | None  # the ratio of the per-step tok/s means after warm-up (the seed scripts')


def throughput_ratio(baseline: RunRecord, test: RunRecord, warmup_steps: int = WARMUP_STEPS) -> ThroughputRatio:
    """The one place the pair's tok/s ratio is computed, both ways."""
    def quotient(t: float | None, b: float | None) -> float | None:
        return t / b if b and t is not None and math.isfinite(b) and b > 0 and math.isfinite(t) else None

    return ThroughputRatio(
        quotient(overall_tokens_per_s(test, warmup_steps), overall_tokens_per_s(baseline, warmup_steps)),
        quotient(test.mean_tokens_per_s(warmup_steps), baseline.mean_tokens_per_s(warmup_steps)))


@dataclass(frozen=True)
class RepeatedThroughput:
    """tok/s of one (framework, case) over `--repeat N`: the median over the measured steps of
    every repeat pooled, and the spread of the per-repeat medians (how far one run's figure moves
    from run to run, which a single run's CV cannot show)."""

    pooled: Spread  # every repeat's steps after warm-up, together
    medians: tuple[float, ...]  # each repeat's own median, in repeat order
    roofline_tokens_per_s: float | None = None  # the case's shape roofline, where the run measured one

    @property
    def repeats(self) -> int:
        return len(self.medians)

    @property
    def repeat_medians(self) -> Spread:
        """min, max and CV of the per-repeat medians (its `steps` are the repeat numbers)."""
        return Spread.of(list(range(1, len(self.medians) + 1)), list(self.medians))

    @property
    def noisy(self) -> bool:
        return self.pooled.noisy or self.repeat_medians.noisy

    @property
    def roofline_fraction(self) -> float | None:
        """The pooled median as a fraction of the case's shape roofline."""
        return self.pooled.median / self.roofline_tokens_per_s if self.roofline_tokens_per_s else None

    def to_json(self) -> dict:
        return {"repeats": self.repeats, "pooled": self.pooled.to_json(),
                "repeat_medians": {**self.repeat_medians.to_json(), "values": list(self.medians)},
                "noisy": self.noisy, "noisy_cv_threshold": NOISY_CV,
                "roofline_tokens_per_s": self.roofline_tokens_per_s, "roofline_fraction": self.roofline_fraction}


def throughput_over_repeats(records: list[RunRecord], warmup_steps: int = WARMUP_STEPS) -> RepeatedThroughput | None:
    """Pooled tok/s over the repeats' records (each a whole run of the same pair); None when no
    repeat has a measured step."""
    pooled_steps, pooled_values, medians = [], [], []
    for record in records:
        measured = [s for s in record.steps if s.step > warmup_steps and s.tokens_per_s is not None]
        if not measured:
            continue
        pooled_steps += [s.step for s in measured]
        pooled_values += [float(s.tokens_per_s) for s in measured]
        medians.append(statistics.median(float(s.tokens_per_s) for s in measured))
    if not medians:
        return None
    return RepeatedThroughput(Spread.of(pooled_steps, pooled_values), tuple(medians),
                              next(filter(None, map(roofline_of, records)), None))


def format_repeated_tokens_per_s(t: RepeatedThroughput | None) -> str:
    """`12,345 (repeats 12,001-12,600 ±2%)`: the pooled median, then the per-repeat medians' range
    and CV; `NOISY` when either spread is above NOISY_CV; `, 41% of roofline` where one was measured."""
    if t is None:
        return "-"
    m = t.repeat_medians
    limit = f", {t.roofline_fraction:.0%} of roofline" if t.roofline_fraction is not None else ""
    return (f"{t.pooled.median:,.0f} (repeats {m.min:,.0f}-{m.max:,.0f} ±{m.cv:.0%})"
            + (" NOISY" if t.noisy else "") + limit)


def format_tokens_per_s(t: Throughput | None) -> str:
    """`12,345 ±3%` (median and CV), with `NOISY` when the CV is above NOISY_CV; `-` if unknown."""
    if t is None or t.tokens_per_s is None:
        return "-"
    s = t.tokens_per_s
    return f"{s.median:,.0f} ±{s.cv:.0%}" + (" NOISY" if s.noisy else "")


def format_mfu(t: Throughput | None) -> str:
    return "-" if t is None or t.mfu is None else f"{t.mfu:.1%}"


def format_roofline(t: Throughput | None, with_limit: bool = True) -> str:
    """`41% of 52,000`: the median tok/s as a share of the case's shape roofline tok/s (`41%`
    without the limit); `-` where no roofline was measured (a CPU run without --roofline, a
    foreign log)."""
    if t is None or t.roofline_fraction is None:
        return "-"
    share = f"{t.roofline_fraction:.0%}"
    return f"{share} of {t.roofline_tokens_per_s:,.0f}" if with_limit else share


def format_roofline_pair(b: Throughput | None, t: Throughput | None) -> str:
    """`41% / 44%`: baseline's and test's share of the case's roofline (the tables that show both
    sides are narrow; the roofline tok/s itself is in the runs' table, the report and summary.json);
    `-` where neither side has one."""
    if (b is None or b.roofline_fraction is None) and (t is None or t.roofline_fraction is None):
        return "-"
    return f"{format_roofline(b, with_limit=False)} / {format_roofline(t, with_limit=False)}"


def format_memory(t: Throughput | None) -> str:
    """`1,234 / 2,048 MB` (peak allocated / reserved)."""
    if t is None or (t.peak_allocated_mb is None and t.peak_reserved_mb is None):
        return "-"
    fmt = lambda v: "-" if v is None else f"{v:,.0f}"  # noqa: E731
    return f"{fmt(t.peak_allocated_mb)} / {fmt(t.peak_reserved_mb)} MB"
