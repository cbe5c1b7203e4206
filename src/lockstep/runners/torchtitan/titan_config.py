"""The config module lockstep hands torchtitan (`--module lockstep.runners.torchtitan.titan_config
--config lockstep_case`): one `Trainer.Config` for the case in the job file named by
LOCKSTEP_TORCHTITAN_JOB, built from torchtitan's own components and four of lockstep's, each a
subclass of torchtitan's configurable base (its documented way to swap a component):

- `LockstepDataLoader`: the contract's ordered windows (data/loader.py), one micro batch per
  `next`, with RoPE positions 0..T-1 (the Trainer builds its causal flex mask from them);
- `LockstepTokenizer`: no tokenizer files (the tokens are already ids); only its vocab size;
- `LockstepLRSchedule`: the contract's lr of every step (cases/lr_schedule.py) as torchtitan's
  LambdaLR factor: torchtitan's own warm-up (linear from lr/W at the first step) is not Megatron's;
- `LockstepMetrics`: torchtitan's metrics processor, which also writes lockstep's step line and
  streams the step (loss, time, tokens/s, peak memory) to the parent.

The model spec is torchtitan's Llama 3 / Qwen3 model config at the checkpoint's shape (model.py)
with torchtitan's own `parallelize_fn` (FSDP2 always; TP where asked), and the LLMC weights
loaded after the optimizer is built (`post_optimizer_build_fn`, through torch.distributed's
`set_model_state_dict`, which places each tensor into whatever DTensor sharding the model has).

The rest as the contract asks: AdamW with weight decay 0 and the family's betas/eps, no gradient
clipping (max_norm inf: the clip factor clamps to exactly 1), no activation checkpointing, no
compile, no checkpoints, torchtitan's deterministic mode with a fixed seed, FP32 parameters; a
BF16 case uses torchtitan's mixed precision (FSDP2's MixedPrecisionPolicy, param_dtype bf16: the
whole forward and backward in bf16 with FP32 master weights and FP32 gradient reduction), which
is not the contract's autocast (only matmul inputs in bf16): docs/frameworks.md says what follows.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

import torch
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.optimizer import LRSchedulersContainer
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.config.configs import DebugConfig
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.trainer import Trainer

from lockstep.cases.lr_schedule import lr_at, lrs_of
from lockstep.cases.spec import CaseSpec
from lockstep.data.loader import TokenBatches
from lockstep.formats.logs import llmc_step_line
from lockstep.formats.run_record import StepRecord
from lockstep.formats.tokens import read_token_stream
from lockstep.runners.launch import ResultsWriter
from lockstep.runners.torchtitan.job import JOB_ENV, SEED, TorchtitanJob
from lockstep.runners.torchtitan.model import model_config, optimizer_config


@cache
def current_job() -> TorchtitanJob:
    """The job this process runs (the file LOCKSTEP_TORCHTITAN_JOB names)."""
    return TorchtitanJob.from_dict(json.loads(Path(os.environ[JOB_ENV]).read_text()))


@dataclass
class StepTimer:
    """When the current step began: the data loader marks it as the step asks for its first micro
    batch (the Trainer's first act after zeroing the gradients), the metrics processor reads it
    after the optimizer step and the loss's host copy (which synchronizes the device). One per
    process (`step_timer`), not a config field: torchtitan's CLI parser (tyro) rebuilds the config,
    and two components would hold two copies."""

    device: str = "cpu"
    started: float = 0.0

    def start(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.started = time.perf_counter()

    def seconds(self) -> float:
        if self.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - self.started


@cache
def step_timer() -> StepTimer:
    return StepTimer(current_job().device, time.perf_counter())


class LockstepTokenizer(BaseTokenizer):
    """The tokens are ids already (an llm.c token file): a vocabulary size and nothing to load."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 0

    def __init__(self, config: Config, tokenizer_path: str | None = None, **kwargs):
        super().__init__()
        self.vocab_size = config.vocab_size

    def encode(self, *args, **kwargs) -> list[int]:
        raise NotImplementedError("lockstep's torchtitan cases train on token ids; there is no text to encode")

    def decode(self, *args, **kwargs) -> str:
        raise NotImplementedError("lockstep's torchtitan cases train on token ids; there is no text to decode")

    def get_vocab_size(self) -> int:
        return self.vocab_size


class LockstepDataLoader(BaseDataLoader):
    """The contract's micro batches of this DP rank, step by step (data/loader.py's windows)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        pass

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, local_batch_size: int, seq_len: int,
                 **kwargs):
        job = current_job()
        case = job.case
        if dp_world_size != case.dp or local_batch_size != case.micro_batch or seq_len != case.seq_len:
            raise ValueError(f"torchtitan's batch layout (dp {dp_world_size}, B {local_batch_size}, T {seq_len}) "
                             f"is not the case's (dp {case.dp}, B {case.micro_batch}, T {case.seq_len})")
        stream = read_token_stream(job.tokens, vocab_size=job.model.vocab_size)
        self.case, self.timer = case, step_timer()
        self.batches = TokenBatches(stream.tokens, case, dp_rank=dp_rank)

    def __iter__(self):
        case = self.case
        positions = torch.arange(case.seq_len, dtype=torch.long).expand(case.micro_batch, case.seq_len)
        for step in range(case.steps):
            for micro in range(case.accum):
                if micro == 0:
                    self.timer.start()
                x, y = self.batches.micro_batch(step, micro)
                yield {"input": x, "positions": positions.clone()}, y

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass


class LockstepLRSchedule(LRSchedulersContainer):
    """The contract's lr of every step as torchtitan's LambdaLR factor of the optimizer's lr."""

    @dataclass(kw_only=True, slots=True)
    class Config(LRSchedulersContainer.Config):
        warmup_steps: int = 0

        def build(self, *, optimizers, training_steps):
            case = current_job().case
            lrs = lrs_of(case)
            # LambdaLR asks for step s (0-based, s = steps taken) once more after the last step.
            return LRSchedulersContainer(optimizers, lambda s: lrs[min(s, len(lrs) - 1)] / case.lr)


class LockstepMetrics(MetricsProcessor):
    """torchtitan's metrics (its own log line, MFU, memory) plus lockstep's step line and record."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        pass

    def __init__(self, config: Config, **kwargs):
        super().__init__(config, **kwargs)
        job = current_job()
        self.case, self.timer = job.case, step_timer()
        reports = torch.distributed.get_rank() == 0 if torch.distributed.is_initialized() else True
        self.writer = ResultsWriter(job.results_path if reports else None)
        self.reports, self.mfu = reports, []
        self.on_cuda, self.peaks = job.device == "cuda", [0.0, 0.0]

    def log(self, step: int, global_avg_loss: float, global_max_loss: float, grad_norm: float,
            extra_metrics: dict | None = None):
        seconds = self.timer.seconds()
        peak = None
        if self.on_cuda:  # before torchtitan's log resets the peaks (it does after every logged step)
            peak = torch.cuda.max_memory_allocated() / 2**20
            self.peaks = [max(self.peaks[0], peak), max(self.peaks[1], torch.cuda.max_memory_reserved() / 2**20)]
        tokens_per_s = self.case.total_batch / seconds
        if self.gpu_peak_flops > 0 and self.num_flops_per_token > 0:  # torchtitan's own MFU, per device
            self.mfu.append(self.num_flops_per_token * tokens_per_s / self.case.world_size / self.gpu_peak_flops)
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics)
        lr = lr_at(self.case, step)
        if self.reports:
            print(llmc_step_line(step, self.case.steps, global_avg_loss, lr, seconds * 1e3, tokens_per_s), flush=True)
            self.writer.step(StepRecord(step=step, loss=global_avg_loss, step_ms=seconds * 1e3,
                                        tokens_per_s=tokens_per_s, lr=lr, peak_mem_mb=peak))
        if step == self.case.steps:  # the optimizer has made the last update
            self.finish()

    def finish(self) -> None:
        """After the last step: the final parameters (if asked; every rank takes part in the
        gather) and what the record keeps of the run."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from lockstep.runners.base import write_final_params
        from lockstep.runners.torchtitan.weights import canonical

        job = current_job()
        if job.final_params_path:
            full = get_model_state_dict(self.model_parts[0], options=StateDictOptions(full_state_dict=True,
                                                                                      cpu_offload=True))
            if self.reports:
                write_final_params(job.final_params_path, canonical(full, job.model))
        memory = self.peak_memory()
        if self.reports:
            self.writer.info(world_size=self.case.world_size, device_name=self.device_memory_monitor.device_name,
                             torch_threads=torch.get_num_threads(), **memory,
                             torchtitan_mfu=(sum(self.mfu[1:] or self.mfu) / len(self.mfu[1:] or self.mfu)
                                             if self.mfu else None),
                             torchtitan_peak_flops=self.gpu_peak_flops)


    def peak_memory(self) -> dict:
        """{"peak_memory_mb": {"allocated", "reserved"}}, max over steps and ranks (as
        runners/memory.py says it); {} off CUDA, where torch counts nothing."""
        if not self.on_cuda:
            return {}
        peaks = torch.tensor(self.peaks, dtype=torch.float64, device="cuda")
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(peaks, op=torch.distributed.ReduceOp.MAX)
        return {"peak_memory_mb": {"allocated": float(peaks[0]), "reserved": float(peaks[1])}}


def load_llmc_weights(optimizers, model_parts, parallel_dims, *, job: TorchtitanJob) -> None:
    """The case's LLMC weights into the (possibly sharded) model, under torchtitan's names."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from lockstep.runners.torchtitan.weights import torchtitan_state

    state = torchtitan_state(job)
    (model,) = model_parts
    result = set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))
    missing = [k for k in result.missing_keys if not k.endswith(("freqs_cis", "cache"))]
    if missing or result.unexpected_keys:
        raise ValueError(f"the LLMC weights do not fill torchtitan's model: missing {missing}, "
                         f"unexpected {list(result.unexpected_keys)}")
    if job.device == "cpu":
        sum_reductions_on_gloo(model)


def sum_reductions_on_gloo(model) -> None:
    """FSDP2 averages gradients with a pre-multiplied sum (ReduceOp.PREMUL_SUM), which gloo does
    not have: on the CPU every FSDP module reduces with SUM and divides afterwards (its own
    alternative, `set_force_sum_reduction_for_comms`). The same mean, rounded in another order."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


def model_spec(job: TorchtitanJob) -> ModelSpec:
    if job.model.family == "llama3":
        from torchtitan.models.llama3.parallelize import parallelize_llama as parallelize
    else:
        from torchtitan.models.qwen3.parallelize import parallelize_qwen3 as parallelize
    return ModelSpec(name=f"lockstep_{job.model.family}", flavor=job.model_name or "case",
                     model=model_config(job.model.family, job.model, job.device), parallelize_fn=parallelize, pipelining_fn=None,
                     post_optimizer_build_fn=partial(load_llmc_weights, job=job), state_dict_adapter=None)


def training_config(case: CaseSpec) -> TrainingConfig:
    return TrainingConfig(local_batch_size=case.micro_batch, global_batch_size=case.micro_batch * case.accum * case.dp,
                          seq_len=case.seq_len, steps=case.steps, max_norm=float("inf"), dtype="float32",
                          mixed_precision_param="bfloat16" if case.is_bf16 else "float32",
                          disable_cuda_graphs=True, gc_freq=max(case.steps, 1) + 1)


def parallelism_config(case: CaseSpec) -> ParallelismConfig:
    """ZeRO cases shard over DP (FSDP2), plain DP replicates (torchtitan's DDP is FSDP2 replicated)."""
    shard, replicate = (case.dp, 1) if case.zero else (1, case.dp)
    return ParallelismConfig(data_parallel_shard_degree=shard, data_parallel_replicate_degree=replicate,
                             tensor_parallel_degree=case.tp, enable_sequence_parallel=case.sp,
                             spmd_backend="partial_dtensor")


def activation_checkpoint(case: CaseSpec):
    """The case's activation recompute as torchtitan's own policy, which wraps every transformer
    block: full granularity recomputes whole blocks (FullAC), selective its per-op choice
    (SelectiveAC). Megatron's and InfiniTrain's method and layer count have no torchtitan
    counterpart; the math is the same either way (recompute must not change a bit)."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    if not case.activation_recompute or case.recompute_granularity == "none":
        return None
    return FullAC.Config() if case.recompute_granularity == "full" else SelectiveAC.Config()


def lockstep_case() -> Trainer.Config:
    """The Trainer config of the job's case (torchtitan's `--config` names this function)."""
    job = current_job()
    case = job.case
    return Trainer.Config(
        model_spec=model_spec(job), hf_assets_path="", dump_folder=job.dump_folder,
        tokenizer=LockstepTokenizer.Config(vocab_size=job.model.vocab_size),
        dataloader=LockstepDataLoader.Config(),
        optimizer=optimizer_config(job.optimizer, case.lr),
        lr_scheduler=LockstepLRSchedule.Config(),
        loss=CrossEntropyLoss.Config(),
        training=training_config(case), parallelism=parallelism_config(case),
        checkpoint=CheckpointManager.Config(enable=False),
        activation_checkpoint=activation_checkpoint(case),
        compile=CompileConfig(enable=False),
        metrics=LockstepMetrics.Config(log_freq=1, disable_color_printing=True),
        debug=DebugConfig(seed=SEED, deterministic=True, enable_structured_logging=False),
    )
