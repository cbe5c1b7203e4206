"""The megatron worker, one per rank under torchrun: `python -m lockstep.runners.megatron.worker JOB.json`.

Its console output is the case's native log (`<out>/megatron/<case>.log`): a marker line
(`lockstep megatron runner`, so log parsers never apply Megatron-LM's step-2 running-mean
correction to it), the config (`seq_length=T`, ...), then per step Megatron-LM's iteration line
with the TRUE loss of that step and a `PERF step` line, and a `PERF summary` line at the end.
Rank 0 also streams each step to the parent through launch.ResultsWriter.

One optimizer step, as the contract times it (docs/reference/training-contract.md#timing): synchronize,
start; zero the gradient buffers;
megatron-core's forward-backward schedule over `accum` micro batches (no pipelining, or 1F1B /
interleaved 1F1B with PP > 1), reading each micro batch from GPTDataset inside the schedule;
DDP's gradient all-reduce (in `finalize_model_grads`); the optimizer step; synchronize, stop.
The step time is the slowest rank's.

The loss of a micro batch is the mean token cross entropy (Megatron-LM's `loss_func` shape:
summed loss and token count, which the schedule divides by the count and by `accum`), computed
by megatron's vocab-parallel cross entropy on FP32 logits whose padded vocab entries (TP > 1)
are -inf. The logged loss is the mean of the micro batches' means over micro steps and DP
ranks, taken in FP64 (as the reference trainer logs it).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lockstep.errors import LockstepError
from lockstep.formats.logs import megatron_iteration_line, perf_step_line, perf_summary_line
from lockstep.formats.run_record import StepRecord
from lockstep.formats.tokens import read_token_stream
from lockstep.runners.base import write_final_params
from lockstep.runners.launch import ResultsWriter
from lockstep.runners.memory import peak_memory_info
from lockstep.runners.megatron.job import DATA_SEED, LOG_MARKER, MODEL_SEED, MegatronJob
from lockstep.runners.megatron.capture import StepRecorder, logged_micro_loss
from lockstep.runners.megatron.parallel import ParallelLayout
from lockstep.runners.nodes import reports_results
from lockstep.runners.workers import end_multiprocessing_children
from lockstep.step_contract import (Phases, StepClock, after_warmup, fp32_sequential_of_tensors, slowest_rank,
                                    tokens_per_second)


def _say(layout: ParallelLayout, text: str) -> None:
    if layout.reports:
        print(text, flush=True)


def _set_ieee_fp32() -> None:
    """FP32 cases compare IEEE matmuls: TF32 off everywhere (and for the FP32 parts of BF16 cases)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def _megatron_version() -> str:
    import megatron.core

    return getattr(megatron.core, "__version__", "unknown")


class StepData:
    """The micro batches of one step for one model chunk, read when the schedule asks for them."""

    def __init__(self, batches, step: int, accum: int):
        self.batches, self.step, self.micro, self.accum = batches, step, 0, accum

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self.micro >= self.accum:
            raise StopIteration
        batch = self.batches.micro_batch(self.step, self.micro)
        self.micro += 1
        return batch


def padded_vocab_mask(vocab_rows: int, true_vocab: int, layout: ParallelLayout) -> torch.Tensor | None:
    """True for this TP rank's logits past the true vocabulary V (only with TP > 1), else None."""
    local = vocab_rows // layout.tp
    first = layout.tp_rank * local
    if first + local <= true_vocab:
        return None
    return (torch.arange(first, first + local, device=layout.device) >= true_vocab)


def loss_func(labels: torch.Tensor, loss_mask: torch.Tensor, vocab_mask: torch.Tensor | None, fused: bool,
              logits: torch.Tensor):
    """Megatron-LM's GPT loss contract: (summed loss, token count, values to report). `fused`:
    megatron-core's native fused cross entropy (megatron-fast's BF16 cases, fast.py)."""
    from lockstep.runners.megatron.fast import vocab_parallel_cross_entropy

    logits = logits.float()  # [b, s, v / TP]; under bf16 autocast the output layer gives bf16
    if vocab_mask is not None:
        logits = logits.masked_fill(vocab_mask, float("-inf"))  # only the first V logits count
    per_token = vocab_parallel_cross_entropy(logits, labels, fused)  # [b, s], FP32
    mask = loss_mask.float()
    loss_sum = torch.sum(per_token * mask)
    num_tokens = mask.sum().detach().to(torch.int)
    # The logged FP64 mean is lockstep's bookkeeping, not training: the schedule only stores these
    # references, and the worker takes the mean after the step's clock has stopped.
    return loss_sum, num_tokens, {"lm loss tokens": (per_token.detach(), loss_mask)}


def optimizer_step(optimizer) -> tuple[bool, float | None]:
    """megatron-core's `optimizer.step()` less the gradient norm that nothing here uses.

    `ChainedOptimizer.step()` computes the global gradient norm on every step, even with
    clip_grad 0: a multi-tensor L2 norm, an all-reduce and a `.item()` that stalls the host
    until the device drains. The norm only feeds clipping (off in the contract: clip_grad 0) and
    the log. With clip_grad 0, log_num_zeros_in_grad off and no grad_norm_skip_threshold (0.19's
    skip-the-update-when-the-norm-is-large, infinite by default), `step()` is exactly
    `prepare_grads()` (the found-inf check of a loss scaler) then `step_with_ready_grads()`, so
    calling those two runs the same optimizer math on the same gradients (read in megatron-core
    0.16.1 and 0.19.2). Otherwise, or on a megatron-core without those methods, the plain
    `step()` runs. Returns (updated, grad norm)."""
    configs = [getattr(o, "config", None) for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    plain = (not hasattr(optimizer, "prepare_grads") or not hasattr(optimizer, "step_with_ready_grads")
             or any(c is None or c.clip_grad > 0.0 or c.log_num_zeros_in_grad
                    or math.isfinite(getattr(c, "grad_norm_skip_threshold", math.inf)) for c in configs))
    if plain:
        updated, grad_norm, _zeros = optimizer.step()
        return updated, grad_norm
    if optimizer.prepare_grads():
        return False, None
    return optimizer.step_with_ready_grads(), None


def make_forward_step(attention_mask: torch.Tensor, vocab_mask: torch.Tensor | None, fused_loss: bool = False):
    from megatron.core.utils import get_attr_wrapped_model

    def forward_step(data_iterator, model):
        pre = get_attr_wrapped_model(model, "pre_process")
        post = get_attr_wrapped_model(model, "post_process")
        # Middle chunks read nothing: their input arrives from the previous stage.
        batch = next(data_iterator) if (pre or post) else {}
        # Every chunk gets the causal mask: without one megatron builds its default mask on CUDA.
        output = model(batch.get("tokens"), batch.get("position_ids"), attention_mask)
        return output, partial(loss_func, batch.get("labels"), batch.get("loss_mask"), vocab_mask, fused_loss)

    return forward_step


@dataclass
class Training:
    """One case on this rank: what `start` and `load_weights` build and every step works on."""

    job: MegatronJob
    phases: Phases
    family: Any
    adapter: Any
    precision: Any
    version: str
    layout: ParallelLayout
    shims: list
    vocab_rows: int
    fast: Any  # fast.FastPaths: what megatron-fast turns on (nothing for `megatron`)
    config: Any = None  # megatron's TransformerConfig
    chunks: list = field(default_factory=list)
    shards: list = field(default_factory=list)
    optimizer: Any = None
    scheduler: Any = None
    info: dict = field(default_factory=dict)  # what the run adds to the record's meta

    @property
    def case(self):
        return self.job.case

    @property
    def on_cpu(self) -> bool:
        return self.job.device != "cuda"

    @property
    def global_batch(self) -> int:
        return self.case.total_batch // self.case.seq_len  # sequences per step


@dataclass
class Data:
    """The case's token windows as the schedule reads them, and the schedule itself."""

    batches: Any  # dataset.MicroBatches, or checkpoint_plan.ShiftedBatches after a resume
    forward_step: Any
    forward_backward: Any
    indexed: Any


@dataclass
class StepOutcome:
    results: list  # the schedule's per-micro-batch loss values
    seconds: float  # this rank's step time
    grad_norm: float | None
    lr: float  # the lr the step trained at (read before the scheduler sets the next step's)


@dataclass
class StepLog:
    """The step times and rates so far (the PERF summary's, after warm-up)."""

    times_ms: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)


def train(job: MegatronJob, writer: ResultsWriter) -> dict:
    """One case: load, data, resume, then per step train, record and save (see the module docstring)."""
    from lockstep.runners.megatron.fast import compile_stance

    run = start(job)
    with compile_stance(run.fast):
        return train_run(run, writer)


def train_run(run: Training, writer: ResultsWriter) -> dict:
    job = run.job
    load_weights(run)
    if job.write_state is not None:  # a step folder from canonical state, no training (checkpoint.write_state)
        return write_state_only(run)
    run.phases.lap("weights")
    data = load_data(run)
    first_step = resume(run, data)
    capture, saver, log = CaptureRecorder(run, first_step), CheckpointSaver(run), StepLog()
    if run.layout.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(run.layout.device)
    for step in range(first_step, run.case.steps):
        outcome = train_step(run, data, step, capture)
        record_step(run, step + 1, outcome, writer, log)
        saver.after_step(step + 1)
    run.phases.lap("training")
    return finish(run, data, log)


def start(job: MegatronJob) -> Training:
    """The log's marker line, the parallel state, the CPU shims and the config line."""
    from megatron.core import tensor_parallel

    from lockstep.models import family as model_family
    from lockstep.runners.megatron import model as mmodel
    from lockstep.runners.megatron.cpu_shims import apply_cpu_shims
    from lockstep.runners.megatron import fast as mfast
    from lockstep.runners.megatron.families import adapter_for
    from lockstep.runners.megatron.parallel import init_parallel

    phases = Phases()
    case, on_cpu = job.case, job.device != "cuda"
    adapter = adapter_for(job.model)
    if job.options.layer_spec == "te":  # megatron-te: TE's layer spec and its parameter names
        from lockstep.runners.megatron.te_spec import TESpecAdapter

        adapter = TESpecAdapter(adapter)
    fast = mfast.paths(job.options, case, adapter, job.model, job.device, capturing=job.capture is not None)
    precision = mmodel.Precision.for_case(case, job.options.native_bf16)
    version = _megatron_version()
    if reports_results():
        # First thing in the log, before megatron or NCCL print anything: the parsers look for it near the top.
        print(f"{LOG_MARKER} | megatron-core {version} | torch {torch.__version__} | case {case.name} | "
              f"{case.parallel_label} | {precision.label} | device {job.device} "
              f"({'gloo' if on_cpu else 'nccl'}, {case.world_size} process(es))", flush=True)
    _set_ieee_fp32()
    layout = init_parallel(case, job.device)
    shims = apply_cpu_shims() if on_cpu else []
    if not on_cpu:
        # CUDA graphs need an RNG tracker whose states a graph can capture (megatron's CudaGraphManager checks).
        graphable = dict(use_cudagraphable_rng=True, force_reset_rng=True) if fast.cuda_graphs else {}
        tensor_parallel.model_parallel_cuda_manual_seed(MODEL_SEED, **graphable)
    run = Training(job=job, phases=phases, family=model_family(job.model.family), adapter=adapter,
                   precision=precision, version=version, layout=layout, shims=shims,
                   vocab_rows=adapter.vocab_rows(job.model, case.tp), fast=fast)
    _say(layout, config_line(run))
    if fast.any or job.options.fusions or job.options.core_attention != "local" or job.options.cuda_graphs:
        run.info["megatron_fast"] = fast.to_dict()
        _say(layout, f"megatron-fast: {fast.label()}" + "".join(f"; {n}" for n in fast.notes))
    if shims:
        _say(layout, "cpu shims (no CUDA): " + "; ".join(shims))
    phases.lap("start-up")  # the parallel state, megatron's config
    return run


def config_line(run: Training) -> str:
    """The log's `config:` line, in Megatron-LM's argument names."""
    from lockstep.runners.megatron import model as mmodel

    job, case, adapter = run.job, run.case, run.adapter
    T, B = case.seq_len, case.micro_batch
    p2p = mmodel.pipeline_p2p(case)
    return (f"config: family={run.family.name} num_layers={job.model.num_layers} hidden_size={job.model.channels} "
            f"num_attention_heads={job.model.num_heads} num_query_groups={job.model.num_kv_heads} "
            f"ffn_hidden_size={adapter.ffn_hidden(job.model)} seq_length={T} "
            f"max_position_embeddings={job.model.max_seq_len} micro_batch_size={B} "
            f"global_batch_size={run.global_batch} "
            f"num_microbatches={case.accum} data_parallel_size={case.dp} tensor_model_parallel_size={case.tp} "
            f"pipeline_model_parallel_size={case.pp} virtual_pipeline_model_parallel_size={case.vpp} "
            + (f"num_moe_experts={job.model.num_experts} moe_router_topk={job.model.router_topk} "
               f"expert_model_parallel_size={case.ep} " if adapter.moe else "")
            + (f"pipeline_model_parallel_layout={case.pp_layout} " if case.pp_layout else "") +
            f"batch_p2p_comm={p2p.batch} overlap_p2p_comm={p2p.overlap} " +
            f"sequence_parallel={case.sp} vocab_size={job.model.vocab_size} padded_vocab_size={run.vocab_rows} "
            f"optimizer={run.family.optimizer.kind} lr={case.lr:.6E} weight_decay=0.0 clip_grad=0.0 "
            f"train_iters={case.steps}")


def load_weights(run: Training) -> None:
    """The model chunks of this rank, each mapping its own shard straight from the memory-mapped
    LLMC file, wrapped for training, and their optimizer."""
    from lockstep.models import load_checkpoint
    from lockstep.runners.megatron import fast as mfast
    from lockstep.runners.megatron import model as mmodel

    job, case = run.job, run.case
    ckpt = load_checkpoint(job.checkpoint)
    canonical = _canonical_tensors(job, ckpt)
    # Never let GPTDataset wrap into a second epoch: the contract reads each token window once.
    case.check(max_seq_len=job.model.max_seq_len,
               available_tokens=len(read_token_stream(job.tokens, check_ids=False)))
    run.config = mmodel.transformer_config(case, job.model, run.adapter, run.precision, run.on_cpu,
                                           overrides=mfast.config_overrides(run.fast, run.adapter, job.model))
    chunks = mmodel.build_model_chunks(run.config, job.model, run.adapter, run.layout, run.vocab_rows,
                                       layer_spec=mfast.layer_spec(run.adapter.layer_spec(job.model), run.fast))
    loaded, adapted = _load_chunks(run, chunks, canonical, ckpt.config)
    _check_header(run, ckpt)
    run.chunks = mmodel.wrap_for_training(run.config, chunks, run.precision, zero=case.zero)
    run.optimizer, run.scheduler = build_optimizer(run)
    _say(run.layout, f"loaded {job.checkpoint} (LLMC v{ckpt.version}) into {len(run.chunks)} model chunk(s) "
                     f"per rank ({loaded:,} values on rank 0)")
    if case.lora is not None:
        _say(run.layout, f"lora: {case.lora.label}, scale {case.lora.scale:g}, init seed {job.lora_seed}; "
                         f"{adapted} linear(s) adapted on this rank, every other parameter frozen; the optimizer "
                         "trains the adapters only")


def _canonical_tensors(job: MegatronJob, ckpt) -> dict:
    """The checkpoint's tensors under canonical names, plus the case's one LoRA init (the tensors
    every framework loads), mapped like any weight."""
    from lockstep.models.family import split_canonical

    canonical = split_canonical(ckpt.tensors, ckpt.config)
    if job.case.lora is not None:
        from lockstep.models.lora import lora_init_tensors

        canonical |= lora_init_tensors(ckpt.family, ckpt.config, job.case.lora, job.lora_seed)
    return canonical


def _load_chunks(run: Training, chunks: list, canonical: dict, config) -> tuple[int, int]:
    """Each chunk on its device, LoRA-adapted when the case asks, its shard loaded; (values loaded,
    linears adapted). Fills `run.shards`."""
    from lockstep.runners.megatron import model as mmodel
    from lockstep.runners.megatron import weights as mweights

    layout, case = run.layout, run.case
    loaded = adapted = 0
    for chunk in chunks:
        if not run.on_cpu:
            # As Megatron-LM's get_model: modules megatron does not place itself (torch's LayerNorm
            # in the local spec) are created on the CPU, so the whole chunk moves to this GPU.
            chunk.cuda(layout.device)
        shard = mweights.ChunkShard(rank=layout.rank, tp_rank=layout.tp_rank, tp_size=layout.tp,
                                    pre_process=chunk.pre_process, post_process=chunk.post_process,
                                    layers=mmodel.chunk_layers(chunk), vocab_rows=run.vocab_rows,
                                    ep_rank=layout.ep_rank, ep_size=layout.ep, lora=case.lora)
        run.shards.append(shard)
        if case.lora is not None:
            from lockstep.runners.megatron import lora as mlora

            adapted += mlora.apply_lora(chunk, run.adapter, run.job.model, case.lora, layout.tp)
        loaded += mweights.load_chunk(chunk, mweights.chunk_tensors(canonical, config, shard, run.adapter),
                                      layout.rank)
    return loaded, adapted


def _check_header(run: Training, ckpt) -> None:
    """What no tensor shape reveals (the head count; V when TP>1 loads Vp rows) must agree too."""
    model = run.job.model
    differing = [f"{k} {v} (planned {getattr(model, k)})" for k, v in vars(ckpt.config).items()
                 if getattr(model, k) != v] if ckpt.family == model.family else [f"family {ckpt.family}"]
    if differing:
        raise LockstepError(f"rank {run.layout.rank}: the checkpoint header disagrees with the planned model: "
                            + ", ".join(differing))


def build_optimizer(run: Training) -> tuple:
    """The case's optimizer and its lr scheduler over the wrapped chunks, wired into megatron's
    config as Megatron-LM's training loop wires them (the schedule calls these)."""
    from megatron.core.distributed import finalize_model_grads

    from lockstep.runners.megatron import model as mmodel

    optimizer, scheduler = mmodel.build_optimizer(run.case, run.chunks, run.precision,
                                                  run.case.optimizer_of(run.family.optimizer))
    chunks, config = run.chunks, run.config
    config.no_sync_func = [c.no_sync for c in chunks] if len(chunks) > 1 else chunks[0].no_sync
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    return optimizer, scheduler


def write_state_only(run: Training) -> dict:
    """A step folder written from the canonical weights (and Adam state), no training."""
    from lockstep.runners.megatron import checkpoint as mcheckpoint

    job = run.job
    written = mcheckpoint.write_state(job.write_state, run.chunks, run.shards, run.optimizer, run.scheduler,
                                      run.layout, run.case, job.model, run.adapter)
    _say(run.layout, f"wrote {written['checkpoint_written']} (megatron-core dist_checkpointing, step "
                     f"{job.write_state['step']}) from canonical weights" + (" and Adam state" if job.write_state.get(
                         "moments") else ""))
    run.phases.lap("weights")
    return {**written, **run.phases.report(), "framework_version": f"megatron-core {run.version}",
            "megatron_core_version": run.version, "world_size": run.layout.world}


def load_data(run: Training) -> Data:
    """GPTDataset over the case's tokens, read as micro batches by the schedule's forward step.

    The converted stream and GPTDataset's index cache are built by one rank at a time where they
    may share a directory: global rank 0 first, then local rank 0 of every other node (whose cache
    may be another disk, or the same shared one, then found complete), then all the others."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from lockstep.runners.megatron import dataset as mdata

    job, case, layout = run.job, run.case, run.layout
    num_samples = mdata.samples_needed(case)
    dataset = indexed = None
    my_turn = 0 if layout.rank == 0 else (1 if layout.local_rank == 0 else 2)
    for turn in range(3):
        if turn == my_turn:
            indexed = mdata.ensure_indexed_dataset(job.tokens, job.tokens_sha256)
            dataset = mdata.build_gpt_dataset(indexed, case.seq_len, num_samples, job.model.vocab_size,
                                              seed=DATA_SEED)
        dist.barrier()
    _say(layout, f"data: megatron indexed dataset {indexed.prefix} ({indexed.num_tokens:,} tokens, one document), "
                 f"GPTDataset with the identity shuffle ({num_samples} samples of {case.seq_len}+1 tokens)")
    batches = mdata.MicroBatches(dataset, case, layout.dp_rank, layout.device)
    forward_step = make_forward_step(batches.attention_mask,
                                     padded_vocab_mask(run.vocab_rows, job.model.vocab_size, layout),
                                     fused_loss=run.fast.cross_entropy_fusion)
    run.phases.lap("data")
    return Data(batches=batches, forward_step=forward_step, forward_backward=get_forward_backward_func(),
                indexed=indexed)


def resume(run: Training, data: Data) -> int:
    """The training state of the case's resume folder, when it has one; the step training starts after."""
    from lockstep.runners.checkpoint_plan import ShiftedBatches
    from lockstep.runners.megatron import checkpoint as mcheckpoint

    checkpoints = run.job.checkpoints
    if checkpoints is None or checkpoints.resume is None:
        return 0
    began = time.perf_counter()
    shift = mcheckpoint.load_training_state(checkpoints.resume, run.chunks, run.optimizer, run.scheduler,
                                            run.layout, run.case.zero)
    run.info["checkpoint_load_s"] = round(time.perf_counter() - began, 3)
    first_step = checkpoints.resume.step
    if shift:
        data.batches = ShiftedBatches(data.batches, shift)
    _say(run.layout, f"resumed from {checkpoints.resume.directory} (megatron-core dist_checkpointing, step "
                     f"{first_step}): training steps {first_step + 1}..{run.case.steps}")
    run.phases.lap("weights")
    return first_step


class CaptureRecorder:
    """The capture of the run's first step (step 1, or the one after a resume: diagnose --at-step).
    That step is warm-up (not in tok/s), so recording it from inside costs no measured time.

    The update the optimizer applies in it is recorded too, as the weights before and after it: not
    under native bf16, whose module weights are BF16 copies of the optimizer's FP32 ones."""

    def __init__(self, run: Training, first_step: int):
        self.run, self.first_step, self.request = run, first_step, run.job.capture
        self.applied = (self.request is not None and self.request.records_applied
                        and not run.precision.native_bf16)
        self.recorder: StepRecorder | None = None

    def begin(self, step: int) -> None:
        """Before the step's forward-backward (every rank): the hooks, on the first step only."""
        run = self.run
        self.recorder = (StepRecorder(request=self.request, layout=run.layout, chunks=run.chunks, case=run.case,
                                      model=run.job.model, adapter=run.adapter, vocab_rows=run.vocab_rows,
                                      framework=run.job.framework)
                         if self.request and step == self.first_step else None)

    def after_backward(self, results: list) -> None:
        """The gradients after finalize_model_grads, before the update (a collective)."""
        if self.recorder is None:
            return
        began = time.perf_counter()
        self.recorder.finish(results, write=not self.applied)
        if self.applied:
            self.recorder.keep_weights()
        self.run.info["step1_capture"] = self.request.path
        self.run.info["step1_capture_seconds"] = round(time.perf_counter() - began, 3)

    def after_update(self, step: int, lr: float) -> None:
        if self.recorder is None or not self.applied:
            return
        began = time.perf_counter()
        self.recorder.finish_applied(lr, step + 1)
        self.run.info["step1_capture_seconds"] += round(time.perf_counter() - began, 3)


class CheckpointSaver:
    """The training state saved at the steps the case's checkpoint plan asks for (a collective)."""

    def __init__(self, run: Training):
        self.run = run
        self.plan = run.job.checkpoints.save if run.job.checkpoints is not None else None

    def after_step(self, step: int) -> None:
        run = self.run
        if self.plan is None or not self.plan.due(step, run.case.steps):
            return
        from lockstep.runners.megatron import checkpoint as mcheckpoint

        began = time.perf_counter()
        mcheckpoint.save_training_state(self.plan, step, run.chunks, run.optimizer, run.scheduler, run.layout,
                                        run.case.zero, consumed_samples=step * run.global_batch,
                                        on_dead_writer=partial(_end_rank, run.job))
        run.info["checkpoint_save_s"] = round(run.info.get("checkpoint_save_s", 0.0) + time.perf_counter() - began, 3)


def train_step(run: Training, data: Data, step: int, capture: CaptureRecorder) -> StepOutcome:
    """One optimizer step as the contract times it (see the module docstring)."""
    case, chunks = run.case, run.chunks
    dist.barrier()  # every rank starts the step together, so the slowest rank's time is the step's
    with StepClock(run.layout.device) as clock:
        for chunk in chunks:
            chunk.zero_grad_buffer()
        run.optimizer.zero_grad()
        capture.begin(step)
        iterators = [StepData(data.batches, step, case.accum) for _ in chunks]
        results = data.forward_backward(
            forward_step_func=data.forward_step,
            data_iterator=iterators if len(chunks) > 1 else iterators[0],
            model=chunks,
            num_microbatches=case.accum,
            seq_length=case.seq_len,
            micro_batch_size=case.micro_batch,
            decoder_seq_length=case.seq_len,
            forward_only=False,
        )
        capture.after_backward(results)
        lr = float(run.optimizer.param_groups[0]["lr"])  # this step's; the scheduler then sets the next
        _update_ok, grad_norm = optimizer_step(run.optimizer)
        capture.after_update(step, lr)
        run.scheduler.step(increment=1)
    return StepOutcome(results=results, seconds=clock.seconds, grad_norm=grad_norm, lr=lr)


def step_loss(run: Training, results: list) -> tuple[float, float, float]:
    """(the step's loss, InfiniTrain's FP32 sequential sum of it, this rank's own mean), a collective.

    The step's loss lives on the last stage's TP rank 0 of every DP replica: sum loss/DP there.
    Beside it (one replica only) what InfiniTrain's FP32 sequential sum of the same token losses logs."""
    layout = run.layout
    own, contribution, fp32_sum = 0.0, 0.0, 0.0
    if layout.reports_loss:
        micro_means = [logged_micro_loss(r) for r in results]
        own = sum(micro_means) / len(micro_means)
        contribution = own / layout.dp
        if layout.dp == 1:
            fp32_sum = fp32_sequential_of_tensors([r["lm loss tokens"][0].reshape(-1) for r in results])
    loss_t = torch.tensor([contribution, fp32_sum], dtype=torch.float64, device=layout.device)
    dist.all_reduce(loss_t, op=dist.ReduceOp.SUM)
    return float(loss_t[0].item()), float(loss_t[1].item()), own


def record_step(run: Training, step: int, outcome: StepOutcome, writer: ResultsWriter, log: StepLog) -> None:
    """The step's loss, slowest time and peak memory over all ranks: in the log and to the parent."""
    from lockstep.runners.megatron import checkpoint as mcheckpoint

    layout, case = run.layout, run.case
    loss, fp32_sum, own = step_loss(run, outcome.results)
    on_cuda = layout.device.type == "cuda"
    peak = torch.cuda.max_memory_allocated(layout.device) / 2**20 if on_cuda else 0.0
    slowest_s, slowest_peak = slowest_rank(outcome.seconds, peak, layout.device, layout.world)
    if run.job.checkpoints is not None and layout.dp > 1:  # the resume judge's per-rank evidence (a collective)
        run.info.setdefault("rank_losses", {})[str(step)] = mcheckpoint.gather_rank_losses(own, layout)
    step_ms = slowest_s * 1e3
    tokens_per_s = tokens_per_second(case.total_batch, step_ms)
    log.times_ms.append(step_ms)
    log.rates.append(tokens_per_s)
    if not layout.reports:
        return
    lr = outcome.lr
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
    norm = float(outcome.grad_norm) if outcome.grad_norm is not None else None
    print(megatron_iteration_line(stamp, step, case.steps, step * run.global_batch, step_ms, lr,
                                  run.global_batch, loss, norm), flush=True)
    print(perf_step_line(step, case.steps, step_ms, tokens_per_s), flush=True)
    writer.step(StepRecord(step=step, loss=loss, step_ms=step_ms, tokens_per_s=tokens_per_s, lr=lr,
                           peak_mem_mb=slowest_peak if on_cuda else None,
                           loss_fp32_sum=fp32_sum if layout.dp == 1 else None))


def finish(run: Training, data: Data, log: StepLog) -> dict:
    """The final parameters (when asked), the PERF summary line, and the run's facts for the record."""
    layout = run.layout
    if run.job.final_params_path:
        final = final_canonical_params(run.chunks, run.shards, run.job.model, run.adapter, layout)
        if layout.rank == 0:
            write_final_params(run.job.final_params_path, final)
    measured_ms, measured_rates = after_warmup(log.times_ms), after_warmup(log.rates)
    _say(layout, perf_summary_line(len(measured_ms), sum(measured_ms) / len(measured_ms),
                                   sum(measured_rates) / len(measured_rates)))
    facts = run_facts(run, data)
    run.phases.lap("teardown")
    return {**run.info, **run.phases.report(), **peak_memory_info(layout.device, layout.world), **facts}


def run_facts(run: Training, data: Data) -> dict:
    """What the record's meta says about how megatron ran the case."""
    layout, case, config = run.layout, run.case, run.config
    return {
        "framework_version": f"megatron-core {run.version}",
        "megatron_core_version": run.version,
        "device_name": torch.cuda.get_device_name(layout.device) if layout.device.type == "cuda" else "cpu",
        "world_size": layout.world,
        "dp": layout.dp, "tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp, "ep": layout.ep,
        "sequence_parallel": case.sp,
        "pipeline_p2p": {"batch_p2p_comm": config.batch_p2p_comm, "overlap_p2p_comm": config.overlap_p2p_comm},
        "distributed_optimizer": case.zero >= 1,
        "precision": run.precision.label,
        "native_bf16": run.precision.native_bf16,
        "megatron_vocab_size": run.vocab_rows,
        "megatron_dataset": data.indexed.prefix,
        "cpu_shims": run.shims,
        "layer_spec": f"{getattr(run.adapter, 'spec_label', 'local (get_gpt_layer_local_spec)')}, {run.family.title} adapter",
        "torch_threads": torch.get_num_threads(),
    }


def final_canonical_params(chunks: list, shards: list, model, adapter, layout: ParallelLayout) -> dict:
    """Every parameter of the whole model under its canonical LLMC name, on rank 0 (a collective).

    Each chunk is read back through the adapter's reverse maps (`canonical_from_chunk`, TP
    pieces gathered over the TP group); DP rank 0 of every pipeline stage then sends its
    tensors to global rank 0. The tied output weight's second copy (last stage) is not read:
    wte comes from the first stage, so a tie that stopped holding shows as a wrong wte.
    """
    import numpy as np
    from megatron.core import parallel_state

    from lockstep.runners.megatron import weights as mweights

    tp_group = parallel_state.get_tensor_model_parallel_group()

    def gather_tp(local: np.ndarray) -> list[np.ndarray]:
        if layout.tp == 1:
            return [local]
        t = torch.from_numpy(np.ascontiguousarray(local)).to(layout.device)
        pieces = [torch.empty_like(t) for _ in range(layout.tp)]
        dist.all_gather(pieces, t, group=tp_group)
        return [p.cpu().numpy() for p in pieces]

    mine: dict = {}
    for chunk, shard in zip(chunks, shards):
        module = chunk
        while hasattr(module, "module"):  # DDP (and Float16Module) wrappers
            module = module.module
        params = {n: p.detach().float().cpu().numpy() for n, p in module.named_parameters()}
        mine.update(mweights.canonical_from_chunk(params, model, shard, adapter, gather_tp))
    sent = mweights.first_copies(mine, layout, adapter)
    everything = [None] * layout.world if layout.rank == 0 else None
    dist.gather_object(sent, everything, dst=0)
    if layout.rank != 0:
        return {}
    out: dict = {}
    for part in everything:
        out.update(part)
    return out


def _end_rank(job: MegatronJob, text: str) -> None:
    """End this rank now with `text` as its error (from a watcher thread: the main thread is blocked
    where nothing else would end it); torchrun, or the worker group, ends the others."""
    print(f"{LOG_MARKER}: error: {text}", flush=True)
    _write_error(job, text)
    sys.stderr.flush()
    # os._exit skips multiprocessing's exit handlers: the checkpoint writer's spawned Manager would
    # outlive the rank, orphaned (the rank's own process group is no longer anyone's to kill).
    end_multiprocessing_children()
    os._exit(1)


def _write_error(job: MegatronJob, text: str) -> None:
    """The first failing rank's one-sentence error, for the runner's RunError."""
    if not job.error_path:
        return
    try:
        with open(job.error_path, "x") as f:
            f.write(text)
    except FileExistsError:
        pass


def import_megatron() -> None:
    """Everything `train` imports from megatron-core (seconds of imports), loaded now, with its
    `torch.compile` decorators deferred to first call (compile_on_call.py: the runner calls none of
    them, and decorating alone imports torch's compiler)."""
    from lockstep.runners.megatron.compile_on_call import compile_on_first_call

    with compile_on_first_call():
        import megatron.core.dist_checkpointing  # noqa: F401
        import megatron.core.distributed  # noqa: F401
        import megatron.core.models.gpt.gpt_model  # noqa: F401
        import megatron.core.optimizer  # noqa: F401
        import megatron.core.pipeline_parallel  # noqa: F401
        import megatron.core.tensor_parallel  # noqa: F401

    from lockstep.runners.megatron import checkpoint, dataset, model, weights  # noqa: F401
    from lockstep.runners.megatron.families import adapter_for  # noqa: F401


class PersistentTraining:
    """The persistent worker's jobs (runners/workers.py): one case each; megatron-core is imported
    and the process group started once, the model-parallel grid made per case, or kept from the
    case before when that one ended well with the same layout (`parallel.reset_between_cases`)."""

    def run(self, job_dict: dict, writer: ResultsWriter) -> dict:
        job = MegatronJob.from_dict(job_dict)
        try:
            return train(job, writer)
        except LockstepError as e:
            print(f"{LOG_MARKER}: error: {e}", flush=True)
            _write_error(job, str(e))
            raise
        except Exception as e:
            _write_error(job, f"rank {int(os.environ.get('RANK', 0))}: {type(e).__name__}: {e}")
            raise

    def release(self, all_ranks_ok: bool) -> None:
        from lockstep.runners.megatron.parallel import reset_between_cases

        reset_between_cases(keep_grid=all_ranks_ok)


def main(argv: list[str]) -> int:
    from lockstep.runners.launch import end_with_parent

    end_with_parent()  # first: a killed lockstep or torchrun must not leave this rank training, saving into --out
    from lockstep.runners.megatron.parallel import shutdown, start_process_group
    from lockstep.runners.test_plugins import apply_test_plugins
    from lockstep.runners.mkl_vml import settle_mkl_vml_dispatch
    from lockstep.runners.workers import StartupTimeline, serve_arguments, serve_jobs

    from lockstep.runners.megatron.compile_on_call import compile_on_first_call

    with compile_on_first_call():  # a plugin that patches megatron imports it: see import_megatron
        apply_test_plugins()
    settle_mkl_vml_dispatch()  # before any parallel torch op: see mkl_vml.py (megatron's CE hit it)
    serving = serve_arguments(argv)
    if serving is not None:
        queue_dir, device = serving
        startup = StartupTimeline()
        _set_ieee_fp32()
        start_process_group(device)
        startup.mark("process group")
        import_megatron()  # before the first job arrives: a group started early has it done by then
        startup.mark("megatron-core imports")
        return serve_jobs(queue_dir, PersistentTraining(), startup)
    job = MegatronJob.from_dict(json.loads(Path(argv[0]).read_text()))
    rank = int(os.environ.get("RANK", 0))
    writer = ResultsWriter(job.results_path if reports_results() else None)
    try:
        import_megatron()
        info = train(job, writer)
        writer.info(**info)
    except LockstepError as e:
        print(f"{LOG_MARKER}: error: {e}", flush=True)
        _write_error(job, str(e))
        return 1  # no orderly shutdown: the other ranks may be blocked in a collective; torchrun ends them
    except Exception as e:
        traceback.print_exc()
        _write_error(job, f"rank {rank}: {type(e).__name__}: {e}")
        return 1
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
