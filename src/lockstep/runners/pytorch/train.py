"""The reference training loop, run in-process (one device) or per rank under torchrun.

Follows the training contract (docs/reference/training-contract.md) line by line: the contract's data order,
mean CE / accum summed over micro steps and averaged over DP ranks, the family's optimizer
(SGD for GPT-2, Adam for Llama 3 / Qwen3) at the contract's lr of each step (cases/lr_schedule.py), FP32 with TF32 off or bf16
autocast around the forward with FP32 parameters, and a step time measured between two device
synchronizations (slowest rank). The model is the family's reference module (models/<family>/).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, TextIO

import torch
import torch.distributed as dist

from lockstep.cases.lr_schedule import lr_at
from lockstep.cases.spec import CaseSpec
from lockstep.data.loader import TokenBatches
from lockstep.errors import RunError
from lockstep.formats.logs import llmc_step_line, perf_summary_line
from lockstep.formats.run_record import StepRecord
from lockstep.formats.tokens import read_token_stream
from lockstep.models import family as model_family
from lockstep.models import load_checkpoint
from lockstep.models.family import OptimizerSpec
from lockstep.capture.request import CaptureRequest
from lockstep.formats.step_capture import StepCapture
from lockstep.runners.nodes import reports_results
from lockstep.runners.pytorch import step as reference_step
from lockstep.runners.pytorch.capture import StepRecorder, capture_step
from lockstep.runners.pytorch import checkpoint as saved_state
from lockstep.runners.pytorch.checkpoint import CheckpointPlan, ShiftedBatches, gather_rank_losses
from lockstep.runners.pytorch.step import MicroBatch
from lockstep.runners.memory import peak_memory_info
from lockstep.models.lora import LoraAdapters, apply_lora, canonical_parameters, lora_init_tensors
from lockstep.runners.base import write_final_params
from lockstep.step_contract import (Phases, StepClock, after_warmup, fp32_matmul_precision, fp32_sequential_of_tensors,
                                    slowest_rank, step_loss_fp64, tokens_per_second)


@dataclass(frozen=True)
class ProcessGroupInfo:
    """Where this process sits; world 1 when running in-process."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    reports: bool = True  # writes the log's step lines and the results (local rank 0 of node 0)

    @classmethod
    def from_env(cls) -> "ProcessGroupInfo":
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                   int(os.environ.get("LOCAL_RANK", 0)), reports_results())


def build_optimizer(spec: OptimizerSpec, params, lr: float) -> torch.optim.Optimizer:
    """The family's contract optimizer in torch: SGD without momentum, or bias-corrected Adam."""
    if spec.kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.0, weight_decay=spec.weight_decay)
    if spec.kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(spec.beta1, spec.beta2), eps=spec.eps,
                                weight_decay=spec.weight_decay)
    raise ValueError(f"unknown optimizer kind {spec.kind!r}")


def import_optimizer_machinery() -> None:
    """Import now what torch.optim imports when a process builds its first optimizer: torch._dynamo
    and what comes with it (torch.optim wraps its methods in `torch._disable_dynamo`), ~1 s on an
    H200 host and ~1.5 s on a 2-core CPU, once per process.

    `train_case` calls it before it sets the device: in lockstep's own process the CUDA context is
    then often still being made in a background thread (plan.start_cuda_beside), and setting the
    device waits for it (0.16 s on an H200 since the plan stopped hashing the cached init); an
    import made first runs during that wait, the driver needing no GIL, instead of after it."""
    try:
        import torch._dynamo  # noqa: F401
    except ImportError:  # torch.optim meets the same failure at the optimizer and says it there
        pass


def build_sharded_optimizer(spec: OptimizerSpec, params, lr: float, zero: int) -> torch.optim.Optimizer:
    """ZeRO-1: torch's ZeroRedundancyOptimizer, each rank updating its shard of the parameters
    with the contract optimizer and broadcasting it; the update of every element is the same
    arithmetic as the unsharded optimizer's. (ZeRO-2 shards in the module wrapper, FSDP2.)"""
    if zero != 1:
        return build_optimizer(spec, params, lr)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if spec.kind == "sgd":
        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, lr=lr, momentum=0.0,
                                       weight_decay=spec.weight_decay)
    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr=lr, betas=(spec.beta1, spec.beta2),
                                   eps=spec.eps, weight_decay=spec.weight_decay)


def wrap_data_parallel(model: torch.nn.Module, case: CaseSpec, device: torch.device) -> torch.nn.Module:
    """DDP (gradients all-reduced and averaged over ranks: the contract's "averaged over DP
    ranks"), or for ZeRO-2 FSDP2: gradients reduce-scattered (averaged) so each rank keeps and
    updates its shard, parameters gathered whole for the forward."""
    if case.zero == 2:
        # FSDP2, since FSDP1 refuses a CPU; reshard_after_forward=False keeps the gathered parameters
        # through the backward, FSDP1's SHARD_GRAD_OP (ZeRO-2) rather than FULL_SHARD (ZeRO-3).
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        return fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


DEFAULT_LORA_SEED = 42  # the plan's default seed (plan.RunRequest.seed): what a job without one uses


def build_reference(ckpt, case: CaseSpec, device: torch.device, lora_seed: int = DEFAULT_LORA_SEED
                    ) -> tuple[torch.nn.Module, LoraAdapters | None]:
    """The family's reference module with the checkpoint's weights on `device`; for a LoRA case
    with its adapters applied (everything else frozen) and loaded from the case's one init
    (models/lora.py `lora_init_tensors`, the same tensors every runner loads)."""
    # Built on the device: its random init (replaced by the checkpoint's weights at once) costs
    # milliseconds there and seconds on the host for a 124M model.
    with torch.device(device):
        model = model_family(ckpt.family).reference_class().from_llmc(ckpt.tensors, ckpt.config)
    if case.lora is None:
        return model, None
    adapters = apply_lora(model, case.lora)
    adapters.load_canonical(lora_init_tensors(ckpt.family, ckpt.config, case.lora, lora_seed),
                            f"the LoRA init of case {case.name} (seed {lora_seed})")
    return model, adapters


def final_state(model: torch.nn.Module) -> dict:
    """Every parameter (the adapters' too) under its canonical name, FP32 numpy copies."""
    return {name: p.detach().float().cpu().numpy().copy() for name, p in canonical_parameters(model).items()}


@contextlib.contextmanager
def no_sync(wrapped: torch.nn.Module, case: CaseSpec):
    """No gradient reduction on a micro step before the last (DDP's no_sync; FSDP2's switch)."""
    if case.zero == 2:
        wrapped.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)
    else:
        with wrapped.no_sync():
            yield


def rank_device(device_kind: str, pg: ProcessGroupInfo) -> torch.device:
    """This rank's device (its local GPU, made current), or the CPU."""
    if device_kind != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", pg.local_rank)
    torch.cuda.set_device(device)
    return device


def resumed(resume, model, optimizer, batches, info: dict):
    """The resume's step folder loaded into the model and optimizer; the batches, shifted where the
    saved data position is not its step."""
    began = time.perf_counter()
    shift = saved_state.load_training_state(resume, model, optimizer)
    info["checkpoint_load_s"] = round(time.perf_counter() - began, 3)
    return ShiftedBatches(batches, shift) if shift else batches


def header_line(case: CaseSpec, ckpt, family, device, lora_seed: int) -> str:
    """The log's first line: what trains, how, where."""
    return (f"lockstep pytorch runner | case {case.name} | {case.parallel_label} | dtype {case.dtype} | "
            f"B={case.micro_batch} T={case.seq_len} tokens/step={case.total_batch} accum={case.accum} | "
            f"{family.title} {ckpt.config.describe()} | "
            + (f"{case.lora.label} (seed {lora_seed}), base frozen | " if case.lora else "")
            + f"{case.optimizer_of(family.optimizer).label} lr {case.lr:g} | device {device} | torch {torch.__version__}")


def step_record(case: CaseSpec, step: int, micro_losses: list, lr: float, seconds: float, device, pg,
                evidence: dict | None) -> StepRecord:
    """The step's record after its clock stopped: the logged loss (FP64 mean, the contract's) averaged
    over ranks, what InfiniTrain's FP32 sequential sum would have logged for the same token losses (one
    process only), and the slowest rank's time and largest peak memory over every node. `evidence`
    (a checkpointed run of several ranks) gets each rank's own loss, the resume judge's evidence."""
    loss_sum = step_loss_fp64(micro_losses, case.accum)
    fp32_sum = fp32_sequential_of_tensors(micro_losses) if pg.world == 1 else None
    if pg.world > 1 and evidence is not None:
        evidence.setdefault("rank_losses", {})[str(step + 1)] = gather_rank_losses(loss_sum, pg.world)
    if pg.world > 1:
        dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG if device.type == "cuda" else dist.ReduceOp.SUM)
        if device.type != "cuda":
            loss_sum /= pg.world  # gloo has no AVG
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    elapsed_s, peak = slowest_rank(seconds, peak, device, pg.world)
    step_ms = elapsed_s * 1e3
    return StepRecord(step=step + 1, loss=float(loss_sum.item()), step_ms=step_ms,
                      tokens_per_s=tokens_per_second(case.total_batch, step_ms), lr=lr,
                      peak_mem_mb=peak if device.type == "cuda" else None, loss_fp32_sum=fp32_sum)


@dataclass
class Trainee:
    """What `train_case` trains: the family's reference model (and its DDP wrapper on several ranks), the
    case's batches for this rank and the optimizer over the trained parameters."""

    case: CaseSpec
    device: torch.device
    model: torch.nn.Module
    ddp: torch.nn.Module | None
    batches: object
    optimizer: torch.optim.Optimizer
    zero: int

    @property
    def train_model(self) -> torch.nn.Module:
        return self.ddp or self.model

    def micro_batches(self, step: int):
        """The step's micro batches in the contract's order; DDP syncs gradients on the last one only."""
        case, ddp = self.case, self.ddp
        for micro in range(case.accum):
            x, y = self.batches.micro_batch(step, micro)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            last = micro == case.accum - 1
            yield MicroBatch(x, y, 0, micro, no_sync(ddp, case) if (ddp is not None and not last)
                             else contextlib.nullcontext())


def set_up_trainee(case: CaseSpec, checkpoint: str, tokens_path: str, device_kind: str, pg: ProcessGroupInfo,
                   lora_seed: int, phases: Phases, log: TextIO) -> Trainee:
    """Weights, data and optimizer of the case on this rank (each in its timed phase); rank 0 logs the header."""
    device = rank_device(device_kind, pg)
    with phases("weights"):
        ckpt = load_checkpoint(checkpoint)
        family = model_family(ckpt.family)
    with phases("data"):
        stream = read_token_stream(tokens_path, vocab_size=ckpt.config.vocab_size)
        case.check(max_seq_len=ckpt.config.max_seq_len, available_tokens=len(stream))
        batches = TokenBatches(stream.tokens, case, dp_rank=pg.rank)
    with phases("weights"):
        model, adapters = build_reference(ckpt, case, device, lora_seed)
        ddp = wrap_data_parallel(model, case, device) if pg.world > 1 else None
        zero = case.zero if pg.world > 1 else 0
        # LoRA: the optimizer sees only the adapters (InfiniTrain's GetLoRAParameters), frozen base.
        trained = adapters.parameters() if adapters is not None else (ddp or model).parameters()
        optimizer = build_sharded_optimizer(case.optimizer_of(family.optimizer), trained, case.lr, zero)
    if pg.reports:
        print(header_line(case, ckpt, family, device, lora_seed), file=log, flush=True)
    return Trainee(case, device, model, ddp, batches, optimizer, zero)


class InRunCapture:
    """Step 1 recorded from inside as it trains (runners/pytorch/capture.py): its gradients are read before the
    optimizer step, nothing else changes. Inactive (every call a no-op) without a capture request or after step 1."""

    def __init__(self, trainee: Trainee, capture: CaptureRequest | None, info: dict):
        self.trainee, self.capture, self.info = trainee, capture, info
        self.recorder: StepRecorder | None = None

    def begin(self, step: int) -> None:
        active = self.capture is not None and step == 0
        self.recorder = StepRecorder(self.trainee.model, self.trainee.case, self.capture) if active else None

    def close(self) -> None:
        if self.recorder:
            self.recorder.close()

    def losses_of(self, mb: MicroBatch) -> torch.Tensor:
        recorder, case = self.recorder, self.trainee.case
        if recorder:
            recorder.micro_batch(mb.dp_rank, mb.micro)
        return reference_step.token_losses(self.trainee.train_model, mb.x, mb.y, case.is_bf16,
                                           recorder.loss if recorder else None)

    def after_backward(self):
        """The contract step's hook before the optimizer, or None when nothing is recorded."""
        return self._record_step1 if self.recorder else None

    def _record_step1(self, micro_losses: list, first_x: torch.Tensor) -> None:
        # Step 1 is warm-up (not in tok/s): reading the gradients here costs no measured time.
        try:
            began = time.perf_counter()
            self.recorder.finish(float(step_loss_fp64(micro_losses, self.trainee.case.accum).item()), first_x)
            self.info["step1_capture"] = self.capture.path
            self.info["step1_capture_seconds"] = round(time.perf_counter() - began, 3)
        except Exception as e:  # a capture that fails costs the certificate, never the run
            self.info["step1_capture_error"] = f"{type(e).__name__}: {e}"


def train_step(trainee: Trainee, step: int, inside: InRunCapture) -> tuple[list, float, float]:
    """One step of the contract (runners/pytorch/step.py) at its lr: (micro losses, lr, seconds)."""
    lr = reference_step.set_lr(trainee.optimizer, lr_at(trainee.case, step + 1))
    inside.begin(step)
    try:
        with StepClock(trainee.device) as clock:
            micro_losses = reference_step.contract_step(trainee.micro_batches(step), inside.losses_of,
                                                        trainee.case.accum, trainee.optimizer,
                                                        inside.after_backward())
    finally:
        inside.close()
    return micro_losses, lr, clock.seconds


def train_case(case: CaseSpec, checkpoint: str, tokens_path: str, device_kind: str, pg: ProcessGroupInfo,
               emit: Callable[[StepRecord], None], log: TextIO, final_params_path: str | None = None,
               capture: CaptureRequest | None = None, checkpoints: CheckpointPlan | None = None,
               lora_seed: int = DEFAULT_LORA_SEED) -> dict:
    """Train `case.steps` steps; rank 0 calls `emit` per step and writes llm.c-style log lines.

    With `final_params_path`, rank 0 writes every parameter after the last step there, under
    its canonical LLMC name (DDP keeps the replicas equal, so rank 0's are the model's). With
    `capture` (one process only), step 1 is recorded from inside as it trains. With
    `checkpoints` (runners/pytorch/checkpoint.py), it first loads the resume's step folder and
    trains the steps after it, and saves a step folder after every save-interval step. A LoRA
    case trains its adapters only (A then B per layer, module order), from the init of `lora_seed`."""
    if capture is not None and pg.world > 1:
        raise ValueError("in-run capture is for one process; several ranks capture with capture_step")
    import_optimizer_machinery()  # before the device: see there why
    phases, info = Phases(), {}
    trainee = set_up_trainee(case, checkpoint, tokens_path, device_kind, pg, lora_seed, phases, log)
    if trainee.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(trainee.device)
    first_step = 0
    if checkpoints is not None and checkpoints.resume is not None:
        with phases("weights"):
            trainee.batches = resumed(checkpoints.resume, trainee.train_model, trainee.optimizer, trainee.batches, info)
        first_step = checkpoints.resume.step
    inside = InRunCapture(trainee, capture, info)
    records = []
    with fp32_matmul_precision(enabled_tf32=False), phases("training"):
        for step in range(first_step, case.steps):
            micro_losses, lr, seconds = train_step(trainee, step, inside)
            rec = step_record(case, step, micro_losses, lr, seconds, trainee.device, pg,
                              info if checkpoints is not None else None)
            if pg.reports:
                print(llmc_step_line(step + 1, case.steps, rec.loss, lr, rec.step_ms, rec.tokens_per_s),
                      file=log, flush=True)
                emit(rec)
            save_if_due(checkpoints, case, step + 1, trainee.train_model, trainee.optimizer, pg, info)
            records.append(rec)
    with phases("teardown"):
        if final_params_path and pg.reports:
            write_final_params(final_params_path, final_state(trainee.model))
    if pg.reports:
        print(perf_summary([r.step_ms for r in records], [r.tokens_per_s for r in records]), file=log, flush=True)
    return {**info, **phases.report(), **run_facts(trainee.device, pg, trainee.zero)}


def save_if_due(checkpoints: CheckpointPlan | None, case: CaseSpec, step: int, model, optimizer, pg, info: dict) -> None:
    """The training state after `step` saved where the case's checkpoint plan asks (rank 0 writes)."""
    if checkpoints is None or checkpoints.save is None or not checkpoints.save.due(step, case.steps):
        return
    began = time.perf_counter()
    saved_state.save_training_state(checkpoints.save, step, model, optimizer, is_writer=pg.rank == 0)
    info["checkpoint_save_s"] = round(info.get("checkpoint_save_s", 0.0) + time.perf_counter() - began, 3)


def perf_summary(times_ms: list[float], rates: list[float]) -> str:
    """The PERF summary line over the steps after warm-up."""
    measured = after_warmup(times_ms)
    return perf_summary_line(len(measured), sum(measured) / len(measured), sum(after_warmup(rates)) / len(measured))


def run_facts(device, pg, zero: int) -> dict:
    """What the record says of where and how the run trained."""
    return {"device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "world_size": pg.world, "torch_threads": torch.get_num_threads(),
            "data_parallel": {0: "DDP", 1: "DDP + ZeroRedundancyOptimizer (ZeRO-1)",
                              2: "FSDP2 fully_shard, reshard_after_forward=False (ZeRO-2)"}[zero] if pg.world > 1 else "none",
            **peak_memory_info(device, pg.world)}


def capture_case(case: CaseSpec, checkpoint: str, tokens_path: str, device_kind: str, request: CaptureRequest,
                 framework: str = "pytorch", prepare_model=None, float64: bool = False,
                 optimizer_for=build_optimizer, lora_seed: int = DEFAULT_LORA_SEED) -> StepCapture:
    """Step 1 of the case without an optimizer update, every DP rank's micro batches in this one
    process, recorded as `request` asks (diagnose, and certificates of runs of several ranks).
    `prepare_model` may swap kernels first (pytorch-fast: SDPA attention); `float64` runs it in
    FP64 (what exact arithmetic gives: the certificate's yardstick of FP32 rounding).

    A request that starts from a saved state (`request.start_state`, diagnose --at-step) builds the
    optimizer too (`optimizer_for(spec, params, lr)`: the runner's own), loads both from that
    torch.distributed.checkpoint folder as a resume does, and captures the step after it with its
    update. A request for the applied update at step 1 (`request.applied`) builds a fresh one."""
    ckpt = load_checkpoint(checkpoint)
    stream = read_token_stream(tokens_path, vocab_size=ckpt.config.vocab_size)
    case.check(max_seq_len=ckpt.config.max_seq_len, available_tokens=len(stream))
    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    family = model_family(ckpt.family)
    model, adapters = build_reference(ckpt, case, device, lora_seed)
    if prepare_model is not None:
        prepare_model(model)
    if float64:
        model = model.to(torch.float64)
    optimizer = None
    if request.records_applied:
        import_optimizer_machinery()
        trained = adapters.parameters() if adapters is not None else model.parameters()
        optimizer = optimizer_for(case.optimizer_of(family.optimizer), trained, case.lr)
    if request.start_state is not None:
        with one_process_meant():
            shift = saved_state.load_training_state(saved_state.ResumePlan(request.start_state, request.start_step),
                                                    model, optimizer)
        if shift:
            raise RunError(f"{request.start_state}: its data position is step {request.start_step + shift}, not "
                           f"{request.start_step}: not the state after step {request.start_step}")
    return capture_step(model, case, stream.tokens, request, device, framework=framework, optimizer=optimizer)


@contextlib.contextmanager
def one_process_meant():
    """DCP warns on every save and load without a process group that it assumes one process: in
    lockstep's own process (diagnose --at-step's state and captures) that is what is meant."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _start_process_group(device: str, pg: ProcessGroupInfo) -> None:
    if device == "cuda":
        torch.cuda.set_device(pg.local_rank)
    dist.init_process_group(backend="nccl" if device == "cuda" else "gloo")


class PersistentTraining:
    """The persistent worker's jobs (runners/workers.py): one case each, in this rank's process
    group, started once for the group."""

    def run(self, job: dict, writer) -> dict:
        case = CaseSpec.from_dict(job["case"])
        pg = ProcessGroupInfo.from_env()
        if pg.world != case.world_size:
            raise RunError(f"case {case.name} needs {case.world_size} ranks, this worker group has {pg.world}")
        return train_case(case, job["checkpoint"], job["tokens"], job["device"], pg, writer.step, sys.stdout,
                          final_params_path=job.get("final_params_path"),
                          checkpoints=CheckpointPlan.from_dict(job.get("checkpoints")),
                          lora_seed=job.get("lora_seed", DEFAULT_LORA_SEED))

    def release(self, all_ranks_ok: bool) -> None:
        pass  # train_case's model and optimizer are its locals: gone once it returns


def main(argv: list[str]) -> int:
    """torchrun entry point: `python -m lockstep.runners.pytorch.train JOB.json`, or
    `... --serve QUEUE_DIR` as a persistent worker."""
    from lockstep.runners.launch import ResultsWriter, end_with_parent
    from lockstep.runners.test_plugins import apply_test_plugins
    from lockstep.runners.workers import StartupTimeline, serve_arguments, serve_jobs

    end_with_parent()  # first: a killed lockstep or torchrun must not leave this rank training
    apply_test_plugins()
    pg = ProcessGroupInfo.from_env()
    serving = serve_arguments(argv)
    if serving is not None:
        queue_dir, device = serving
        startup = StartupTimeline()
        _start_process_group(device, pg)
        startup.mark("process group")
        return serve_jobs(queue_dir, PersistentTraining(), startup)
    job = json.loads(open(argv[0]).read())
    case = CaseSpec.from_dict(job["case"])
    _start_process_group(job["device"], pg)
    try:
        writer = ResultsWriter(job["results_path"] if pg.reports else None)
        info = train_case(case, job["checkpoint"], job["tokens"], job["device"], pg, writer.step, sys.stdout,
                          final_params_path=job.get("final_params_path"),
                          checkpoints=CheckpointPlan.from_dict(job.get("checkpoints")),
                          lora_seed=job.get("lora_seed", DEFAULT_LORA_SEED))
        writer.info(**info)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


def train_fp64(case: CaseSpec, checkpoint: str, tokens_path: str, device_kind: str,
               lora_seed: int = DEFAULT_LORA_SEED) -> list[StepRecord]:
    """The case trained in FP64 in this one process (every DP rank's micro batches in turn, each
    loss divided by accum·DP): what exact arithmetic gives, the yardstick the policy measures an
    FP32 run's drift against when Adam may be amplifying last-bit differences."""
    ckpt = load_checkpoint(checkpoint)
    family = model_family(ckpt.family)
    stream = read_token_stream(tokens_path, vocab_size=ckpt.config.vocab_size)
    case.check(max_seq_len=ckpt.config.max_seq_len, available_tokens=len(stream))
    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    model, adapters = build_reference(ckpt, case, device, lora_seed)
    model = model.to(dtype=torch.float64)
    trained = adapters.parameters() if adapters else model.parameters()
    optimizer = build_optimizer(case.optimizer_of(family.optimizer), trained, case.lr)
    batches = [TokenBatches(stream.tokens, case, dp_rank=r) for r in range(case.dp)]
    divisor = case.accum * case.dp

    def micro_batches(step: int):
        for dp_batches in batches:
            for micro in range(case.accum):
                x, y = dp_batches.micro_batch(step, micro)
                yield MicroBatch(x.to(device), y.to(device))

    steps = []
    for step in range(case.steps):
        lr = reference_step.set_lr(optimizer, lr_at(case, step + 1))
        micro_losses = reference_step.contract_step(
            micro_batches(step), lambda mb: reference_step.token_losses(model, mb.x, mb.y, bf16=False), divisor,
            optimizer)
        # Summed as Python floats (FP64), the evidence run's way since it was written.
        loss = 0.0
        for losses in micro_losses:
            loss += float(losses.mean().item()) / divisor
        steps.append(StepRecord(step=step + 1, loss=loss, lr=lr))
    return steps
