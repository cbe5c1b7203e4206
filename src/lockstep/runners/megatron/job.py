"""What the `megatron` runner hands its torchrun workers, and the vocabulary rule both sides share.

Nothing here imports megatron-core: the runner (parent process) must stay importable, and
its `skip_reason` cheap, on machines without it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lockstep.capture.request import CaptureRequest
from lockstep.cases.spec import CaseSpec
from lockstep.models import config_from_dict
from lockstep.runners.checkpoint_plan import CheckpointPlan

WORKER_MODULE = "lockstep.runners.megatron.worker"
# As the other runners' (infinitrain, command): a case that hangs (a rank stuck in a collective, a
# checkpoint writer that never reports) ends with a sentence instead of holding the run forever.
DEFAULT_TIMEOUT_S = 1800.0
# The marker line every megatron log starts with. The log parsers key on it: Megatron-LM's own
# `pretrain_gpt.py` logs iteration 2 as the mean of iterations 1 and 2
# (docs/reference/logs.md#megatron-lm-pretrain_gptpy), our
# worker logs the true per-step loss, so the step-2 correction must never touch our logs.
LOG_MARKER = "lockstep megatron runner"
DATA_SEED = 1234  # GPTDataset's random_seed; only shuffles the (single) document, and the shuffle index is replaced
MODEL_SEED = 1234  # megatron's model-parallel RNG seed (no dropout and no random init are used, so it changes nothing)

# A step folder of the megatron runner (checkpoint.py): megatron-core's dist_checkpointing writes
# its metadata.json last, so a folder without one holds no complete checkpoint.
CHECKPOINT_FORMAT = "lockstep-megatron-dist-1"
CHECKPOINT_METADATA_FILE = "metadata.json"


def missing_checkpoint(folder: str | Path, step: int) -> str | None:
    """Why `folder` is not a step folder to resume step `step` from (one sentence), or None."""
    folder = Path(folder)
    if (folder / CHECKPOINT_METADATA_FILE).is_file():
        return None
    return (f"{folder}: no checkpoint of step {step} there (no megatron-core dist_checkpointing "
            f"{CHECKPOINT_METADATA_FILE}); the saving case must run first, with a save_interval that reaches the step")


@dataclass(frozen=True)
class MegatronOptions:
    """Runner options (`get_runner("megatron", **options)`)."""

    # Diagnostic mode: Megatron's native `--bf16` (bf16 parameters in a Float16Module, fp32 main
    # parameters in the optimizer) instead of the contract's autocast with fp32 parameters.
    native_bf16: bool = False
    # What megatron-fast turns on (runners/megatron/fast.py); `megatron` keeps all three off.
    core_attention: str = "local"  # "local": megatron-core's DotProductAttention; "sdpa": torch SDPA
    fusions: bool = False  # megatron-core's own fused bias+activation, bias+dropout+add and cross entropy
    cuda_graphs: bool = False  # megatron-core's local CUDA graphs (cuda_graph_impl="local"), on CUDA only
    # "local": the family's local layer spec; "te": Transformer Engine's (megatron-te, te_spec.py)
    layer_spec: str = "local"


@dataclass(frozen=True)
class MegatronFastOptions(MegatronOptions):
    """megatron-fast's defaults: the same worker with what megatron-core offers without Transformer
    Engine or Apex. CUDA graphs stay opt-in (`--megatron-fast-cuda-graphs`): see fast.py."""

    core_attention: str = "sdpa"
    fusions: bool = True


@dataclass(frozen=True)
class MegatronTEOptions(MegatronOptions):
    """megatron-te: megatron-core's Transformer Engine layer spec (te_spec.py), on CUDA only."""

    layer_spec: str = "te"


@dataclass(frozen=True)
class MegatronJob:
    """Everything one worker needs; written to JOB.json by the runner, read back by every rank."""

    case: CaseSpec
    model: Any  # the family's config the run was planned with; the checkpoint must agree with it
    checkpoint: str
    tokens: str
    tokens_sha256: str
    device: str  # "cpu" | "cuda"
    options: MegatronOptions = field(default_factory=MegatronOptions)
    error_path: str | None = None  # a failing rank writes its one-sentence error here
    results_path: str | None = None  # added by launch.run_workers
    # Record step 1 from inside as it trains (runners/megatron/capture.py): the certificate of
    # `lockstep run`, or (whole tensors, a one-step case) `lockstep diagnose`.
    capture: CaptureRequest | None = None
    # Write every parameter after the last step, under canonical LLMC names, here (.npz; rank 0).
    final_params_path: str | None = None
    # Save step folders and/or resume from one (runners/megatron/checkpoint.py).
    checkpoints: CheckpointPlan | None = None
    # Instead of training: write the model (built from `checkpoint`, canonical weights) and this
    # canonical Adam state as a step folder (checkpoint.write_state; diagnose --at-step).
    write_state: dict | None = None
    lora_seed: int = 42  # a LoRA case's init seed (RunInputs.lora_seed)
    framework: str = "megatron"  # the runner's name (`megatron-fast`), which its step-1 capture carries

    def to_dict(self) -> dict:
        return {"case": self.case.to_dict(), "model": self.model.to_dict(), "checkpoint": self.checkpoint, "tokens": self.tokens,
                "tokens_sha256": self.tokens_sha256, "device": self.device, "options": asdict(self.options),
                "error_path": self.error_path, "results_path": self.results_path,
                "capture": self.capture.to_dict() if self.capture else None,
                "final_params_path": self.final_params_path,
                "checkpoints": self.checkpoints.to_dict() if self.checkpoints else None,
                "write_state": self.write_state, "lora_seed": self.lora_seed, "framework": self.framework}

    @classmethod
    def from_dict(cls, d: dict) -> "MegatronJob":
        return cls(case=CaseSpec.from_dict(d["case"]), model=config_from_dict(d["model"]), checkpoint=d["checkpoint"],
                   tokens=d["tokens"], tokens_sha256=d.get("tokens_sha256", ""), device=d["device"],
                   options=MegatronOptions(**d.get("options", {})), error_path=d.get("error_path"),
                   results_path=d.get("results_path"), capture=CaptureRequest.from_dict(d.get("capture")),
                   final_params_path=d.get("final_params_path"),
                   checkpoints=CheckpointPlan.from_dict(d.get("checkpoints")), write_state=d.get("write_state"),
                   lora_seed=d.get("lora_seed", 42), framework=d.get("framework", "megatron"))
