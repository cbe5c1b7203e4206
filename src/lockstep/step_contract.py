"""The training contract's rules for one step (docs/reference/training-contract.md), in one place for every runner,
every capture and the comparison:

- timing: synchronize the device, start; data, forward, loss, backward, gradient communication,
  optimizer step; synchronize, stop (`StepClock`); with several ranks the step time is the
  slowest rank's (`slowest_rank`); tok/s = tokens per step / step time;
- warm-up: step 1 is warm-up, averages use steps 2..N (`WARMUP_STEPS`, `after_warmup`; every
  runner's summary line and every default of compare, the report and the history);
- the logged loss: the FP32 per-token losses' mean taken in FP64, / accum, summed over micro
  steps (`step_loss_fp64`), so that how a batch is split (DP ranks, micro steps) does not move
  it by an FP32 ulp; the gradient still comes from the FP32 mean;
- FP32 means IEEE matmuls: TF32 off (`fp32_matmul_precision`).

It also emulates the one other way a framework logs its loss that lockstep knows of,
InfiniTrain's: the per-token losses added one by one in FP32 (`fp32_sequential_loss`). Runners
that hold the per-token losses record it beside the loss (`StepRecord.loss_fp32_sum`), so the
comparison can compute how far that way of logging moves a step's value.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

WARMUP_STEPS = 1


def tokens_per_second(tokens: int, step_ms: float) -> float:
    """A step's throughput: the tokens it trained over its time."""
    return tokens / (step_ms / 1e3)


def after_warmup(per_step: list) -> list:
    """A run's per-step values (step 1 first) that averages use: those after the warm-up, or all of
    them when the run is no longer than its warm-up."""
    return per_step[WARMUP_STEPS:] or per_step

# How a framework's logged loss is made: what its last digits mean.
LOGGED_FP64_MEAN = "fp64-mean"  # FP64 mean of the FP32 per-token losses (exact to ~1e-15)
LOGGED_FP32_SEQUENTIAL = "fp32-sequential-sum"  # FP32 running sum of the per-token losses / count
LOGGED_FP32_SUM = "fp32-sum"  # torch's FP32 sum of the per-token losses / the step's count (torchtitan)
LOGGED_LOSS_WORDS = {
    LOGGED_FP64_MEAN: "FP64 mean of the FP32 per-token losses (exact to ~1e-15)",
    LOGGED_FP32_SEQUENTIAL: "FP32 sequential sum of the per-token losses / count",
    LOGGED_FP32_SUM: "FP32 sum (torch's reduction) of the per-token losses / the step's count",
}


@contextlib.contextmanager
def fp32_matmul_precision(enabled_tf32: bool):
    """Set TF32 for the run and restore the process-wide flags after (in-process runs)."""
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = enabled_tf32
    torch.backends.cudnn.allow_tf32 = enabled_tf32
    torch.set_float32_matmul_precision("high" if enabled_tf32 else "highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])


def synchronize(device) -> None:
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize(device)


class StepClock:
    """`with StepClock(device) as clock: <one step>` then `clock.seconds`: the step between two
    device synchronizations."""

    def __init__(self, device):
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> "StepClock":
        synchronize(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            synchronize(self.device)
        self.seconds = time.perf_counter() - self._t0


def slowest_rank(seconds: float, peak_mb: float, device, world: int) -> tuple[float, float]:
    """The slowest rank's step time and the largest peak memory over every rank (a collective)."""
    if world <= 1:
        return seconds, peak_mb
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds, peak_mb], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0].item()), float(t[1].item())


def step_loss_fp64(micro_token_losses: list, divisor: int):
    """Σ over micro batches of mean(token losses) in FP64, / divisor (accum, or accum·DP when one
    process runs every DP rank's micro batches); a float64 tensor on the losses' device."""
    import torch

    total = torch.zeros((), dtype=torch.float64, device=micro_token_losses[0].device)
    for losses in micro_token_losses:
        total += losses.detach().double().mean() / divisor
    return total


def logged_step_loss(micro_token_losses: list, accum: int, dp: int = 1) -> float:
    return float(step_loss_fp64(micro_token_losses, accum * dp).item())


def fp32_sequential_loss(token_losses) -> float:
    """The step loss as a trainer that adds per-token losses one by one in FP32 logs it
    (InfiniTrain's cross entropy): per micro batch an FP32 running sum / count, / accum, summed
    in FP32. `token_losses`: (micro batches, tokens), or a list of per-micro-batch arrays."""
    rows = [np.asarray(r, dtype=np.float32).reshape(-1) for r in token_losses]
    total = np.float32(0.0)
    for row in rows:
        s = np.cumsum(row, dtype=np.float32)[-1]  # cumsum adds sequentially
        total = np.float32(total + np.float32(np.float32(s / np.float32(row.size)) / np.float32(len(rows))))
    return float(total)


def fp32_sequential_of_tensors(micro_token_losses: list) -> float:
    """`fp32_sequential_loss` of per-micro-batch torch tensors (copied to the host after the clock)."""
    return fp32_sequential_loss([t.detach().float().cpu().numpy() for t in micro_token_losses])


# Where a run's time goes, per framework and case (run.json's "timing", the report's table).
PHASES = ("start-up", "weights", "data", "training", "teardown")


class Stopwatch:
    """Seconds by name: `with watch("name"): ...` adds the block's wall time to `seconds[name]`."""

    names: tuple[str, ...] | None = None  # the names allowed (None: any)

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)
            self._last = time.perf_counter()

    def add(self, name: str, seconds: float) -> None:
        if self.names is not None and name not in self.names:
            raise ValueError(f"unknown phase {name!r}; phases: {', '.join(self.names)}")
        self.seconds[name] = round(self.seconds.get(name, 0.0) + max(seconds, 0.0), 3)


class Phases(Stopwatch):
    """Wall time of the phases of one run, measured where they happen:

        phases = Phases()
        with phases("weights"): ...load the checkpoint...

    or, through straight-line code, `phases.lap("weights")` at the end of each stretch (the time
    since the previous lap, or since the start). `seconds` maps each phase to its seconds (a
    phase entered twice adds up); `started_wall` / the finish time let the runner's parent put the
    time before and after these in start-up and teardown."""

    names = PHASES

    def __init__(self):
        super().__init__()
        self.started_wall = time.time()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.add(name, now - self._last)
        self._last = now

    def to_dict(self) -> dict[str, float]:
        return {p: self.seconds[p] for p in PHASES if p in self.seconds}

    def report(self) -> dict:
        """What a runner returns for its record: the phases, and when they began and ended (wall clock)."""
        return {"phases": self.to_dict(), "case_started_wall": self.started_wall, "case_finished_wall": time.time()}
