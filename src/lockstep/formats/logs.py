"""Log lines other tools already read (SPEC section 6): writers used by lockstep's runners.

Parsers of these lines (and of InfiniTrain / Megatron-LM logs) live beside the writers so
that one regular expression and one format string can be checked against each other.
"""

from __future__ import annotations


def llmc_step_line(step: int, steps: int, loss: float, lr: float, step_ms: float, tokens_per_s: float) -> str:
    """`step    1/10 | train loss 5.356193 | lr 1.00e-04 | (12.34 ms | 20746 tok/s)` (llm.c / InfiniTrain)."""
    return f"step {step:4d}/{steps} | train loss {loss:.6f} | lr {lr:.2e} | ({step_ms:.2f} ms | {tokens_per_s:.0f} tok/s)"


def megatron_iteration_line(timestamp: str, step: int, steps: int, consumed_samples: int, step_ms: float, lr: float,
                            global_batch: int, loss: float, grad_norm: float | None = None) -> str:
    """Megatron-LM's `training_log` line, with the true per-step loss (no step-2 running mean)."""
    norm = f" grad norm: {grad_norm:.3f} |" if grad_norm is not None else ""
    return (f" [{timestamp}] iteration {step:8d}/{steps:8d} | consumed samples: {consumed_samples:12d} |"
            f" elapsed time per iteration (ms): {step_ms:.1f} | learning rate: {lr:.6E} |"
            f" global batch size: {global_batch:5d} | lm loss: {loss:.6E} | loss scale: 1.0 |{norm}"
            f" number of skipped iterations:   0 | number of nan iterations:   0 |")


def perf_step_line(step: int, steps: int, step_ms: float, tokens_per_s: float) -> str:
    return f"PERF step {step}/{steps} | {step_ms:.2f} ms | {tokens_per_s:.0f} tok/s"


def perf_summary_line(measured_steps: int, avg_ms: float, avg_tokens_per_s: float) -> str:
    return f"PERF summary | measured_steps {measured_steps} | avg {avg_ms:.2f} ms | avg {avg_tokens_per_s:.0f} tok/s"
