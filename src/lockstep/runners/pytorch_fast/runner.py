"""`pytorch-fast` runner: in-process on one device (runners/pytorch_fast/train.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from lockstep.capture.request import CaptureRequest
from lockstep.cases.spec import CaseSpec
from lockstep.runners.base import (ExecuteResult, FrameworkRunner, RunInputs, StepCallback, StepInspector,
                                   run_in_process)
from lockstep.runners.pytorch_fast.train import train_fast


class PyTorchFastRunner(StepInspector, FrameworkRunner):
    name = "pytorch-fast"

    def __init__(self, compile_model: bool = True):
        self.compile_model = compile_model

    def version(self) -> str:
        return f"torch {torch.__version__} (compile, SDPA, fused optimizer)"

    def skip_reason(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        if case.world_size > 1:
            return "pytorch-fast is a single-device throughput anchor (parallel cases run on pytorch and megatron)"
        return super().skip_reason(case, inputs)

    def capture_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        return None

    def at_step_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        return None  # plain torch: the reference's torch.distributed.checkpoint folder is its own format too

    def capture(self, case: CaseSpec, inputs: RunInputs, work_dir: Path, request: CaptureRequest):
        """Its model (SDPA attention) captured eagerly: torch.compile changes fusion and rounding, not
        the math, and hooks inside a compiled graph would break it up. From a saved state (diagnose
        --at-step) its own fused optimizer loads the state and makes the update."""
        from lockstep.runners.pytorch import capture_case
        from lockstep.runners.pytorch_fast import train as fast

        def fast_optimizer(spec, params, lr):
            return fast.build_fast_optimizer(spec, params, lr, fast.FastSettings())

        cap = capture_case(case, str(inputs.checkpoint), str(inputs.tokens), inputs.device, request,
                           framework=self.name, prepare_model=fast.use_sdpa, optimizer_for=fast_optimizer)
        cap.notes.append("pytorch-fast step 1 captured eagerly with SDPA attention (torch.compile fuses the same math)")
        return cap

    def execute(self, case: CaseSpec, inputs: RunInputs, log_path: Path, on_step: StepCallback | None) -> ExecuteResult:
        return run_in_process(log_path, on_step, lambda emit, log: train_fast(
            case, str(inputs.checkpoint), str(inputs.tokens), inputs.device, emit, log, compile_model=self.compile_model))
