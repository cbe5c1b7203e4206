"""The fast PyTorch loop: the same case, data order, model semantics and contract as the reference
trainer (runners/pytorch/train.py), trained the way a performance-minded user would:

- the forward and the loss under `torch.compile` (inductor); where it cannot compile (e.g. no
  C++ compiler for inductor on a CPU) it runs eagerly and says so in the log and the record;
- attention by `F.scaled_dot_product_attention(is_causal=True)` (flash / memory-efficient
  kernels on GPUs) instead of the reference's explicit FP32-softmax attention;
- the fused optimizer (`fused=True`; `foreach=True` where fused is not available);
- TF32 off for FP32 cases, as the contract says (a faster anchor must not change the dtype).

It differs from the reference only in rounding (kernel choice and fusion), so its loss is
compared like any framework's. Step timing is the contract's: synchronize, start; data,
forward, loss, backward, optimizer step; synchronize, stop. The logged loss (the FP32 token
losses' mean taken in FP64, as the reference logs it) is computed after the stop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, TextIO

import torch
import torch.nn.functional as F

from lockstep.cases.lr_schedule import lr_at
from lockstep.cases.spec import CaseSpec
from lockstep.data.loader import TokenBatches
from lockstep.formats.logs import llmc_step_line, perf_summary_line
from lockstep.formats.run_record import StepRecord
from lockstep.formats.tokens import read_token_stream
from lockstep.models import family as model_family
from lockstep.models import load_checkpoint
from lockstep.models.family import OptimizerSpec
from lockstep.runners.memory import peak_memory_info
from lockstep.runners import pytorch as reference_step
from lockstep.step_contract import Phases, StepClock, after_warmup, fp32_matmul_precision, fp32_sequential_of_tensors, step_loss_fp64


def sdpa_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The reference models' attention-kernel signature, by SDPA: q (B, T, NH, hd), k/v (B, T, kv, hd)
    -> (B, T, NH*hd); scale 1/sqrt(hd) (SDPA's default), causal; GQA as repeat_interleave."""
    B, T, NH, hd = q.shape
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != NH)
    return y.transpose(1, 2).reshape(B, T, NH * hd)


def use_sdpa(model: torch.nn.Module) -> int:
    """Swap every attention module's kernel for SDPA; returns how many were swapped."""
    n = 0
    for module in model.modules():
        if hasattr(module, "attention_kernel"):
            module.attention_kernel = sdpa_causal_attention
            n += 1
    return n


@dataclass
class FastSettings:
    """What this run actually used, for the log and the record (a fallback is never silent)."""

    compiled: bool = False
    optimizer_impl: str = ""
    attention: str = "scaled_dot_product_attention(is_causal=True)"
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"torch_compile": self.compiled, "optimizer_impl": self.optimizer_impl, "attention": self.attention,
                "tf32": False, "notes": self.notes}


def build_fast_optimizer(spec: OptimizerSpec, params, lr: float, settings: FastSettings) -> torch.optim.Optimizer:
    """The family's contract optimizer with torch's fused kernel, else the foreach one."""
    params = list(params)
    if spec.kind == "sgd":
        make = lambda **kw: torch.optim.SGD(params, lr=lr, momentum=0.0, weight_decay=spec.weight_decay, **kw)  # noqa: E731
    elif spec.kind == "adam":
        make = lambda **kw: torch.optim.Adam(params, lr=lr, betas=(spec.beta1, spec.beta2), eps=spec.eps,  # noqa: E731
                                             weight_decay=spec.weight_decay, **kw)
    else:
        raise ValueError(f"unknown optimizer kind {spec.kind!r}")
    try:
        optimizer, settings.optimizer_impl = make(fused=True), "fused"
    except (RuntimeError, ValueError) as e:  # no fused kernel for this device / torch build
        optimizer, settings.optimizer_impl = make(foreach=True), "foreach"
        settings.notes.append(f"fused {spec.kind} unavailable ({e}); foreach instead")
    return optimizer


def compiler_available() -> str | None:
    """None when torch.compile works here (forward and backward of a tiny function), else why not."""
    try:
        f = torch.compile(lambda x: (x * 2).sin().sum())
        x = torch.ones(4, requires_grad=True)
        f(x).backward()
        return None
    except Exception as e:  # inductor raises many kinds (no compiler, no triton, ...)
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200]


class FastForward:
    """The reference's forward and loss, under torch.compile where it works here; the fallback is said."""

    def __init__(self, model: torch.nn.Module, case: CaseSpec, settings: FastSettings, compile_model: bool):
        self.model, self.case, self.settings = model, case, settings
        self.forward = self.eager
        if not compile_model:
            settings.notes.append("torch.compile off (asked)")
            return
        why_not = compiler_available()
        if why_not is None:
            self.forward, settings.compiled = torch.compile(self.eager), True
        else:
            settings.notes.append(f"torch.compile unavailable here, eager instead ({why_not})")

    def eager(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return reference_step.token_losses(self.model, x, y, self.case.is_bf16)

    def fall_back(self, e: Exception, log: TextIO) -> None:
        """Eager from now on, after the compiled forward failed at its first call; said in the log."""
        self.forward, self.settings.compiled = self.eager, False
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        self.settings.notes.append(f"torch.compile failed at step 1, eager instead ({type(e).__name__}: {first})")
        print(f"note: {self.settings.notes[-1]}", file=log, flush=True)


@dataclass
class FastTrainee:
    """The case's model, optimizer and batches on one device, the way the fast loop trains them."""

    case: CaseSpec
    device: torch.device
    batches: TokenBatches
    optimizer: torch.optim.Optimizer
    forward: FastForward

    def step(self, step: int) -> tuple[float, list[torch.Tensor]]:
        """One contract step at its lr: (seconds, micro losses)."""
        case, device = self.case, self.device

        def micro_batches():
            for micro in range(case.accum):
                x, y = self.batches.micro_batch(step, micro)
                yield reference_step.MicroBatch(x.to(device, non_blocking=True), y.to(device, non_blocking=True), 0, micro)

        reference_step.set_lr(self.optimizer, lr_at(case, step + 1))
        with StepClock(device) as clock:
            micro_losses = reference_step.contract_step(micro_batches(), lambda mb: self.forward.forward(mb.x, mb.y),
                                                        case.accum, self.optimizer)
        return clock.seconds, micro_losses

    def step_or_retry(self, step: int, log: TextIO) -> tuple[float, list[torch.Tensor]]:
        try:
            return self.step(step)
        except Exception as e:
            # Compilation happens at the first call; a compiler that fails there (after the
            # probe passed) leaves the weights untouched: retry the step eagerly, say so.
            if not (self.forward.settings.compiled and step == 0):
                raise
            self.forward.fall_back(e, log)
            return self.step(step)


def set_up_fast(case: CaseSpec, checkpoint: str, tokens_path: str, device: torch.device, compile_model: bool,
                phases: Phases, log: TextIO) -> tuple[FastTrainee, FastSettings]:
    """Weights and data of the case (each in its timed phase), SDPA, the fused optimizer, the compiled forward;
    the log's header and notes say what was used."""
    ckpt = load_checkpoint(checkpoint)
    family = model_family(ckpt.family)
    phases.lap("weights")
    stream = read_token_stream(tokens_path, vocab_size=ckpt.config.vocab_size)
    case.check(max_seq_len=ckpt.config.max_seq_len, available_tokens=len(stream))
    phases.lap("data")
    with torch.device(device):  # the random init it replaces at once is cheap on the device
        model = family.reference_class().from_llmc(ckpt.tensors, ckpt.config)
    settings = FastSettings()
    if not use_sdpa(model):
        settings.attention = "the reference's (no attention kernel hook in this model)"
    optimizer = build_fast_optimizer(case.optimizer_of(family.optimizer), model.parameters(), case.lr, settings)
    forward = FastForward(model, case, settings, compile_model)
    print(f"lockstep pytorch-fast runner | case {case.name} | {case.parallel_label} | dtype {case.dtype} | "
          f"B={case.micro_batch} T={case.seq_len} tokens/step={case.total_batch} accum={case.accum} | "
          f"{family.title} {ckpt.config.describe()} | {case.optimizer_of(family.optimizer).label} ({settings.optimizer_impl}) lr {case.lr:g} | "
          f"torch.compile {'on' if settings.compiled else 'off'} | attention {settings.attention} | "
          f"device {device} | torch {torch.__version__}", file=log, flush=True)
    for note in settings.notes:
        print(f"note: {note}", file=log, flush=True)
    return FastTrainee(case, device, TokenBatches(stream.tokens, case), optimizer, forward), settings


def fast_step_record(case: CaseSpec, step: int, elapsed_s: float, micro_losses: list, device) -> StepRecord:
    """The step's record after its clock stopped: the logged loss is the reference's FP64 mean of the FP32 token
    losses, computed after the stop."""
    loss = float(step_loss_fp64(micro_losses, case.accum).item())
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return StepRecord(step=step + 1, loss=loss, step_ms=elapsed_s * 1e3, tokens_per_s=case.total_batch / elapsed_s,
                      lr=lr_at(case, step + 1), peak_mem_mb=peak,
                      loss_fp32_sum=fp32_sequential_of_tensors(micro_losses))


def train_fast(case: CaseSpec, checkpoint: str, tokens_path: str, device_kind: str,
               emit: Callable[[StepRecord], None], log: TextIO, compile_model: bool = True) -> dict:
    """Train `case.steps` steps on one device; `emit` gets each step's record."""
    phases = Phases()
    torch._dynamo.reset()  # each case compiles afresh: no cache (or recompile limit) carried between cases
    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    trainee, settings = set_up_fast(case, checkpoint, tokens_path, device, compile_model, phases, log)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    phases.lap("weights")  # the model, and torch.compile's wrapper (compiling happens in step 1)
    records = []
    with fp32_matmul_precision(enabled_tf32=False):
        for step in range(case.steps):
            elapsed_s, micro_losses = trainee.step_or_retry(step, log)
            rec = fast_step_record(case, step, elapsed_s, micro_losses, device)
            print(llmc_step_line(rec.step, case.steps, rec.loss, rec.lr, rec.step_ms, rec.tokens_per_s),
                  file=log, flush=True)
            emit(rec)
            records.append(rec)
    phases.lap("training")
    measured_ms, measured_rates = after_warmup([r.step_ms for r in records]), after_warmup([r.tokens_per_s for r in records])
    print(perf_summary_line(len(measured_ms), sum(measured_ms) / len(measured_ms),
                            sum(measured_rates) / len(measured_rates)), file=log, flush=True)
    return {**phases.report(), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "world_size": 1, "torch_threads": torch.get_num_threads(), "fast_settings": settings.to_dict(),
            **peak_memory_info(device, 1)}
