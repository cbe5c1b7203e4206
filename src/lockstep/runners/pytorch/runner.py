"""`pytorch` runner: in-process on one device, torchrun (gloo on CPU, NCCL on GPU) for DP > 1;
with persistent workers (runners/workers.py) one torchrun runs every DP case of one world size."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, TypeVar

from lockstep.capture.request import CaptureRequest
from lockstep.cases.spec import NEEDS_CHECKPOINT, NEEDS_LORA, CaseSpec
from lockstep.errors import LockstepError
from lockstep.formats.run_record import RunRecord
from lockstep.runners.base import (ExecuteResult, FrameworkRunner, RunInputs, StepInspector, StepCallback, base_meta,
                                   final_params_path, launch_meta, now_iso, oversubscribed_env,
                                   run_in_process, write_record_or_fail)
from lockstep.runners.launch import run_workers
from lockstep.runners.pytorch.services import ReferenceServicesMixin
from lockstep.runners.workers import WorkerGroup

TRAIN_MODULE = "lockstep.runners.pytorch.train"
T = TypeVar("T")


def reference_layout(case: CaseSpec) -> CaseSpec:
    """The layout the reference trains `case` at: its data-parallel layout (DP = world / (TP x PP),
    the same global batch and accumulation). The contract's data order and sums depend on DP, B and
    accum only (docs/reference/training-contract.md), so a TP/SP/PP case keeps its arithmetic."""
    return case.data_parallel_layout()


def reference_layout_note(case: CaseSpec) -> str | None:
    """What the record says of a case trained at another layout than its own (None: its own)."""
    if case.tp == 1 and case.pp == 1:
        return None
    return f"DP{case.dp} (TP/SP/PP do not change the contract's arithmetic)"


def released_after(train: Callable[[], T]) -> T:
    """`train()` in this process, then the device memory it held given back, whether it finished
    or failed: lockstep's own process must not keep a card the next framework's workers need.

    A failure's traceback holds the frames that hold the model, so its frames are dropped (its
    type and message kept, all that a record says of it) before the memory is released."""
    before = _device_allocated()
    try:
        result = train()
    except Exception as e:
        failure = _without_frames(e)
    else:
        release_device_memory(before)
        return result
    release_device_memory(before)
    raise failure


def _without_frames(error: BaseException) -> BaseException:
    seen = error
    while seen is not None:
        seen.__traceback__ = None
        seen = seen.__cause__ or seen.__context__
    return error


def _device_allocated() -> int:
    import torch

    return torch.cuda.memory_allocated() if torch.cuda.is_initialized() else 0


def release_device_memory(allocated_before: int = 0) -> None:
    """What is no longer referenced freed now (a collection, for what only a cycle still held),
    and torch's cached device blocks handed back to the driver: the caching allocator keeps them
    reserved for this process otherwise, where no other process can use them. On a GPU holding
    no more than before the pair (cuBLAS's workspaces, allocated by the first pair, stay), no
    collection: it costs ~0.1 s a pair with a 124M model's objects about, and would free no
    device memory."""
    import gc

    import torch

    on_cuda = torch.cuda.is_initialized()
    if not on_cuda or torch.cuda.memory_allocated() > allocated_before:
        gc.collect()
    if on_cuda:
        torch.cuda.empty_cache()


class PyTorchRunner(ReferenceServicesMixin, StepInspector, FrameworkRunner):
    name = "pytorch"
    # Save/resume through torch.distributed.checkpoint (checkpoint.py, docs/reference/checkpoints.md);
    # LoRA through the reference models' adapter (models/lora.py, docs/reference/lora.md).
    supports = frozenset({NEEDS_CHECKPOINT, NEEDS_LORA})

    def version(self) -> str:
        import torch

        return f"torch {torch.__version__}"

    def skip_reason(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        # A TP/SP/PP case is trained at its DP layout (reference_layout), not skipped.
        if case.checkpoint is not None and case.lora is not None:
            return "the pytorch reference trainer does not save and resume LoRA cases yet"
        if case.checkpoint is not None and case.zero:
            return "the pytorch reference trainer saves and resumes without ZeRO only (its sharded optimizers not yet)"
        return super().skip_reason(reference_layout(case), inputs)

    def capture_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        return None  # any case: its DP ranks run one after the other in one process, TP/PP are the same math

    def at_step_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        if case.zero:
            return "the pytorch reference saves and loads its training state without ZeRO only"
        return None  # its own torch.distributed.checkpoint folder (checkpoint.py)

    def capture(self, case: CaseSpec, inputs: RunInputs, work_dir: Path, request: CaptureRequest):
        from lockstep.runners.pytorch.train import capture_case

        return released_after(lambda: capture_case(reference_layout(case), str(inputs.checkpoint), str(inputs.tokens),
                                                   inputs.device, request, lora_seed=inputs.lora_seed))

    def fp64_step1(self, case: CaseSpec, inputs: RunInputs, path: Path):
        """Step 1 of the case in FP64, sketched (first sequences' outputs, as certificates keep them):
        how far FP32 arithmetic moves each tensor of the reference."""
        from lockstep.capture.request import CAPTURE_ROWS
        from lockstep.runners.pytorch.train import capture_case

        return released_after(lambda: capture_case(
            reference_layout(case), str(inputs.checkpoint), str(inputs.tokens), inputs.device,
            CaptureRequest(path=str(path), rows=CAPTURE_ROWS), framework="pytorch-fp64", float64=True,
            lora_seed=inputs.lora_seed))

    def train_fp64(self, case: CaseSpec, inputs: RunInputs, record_path: Path) -> RunRecord:
        """The case in FP64 (the policy's evidence of Adam amplification), as a record at `record_path`."""
        import torch

        from lockstep.runners.pytorch.train import train_fp64

        record = RunRecord(framework="pytorch-fp64", case=case.name, meta=base_meta(self, case, inputs),
                           source=str(record_path))
        record.meta["precision"] = "fp64 (evidence run: what exact arithmetic gives)"
        if note := reference_layout_note(case):
            record.meta["reference_layout"] = note
        try:
            record.steps = released_after(lambda: train_fp64(reference_layout(case), str(inputs.checkpoint),
                                                             str(inputs.tokens), inputs.device,
                                                             lora_seed=inputs.lora_seed))
        except (LockstepError, torch.cuda.OutOfMemoryError) as e:
            record.status, record.error = "failed", str(e)
        record.meta["finished_at"] = now_iso()  # as every runner's record (FrameworkRunner.run)
        Path(record_path).parent.mkdir(parents=True, exist_ok=True)
        write_record_or_fail(Path(record_path), record)
        return record

    def worker_group_key(self, case: CaseSpec, inputs: RunInputs):
        # One device trains in this process already; DP groups of one size share a torchrun.
        case = reference_layout(case)
        if case.world_size == 1:
            return None
        return ("torchrun", case.world_size, inputs.device, inputs.nodes,
                tuple(sorted(oversubscribed_env(case, inputs).items())))

    def open_workers(self, case: CaseSpec, inputs: RunInputs) -> WorkerGroup:
        case = reference_layout(case)
        return WorkerGroup(TRAIN_MODULE, case.world_size, inputs.device, env=oversubscribed_env(case, inputs), nodes=inputs.nodes,
                           label=f"pytorch, {case.world_size} ranks")

    def execute(self, case: CaseSpec, inputs: RunInputs, log_path: Path, on_step: StepCallback | None,
                workers: WorkerGroup | None = None) -> ExecuteResult:
        from lockstep.runners.pytorch.train import ProcessGroupInfo, train_case  # torch: imported when a case runs

        from lockstep.runners.pytorch.checkpoint import plan_for

        note, case = reference_layout_note(case), reference_layout(case)
        layout_meta = {"reference_layout": note} if note else {}
        params_path = str(final_params_path(log_path)) if inputs.save_final_params else None
        checkpoints = inputs.extra.get("pytorch_checkpoints") or plan_for(case, log_path)
        if checkpoints is not None:
            checkpoints.clear_earlier_saves()  # a resume after a failed save must not find an older run's
        if case.world_size == 1:
            # One process: step 1 is recorded as it trains (several ranks capture after the run).
            result = released_after(lambda: run_in_process(log_path, on_step, lambda emit, log: train_case(
                case, str(inputs.checkpoint), str(inputs.tokens), inputs.device, ProcessGroupInfo(), emit, log,
                final_params_path=params_path, capture=inputs.capture, checkpoints=checkpoints,
                lora_seed=inputs.lora_seed)))
            result.meta.update(layout_meta)
            return result
        job = {"case": case.to_dict(), "checkpoint": str(inputs.checkpoint), "tokens": str(inputs.tokens),
               "device": inputs.device, "final_params_path": params_path,
               "checkpoints": checkpoints.to_dict() if checkpoints else None, "lora_seed": inputs.lora_seed}
        env = oversubscribed_env(case, inputs)
        if workers is not None:
            steps, info = workers.run_job(job, log_path, timeout_s=inputs.timeout_s, on_step=on_step)
        else:
            steps, info = run_workers(TRAIN_MODULE, job, nproc=case.world_size, log_path=log_path,
                                      timeout_s=inputs.timeout_s, on_step=on_step, env=env, nodes=inputs.nodes)
        return ExecuteResult(steps=steps, meta={**info, **launch_meta(case, inputs, env), **layout_meta})
