"""InfiniTrain per model family: which executable trains it, and what that executable accepts.

One module per family (`families/<family>.py`, defining ADAPTER, an `InfiniTrainFamily`), found
by the family's name: a new family adds its module here and edits no table. Facts of InfiniTrain
b24d92f (docs/reference/infinitrain.md#known-facts-infinitrain-b24d92f) that a case must meet before it is launched; each is a skip or a
refusal with the reason, never a crash of the executable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.models.family import OptimizerSpec


# The flags InfiniTrain's gpt2 and llama3 examples share (example/<family>/main.cc, DEFINE_* at b24d92f),
# with the JSON type a test_config.json arg must have (gflags' type of the flag) and the default.
EXAMPLE_ARG_TYPES: dict[str, type] = {
    "nthread_per_process": int, "batch_size": int, "sequence_length": int, "total_batch_size": int,
    "num_iteration": int, "learning_rate": float, "dtype": str, "tensor_parallel": int, "sequence_parallel": bool,
    "pipeline_parallel": int, "virtual_pipeline_parallel": int, "zero_stage": int, "lora_rank": int,
    "lora_alpha": float, "lora_target_modules": str, "save": str, "load": str, "save_interval": int,
    "max_checkpoint_keep": int, "save_optimizer_state": bool,
}
EXAMPLE_FLAG_DEFAULTS = {"batch_size": 4, "sequence_length": 64, "total_batch_size": 256, "num_iteration": 10,
                         "dtype": "float32", "nthread_per_process": 1, "tensor_parallel": 1,
                         "sequence_parallel": False, "pipeline_parallel": 1, "virtual_pipeline_parallel": 1,
                         "zero_stage": 0, "save_interval": 0, "max_checkpoint_keep": 3, "save_optimizer_state": True,
                         "lora_rank": 0, "lora_alpha": 16.0}


@dataclass(frozen=True)
class TestConfigExample:
    """How InfiniTrain's test driver (scripts/run_models_and_profile.bash) runs the family's example on a
    scripts/test_config.json (read by cases/infinitrain_config.py)."""

    __test__ = False  # not a pytest class, despite its name
    order: int  # its place in the driver's loop over examples
    log_prefix: str  # its logs, and lockstep's cases, are `<log_prefix>_<test id>`
    default_shape: str  # the model its example trains unless --model says otherwise
    groups_variable: str  # the variable naming the groups it runs (the MoE branch's *_TEST_GROUPS)
    default_groups: tuple[str, ...]  # what it runs when another example's variable is set and not its own
    groups_without_variables: tuple[str, ...] | None  # in a file with no such variable (None: every group)
    input_variables: tuple[str, str]  # the variables naming its token file and its LLMC init
    arg_types: dict[str, type] = field(default_factory=lambda: dict(EXAMPLE_ARG_TYPES))
    flag_defaults: dict[str, object] = field(default_factory=lambda: dict(EXAMPLE_FLAG_DEFAULTS))
    # True: its batch flags count sequences (micro_batch_size, global_batch_size) on one device.
    sequence_batches: bool = False


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
    # Set: InfiniTrain's test_config.json runs the family's example, as this says; None: it does not.
    test_config: TestConfigExample | None = None

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

    def hard_coded_optimizer(self, facts) -> OptimizerSpec | None:
        """The optimizer this build (probed: `facts`) trains with whatever its flags say, where it is
        not the family's contract, or None."""
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
