"""`torchtitan` runner: torchtitan's Trainer in a worker process (worker.py), one per rank.

One rank runs as a plain process with torchrun's environment set by lockstep (launch.one_rank_env:
torchtitan's Trainer always starts a process group, gloo on a CPU); several under torchrun.
The parent never imports torchtitan. Step 1 is captured after the run, in this process, with
torchtitan's model and loss (capture.py).
"""

from __future__ import annotations

import importlib.metadata
import tempfile
from pathlib import Path

from lockstep.capture.request import CaptureRequest
from lockstep.cases.spec import CaseSpec
from lockstep.errors import RunError
from lockstep.formats.tokens import read_token_stream
from lockstep.runners.base import (ExecuteResult, FrameworkRunner, RunInputs, StepCallback, StepInspector,
                                   final_params_path, launch_meta, oversubscribed_env)
from lockstep.runners.launch import one_rank_env, run_workers
from lockstep.runners.torchtitan.options import INSTALL_HINT, torchtitan_installed
from lockstep.step_contract import LOGGED_FP32_SUM
from lockstep.runners.torchtitan.job import DEFAULT_TIMEOUT_S, WORKER_MODULE, TorchtitanJob


def torchtitan_version() -> str:
    try:
        return importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class TorchtitanRunner(StepInspector, FrameworkRunner):
    name = "torchtitan"
    logged_loss = LOGGED_FP32_SUM  # torchtitan's own logged loss (its loss function's value)

    def version(self) -> str:
        return f"torchtitan {torchtitan_version()}"

    def preflight(self, inputs: RunInputs) -> None:
        if not torchtitan_installed():
            raise RunError(f"torchtitan is not installed ({INSTALL_HINT})")

    def skip_reason(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        if case.pp > 1 or case.vpp > 1:
            return "lockstep does not drive torchtitan's pipeline schedules yet (its PP splits the model by its own rules)"
        if case.ep > 1:
            return "torchtitan trains no Mixtral-style MoE model here"
        return super().skip_reason(case, inputs)

    def capture_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        if case.world_size > 1:
            return "torchtitan's step 1 is captured on one device; several ranks' cases get no certificate yet"
        return None

    def at_step_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        """One device: the reference's state goes into torchtitan's model and optimizer in lockstep's
        process, through the weight mapping (capture.py), and its step N+1 is captured there."""
        if case.lora is not None:
            return "lockstep trains no LoRA case on torchtitan"
        return self.capture_problem(case, inputs)

    def capture(self, case: CaseSpec, inputs: RunInputs, work_dir: Path, request: CaptureRequest):
        """Step 1 with torchtitan's model (built by its config, the LLMC weights mapped in) and
        torchtitan's loss, in this process: capture.py."""
        from lockstep.runners.torchtitan.capture import capture_case

        return capture_case(case, inputs, request, framework=self.name)

    def execute(self, case: CaseSpec, inputs: RunInputs, log_path: Path, on_step: StepCallback | None) -> ExecuteResult:
        case.check(max_seq_len=inputs.model.max_seq_len,
                   available_tokens=len(read_token_stream(inputs.tokens, check_ids=False)))
        single = case.world_size == 1
        with tempfile.TemporaryDirectory(prefix="lockstep-torchtitan-") as td:
            error_path = Path(td) / "error.txt"
            job = TorchtitanJob(case=case, model=inputs.model, checkpoint=str(inputs.checkpoint),
                                tokens=str(inputs.tokens), device=inputs.device, dump_folder=str(Path(td) / "dump"),
                                model_name=inputs.model_name, error_path=str(error_path),
                                final_params_path=str(final_params_path(log_path)) if inputs.save_final_params else None)
            env = {**oversubscribed_env(case, inputs), **(one_rank_env() if single else {})}
            timeout = inputs.timeout_s or DEFAULT_TIMEOUT_S
            try:
                steps, info = run_workers(WORKER_MODULE, job.to_dict(), nproc=case.world_size, log_path=log_path,
                                          timeout_s=timeout, on_step=on_step, env=env, use_torchrun=not single,
                                          nodes=inputs.nodes)
            except RunError as e:
                if error_path.is_file() and error_path.read_text().strip():
                    raise RunError(f"{log_path}: {error_path.read_text().strip()}") from None
                raise
        meta = {**info, **launch_meta(case, inputs, env), "torchtitan_version": torchtitan_version(),
                "mixed_precision": ("torchtitan's FSDP2 MixedPrecisionPolicy (param_dtype bf16, reduce fp32): "
                                    "the whole forward and backward in bf16, not the contract's autocast")
                if case.is_bf16 else None}
        if single:
            meta["launcher"] = "one process (a single rank: no torchrun, its environment set by lockstep)"
        return ExecuteResult(steps=steps, meta={k: v for k, v in meta.items() if v is not None})
