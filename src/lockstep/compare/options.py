"""What `lockstep compare` can be told: thresholds, filters, warm-up, the Megatron-LM correction."""

from __future__ import annotations

from dataclasses import dataclass

from lockstep.step_contract import WARMUP_STEPS


STEP2_MODES = ("auto", "on", "off")
# What a comparison expects of the test against the baseline: the loss within the dtype's threshold
# (the default), or the same bits (two builds of one framework: compare/identity.py).
EXPECT_WITHIN_THRESHOLD = "within-threshold"
EXPECT_IDENTICAL = "identical"
EXPECTATIONS = (EXPECT_WITHIN_THRESHOLD, EXPECT_IDENTICAL)



@dataclass(frozen=True)
class CompareOptions:
    # None = the policy's default (policy.loss_threshold, docs/reference/case-matrices.md#thresholds).
    threshold_fp32: float | None = None
    threshold_bf16: float | None = None
    # A step passes when |Δloss| <= threshold + rtol * |baseline loss| (numpy.isclose's rule).
    rtol: float = 0.0
    # Throughput averages use the steps after this many (docs/reference/training-contract.md#timing).
    warmup_steps: int = WARMUP_STEPS
    min_tps_ratio: float | None = None  # test/baseline tok/s below this fails the case
    include_prefixes: tuple[str, ...] = ()
    include_cases: tuple[str, ...] = ()
    megatron_step2_correction: str = "auto"  # "auto" | "on" | "off"
    seq_length: int | None = None  # for Megatron-LM logs that state no sequence length
    peak_tflops: float | None = None  # per-device peak for MFU, instead of the device table
    expect: str = EXPECT_WITHIN_THRESHOLD

    def includes(self, case: str) -> bool:
        """A case is compared when no filter is given, or when it matches any of them."""
        if not self.include_prefixes and not self.include_cases:
            return True
        return case in self.include_cases or any(case.startswith(p) for p in self.include_prefixes)

    def to_dict(self) -> dict:
        return {"threshold_fp32": self.threshold_fp32, "threshold_bf16": self.threshold_bf16, "rtol": self.rtol,
                "warmup_steps": self.warmup_steps, "min_tps_ratio": self.min_tps_ratio,
                "include_prefixes": list(self.include_prefixes), "include_cases": list(self.include_cases),
                "megatron_step2_correction": self.megatron_step2_correction, "seq_length": self.seq_length,
                "peak_tflops": self.peak_tflops, "expect": self.expect}
