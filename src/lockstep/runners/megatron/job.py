"""What the `megatron` runner hands its torchrun workers, and the vocabulary rule both sides share.

Nothing here imports megatron-core: the runner (parent process) must stay importable, and
its `skip_reason` cheap, on machines without it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from lockstep.cases.spec import CaseSpec
from lockstep.models.configs import GPT2Config

WORKER_MODULE = "lockstep.runners.megatron.worker"
# The marker line every megatron log starts with. The log parsers key on it: Megatron-LM's own
# `pretrain_gpt.py` logs iteration 2 as the mean of iterations 1 and 2 (SPEC section 6), our
# worker logs the true per-step loss, so the step-2 correction must never touch our logs.
LOG_MARKER = "lockstep megatron runner"
DATA_SEED = 1234  # GPTDataset's random_seed; only shuffles the (single) document, and the shuffle index is replaced
MODEL_SEED = 1234  # megatron's model-parallel RNG seed (no dropout and no random init are used, so it changes nothing)


@dataclass(frozen=True)
class MegatronOptions:
    """Runner options (`get_runner("megatron", **options)`)."""

    # Diagnostic mode: Megatron's native `--bf16` (bf16 parameters in a Float16Module, fp32 main
    # parameters in the optimizer) instead of the contract's autocast with fp32 parameters.
    native_bf16: bool = False


@dataclass(frozen=True)
class MegatronJob:
    """Everything one worker needs; written to JOB.json by the runner, read back by every rank."""

    case: CaseSpec
    model: GPT2Config  # the shape the run was planned with; the checkpoint must agree with it
    checkpoint: str
    tokens: str
    tokens_sha256: str
    device: str  # "cpu" | "cuda"
    options: MegatronOptions = field(default_factory=MegatronOptions)
    error_path: str | None = None  # a failing rank writes its one-sentence error here
    results_path: str | None = None  # added by launch.run_workers

    def to_dict(self) -> dict:
        model = asdict(self.model)
        return {"case": self.case.to_dict(), "model": model, "checkpoint": self.checkpoint, "tokens": self.tokens,
                "tokens_sha256": self.tokens_sha256, "device": self.device, "options": asdict(self.options),
                "error_path": self.error_path, "results_path": self.results_path}

    @classmethod
    def from_dict(cls, d: dict) -> "MegatronJob":
        return cls(case=CaseSpec.from_dict(d["case"]), model=GPT2Config(**d["model"]), checkpoint=d["checkpoint"],
                   tokens=d["tokens"], tokens_sha256=d.get("tokens_sha256", ""), device=d["device"],
                   options=MegatronOptions(**d.get("options", {})), error_path=d.get("error_path"),
                   results_path=d.get("results_path"))


def megatron_vocab_size(model: GPT2Config, tp: int) -> int:
    """Rows of Megatron's word embedding (and output layer) for this TP size.

    TP=1 uses the true vocabulary V (wte rows 0..V-1), so no logit needs masking. With TP>1
    Megatron's VocabParallelEmbedding splits the rows evenly over the TP ranks, so the vocab is
    LLMC's padded Vp (50304 = 2^7 * 393, divisible by every usual TP) or, if Vp does not divide,
    Vp rounded up to a multiple of TP. Logits V.. are masked to -inf in the loss (SPEC section 4).
    """
    if tp == 1:
        return model.vocab_size
    return -(-model.padded_vocab_size // tp) * tp


def layout_problem(case: CaseSpec, model: GPT2Config) -> str | None:
    """Why megatron-core cannot split this model the way the case asks, or None."""
    if model.num_heads % case.tp:
        return f"TP={case.tp} does not divide the model's {model.num_heads} attention heads"
    if (4 * model.channels) % case.tp:
        return f"TP={case.tp} does not divide the MLP width {4 * model.channels}"
    chunks = case.pp * case.vpp
    if model.num_layers % chunks:
        what = f"PP={case.pp}" + (f" x VPP={case.vpp}" if case.vpp > 1 else "")
        return f"{what} does not divide the model's {model.num_layers} layers evenly"
    if case.vpp > 1 and case.pp == 1:
        return "virtual pipeline stages (VPP > 1) need PP > 1"
    if case.vpp > 1 and case.accum % case.pp:
        return (f"Megatron's interleaved schedule needs the micro batches per step ({case.accum}) "
                f"to be a multiple of PP={case.pp}")
    if case.sp and case.seq_len % case.tp:
        return f"sequence parallel needs the sequence length {case.seq_len} divisible by TP={case.tp}"
    return None
