"""InfiniTrain per model family: which executable trains it, and what that executable accepts.

One module per family (`families/<family>.py`, defining ADAPTER, an `InfiniTrainFamily`), found
by the family's name: a new family adds its module here and edits no table. Facts of InfiniTrain
b24d92f (docs/reference/infinitrain.md#known-facts-infinitrain-b24d92f) that a case must meet before it is launched; each is a skip or a
refusal with the reason, never a crash of the executable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.models.family import OptimizerSpec


@dataclass(frozen=True)
class InfiniTrainFamily:
    family: str
    executable: str
    # False: a build without this executable cannot run the family at all (the run is refused);
    # True: only some builds have it, and cases of the family are skipped with the reason.
    optional: bool = False
    missing_note: str = ""
    flags: tuple[str, ...] = ()  # what the executable needs besides the training flags
    # Set: the runner asks the executable (probe.py) which LLMC version of this magic it reads,
    # and which flags it has, before a case runs; None: the executable is b24d92f's, as documented.
    probe_magic: int | None = None
    # False: its step lines go to stdout without glog's prefix (tiny_mixtral prints them with std::cout).
    glog_step_lines: bool = True
    # Set: the executable trains on one device only, and this says why (a DP, TP, PP, EP or ZeRO case
    # is skipped with it, on any device).
    one_device_only: str = ""
    # The shape (n_layer, n_head, n_kv_head, n_embd, vocab_size) its executable writes into a saved
    # folder's trainer_state.json and checks a --load folder's against: its default config, not the
    # model loaded with --llmc_filepath (docs/reference/checkpoints.md). Empty: not known here.
    resume_shape: tuple[tuple[str, int], ...] = ()

    def batch_flags(self, case: CaseSpec, threads: int) -> list[str]:
        """The batch and world flags (gpt2/llama3/qwen3's main.cc): B and the tokens per step, and this
        process's threads, which are the world's ranks (DP = world / (TP * PP))."""
        return ["--batch_size", str(case.micro_batch), "--total_batch_size", str(case.total_batch),
                "--nthread_per_process", str(threads)]

    def probe(self, facts):
        """The family's own questions to its executable, after its flags and LLMC version (probe.py):
        `facts` as they are, or completed (e.g. `compiled_model`)."""
        return facts

    def preflight(self, model, checkpoint: Path, optimizer: OptimizerSpec) -> None:
        """Raise LockstepError when the executable can never train this model."""

    def skip_reason(self, case: CaseSpec, model, checkpoint: Path) -> str | None:
        return None

    def build_skip_reason(self, case: CaseSpec, model, optimizer: OptimizerSpec, facts) -> str | None:
        """Why this build (probed: `facts`, a probe.ExecutableFacts) cannot train the case, or None."""
        return None

    def checkpoint_for(self, facts, checkpoint: Path, checkpoint_sha256: str, model, dest_dir: Path) -> Path:
        """The LLMC file the probed executable reads: the case's own, or one written for it in dest_dir
        (named by `checkpoint_sha256`, the plan's digest of `checkpoint`)."""
        return checkpoint

    def canonical_state(self, state: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
        """InfiniTrain's saved tensors (its module names, TP=1, one stage) under LLMC names."""
        raise LockstepError(f"lockstep cannot map InfiniTrain's {self.family} checkpoint names to LLMC names")

    def native_state(self, canonical: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
        """`canonical_state`'s inverse: LLMC tensors (per layer, `qkvw[3]`) as the model state dict its
        executable's --load needs (every name it has, buffers included: a missing one is fatal there)."""
        raise LockstepError(f"lockstep cannot write InfiniTrain's {self.family} checkpoint from LLMC names yet")


def rename(state: dict[str, np.ndarray], layer: dict[str, str], top: dict[str, str]) -> dict[str, np.ndarray]:
    out = {}
    for name, a in state.items():
        m = re.match(r"^transformer\.h\.(\d+)\.(.+)$", name)
        if m and m.group(2) in layer:
            out[f"{layer[m.group(2)]}[{int(m.group(1))}]"] = a
        elif name in top:
            out[top[name]] = a
    return out


def unrename(canonical: dict[str, np.ndarray], layer: dict[str, str], top: dict[str, str]) -> dict[str, np.ndarray]:
    """`rename`'s inverse; LockstepError for a canonical tensor neither table names."""
    by_layer, by_top = {v: k for k, v in layer.items()}, {v: k for k, v in top.items()}
    out = {}
    for name, a in canonical.items():
        m = re.match(r"^(\w+)\[(\d+)\]$", name)
        if m and m.group(1) in by_layer:
            out[f"transformer.h.{int(m.group(2))}.{by_layer[m.group(1)]}"] = a
        elif name in by_top:
            out[by_top[name]] = a
        else:
            raise LockstepError(f"canonical tensor {name} has no InfiniTrain name")
    return out


def adapter_for(family: str) -> InfiniTrainFamily:
    """The family's adapter (`families/<family>.py`), or a LockstepError saying there is none."""
    from lockstep.runners.registry import specs

    try:
        return specs()["infinitrain"].adapter(family)
    except LockstepError:
        raise LockstepError(f"InfiniTrain has no example executable for model family {family!r}") from None


def header_word(path: Path, index: int) -> int | None:
    try:
        header = np.fromfile(path, dtype="<i4", count=index + 1)
    except OSError:
        return None
    return int(header[index]) if header.shape[0] > index else None
