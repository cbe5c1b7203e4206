"""InfiniTrain's `qwen3` example for the Qwen3 family: only some builds have one.

Two loaders exist: branch `feat/add_Qwen3-8B` (a3f84f8) reads LLMC version 3
(models/qwen3/checkpoint_v3.py), PR #208 reads version 4, lockstep's own file. Which one a build
has is asked of its executable (probe.py); a version-3 build gets a version-3 copy of the case's
weights, written once per run directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.fsutil import sha256_file
from lockstep.models import load_checkpoint
from lockstep.models.family import OptimizerSpec
from lockstep.models.qwen3.checkpoint import QWEN3_MAGIC, VERSION_FP32
from lockstep.models.qwen3.checkpoint_v3 import VERSION_A3F84F8, v3_problems, write_v3
from lockstep.runners.infinitrain.families.llama3 import LLAMA3_MIN_VOCAB, Llama3Family

# The version-3 executable (example/qwen3/main.cc of feat/add_Qwen3-8B) hard-codes
# `Adam::Create(lr, 0.9f, 0.95f, 1e-8f)`. Adam's first update does not depend on the betas
# (bias-corrected, m̂ = g and v̂ = g²), so steps 1 and 2 train as the contract's Adam does; from
# step 3 on, beta2 0.95 and the contract's 0.999 part.
V3_HARD_CODED_ADAM = OptimizerSpec("adam", beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0)
BETA_FREE_STEPS = 2


@dataclass(frozen=True)
class Qwen3Family(Llama3Family):
    def preflight(self, model, checkpoint: Path, optimizer: OptimizerSpec) -> None:
        # The optimizer is the build's question (build_skip_reason), not every build's.
        if model.vocab_size < LLAMA3_MIN_VOCAB:
            super().preflight(model, checkpoint, optimizer)

    def hard_coded_optimizer(self, facts) -> OptimizerSpec | None:
        return V3_HARD_CODED_ADAM if facts.llmc_version == VERSION_A3F84F8 else None

    def build_skip_reason(self, case: CaseSpec, model, optimizer: OptimizerSpec, facts) -> str | None:
        version = facts.llmc_version
        if version == VERSION_FP32:
            return None
        if version != VERSION_A3F84F8:
            return (f"this InfiniTrain build's {facts.path.name} reads Qwen3 LLMC version {version}; lockstep writes "
                    f"versions {VERSION_A3F84F8} (branch feat/add_Qwen3-8B) and {VERSION_FP32} (PR #208)")
        problems = v3_problems(model)
        if problems:
            return f"this InfiniTrain build reads Qwen3 LLMC version 3, which cannot hold this shape: {problems[-1]}"
        if optimizer != V3_HARD_CODED_ADAM and case.steps > BETA_FREE_STEPS:
            return (f"this InfiniTrain build's {facts.path.name} (LLMC version 3) hard-codes "
                    f"{V3_HARD_CODED_ADAM.label}, the contract asks for {optimizer.label}; Adam's first update "
                    f"does not depend on the betas, so only cases of at most {BETA_FREE_STEPS} steps compare "
                    f"(--steps {BETA_FREE_STEPS})")
        return None

    def checkpoint_for(self, facts, checkpoint: Path, checkpoint_sha256: str, model, dest_dir: Path) -> Path:
        if facts.llmc_version == VERSION_FP32:
            return checkpoint
        if facts.llmc_version != VERSION_A3F84F8:
            raise LockstepError(f"{facts.path} reads Qwen3 LLMC version {facts.llmc_version}, which lockstep does "
                                "not write")
        # Named by the source's content: every case of a run reuses it, another checkpoint never does.
        # The plan hashed it already (a Qwen3-1.7B file takes seconds); a caller without it hashes here.
        digest = (checkpoint_sha256 or sha256_file(checkpoint))[:16]
        dest = Path(dest_dir) / f"{Path(checkpoint).stem}.{digest}.qwen3-v{VERSION_A3F84F8}.bin"
        if not dest.is_file():
            source = load_checkpoint(checkpoint)
            write_v3(dest, source.config, source.tensors)
        return dest


ADAPTER = Qwen3Family("qwen3", "qwen3", optional=True, probe_magic=QWEN3_MAGIC,
                      missing_note="InfiniTrain b24d92f has none; branch feat/add_Qwen3-8B and PR #208 add one")
