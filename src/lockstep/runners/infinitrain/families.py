"""InfiniTrain per model family: which executable trains it, and what that executable accepts.

Facts of InfiniTrain b24d92f (docs/reference/infinitrain.md#known-facts-infinitrain-b24d92f) that a case
must meet before it is launched;
each is a skip or a refusal with the reason, never a crash of the executable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.models.family import OptimizerSpec

# Its GPT-2 LLMC loader never sets n_kv_head, which keeps the default 12, and then checks
# n_kv_head == n_head; it CHECKs version 3 (FP32 tensors) and rejects bf16 files (version 5).
GPT2_LOADER_HEADS = 12
GPT2_LOADER_VERSION = 3
# Its llama3 example hard-codes the vocabulary-sized buffers of Llama 3 and its optimizer.
LLAMA3_MIN_VOCAB = 128_256
LLAMA3_HARD_CODED_ADAM = OptimizerSpec("adam", beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)


@dataclass(frozen=True)
class InfiniTrainFamily:
    family: str
    executable: str
    # False: a build without this executable cannot run the family at all (the run is refused);
    # True: only some builds have it, and cases of the family are skipped with the reason.
    optional: bool = False
    missing_note: str = ""
    flags: tuple[str, ...] = ()  # what the executable needs besides the training flags

    def preflight(self, model, checkpoint: Path, optimizer: OptimizerSpec) -> None:
        """Raise LockstepError when the executable can never train this model."""

    def skip_reason(self, case: CaseSpec, model, checkpoint: Path) -> str | None:
        return None

    def canonical_state(self, state: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
        """InfiniTrain's saved tensors (its module names, TP=1, one stage) under LLMC names."""
        raise LockstepError(f"lockstep cannot map InfiniTrain's {self.family} checkpoint names to LLMC names")


_GPT2_LAYER = {"ln_1.weight": "ln1w", "ln_1.bias": "ln1b", "attn.c_attn.weight": "qkvw", "attn.c_attn.bias": "qkvb",
               "attn.c_proj.weight": "attprojw", "attn.c_proj.bias": "attprojb", "ln_2.weight": "ln2w",
               "ln_2.bias": "ln2b", "mlp.c_fc.weight": "fcw", "mlp.c_fc.bias": "fcb", "mlp.c_proj.weight": "fcprojw",
               "mlp.c_proj.bias": "fcprojb"}
_GPT2_TOP = {"transformer.wte.weight": "wte", "transformer.wpe.weight": "wpe", "transformer.ln_f.weight": "lnfw",
             "transformer.ln_f.bias": "lnfb"}
# example/llama3/checkpoint_loader.cc's names
_LLAMA3_LAYER = {"ln_1.weight": "ln1w", "attn.c_attn.weight": "qkvw", "attn.c_proj.weight": "attprojw",
                 "ln_2.weight": "ln2w", "mlp.c_fc.weight": "fcw", "mlp.c_fc2.weight": "fcw2",
                 "mlp.c_proj.weight": "fcprojw"}
_LLAMA3_TOP = {"transformer.wte.weight": "wte", "transformer.ln_f.weight": "lnfw", "lm_head.weight": "lm_head"}


def _rename(state: dict[str, np.ndarray], layer: dict[str, str], top: dict[str, str]) -> dict[str, np.ndarray]:
    out = {}
    for name, a in state.items():
        m = re.match(r"^transformer\.h\.(\d+)\.(.+)$", name)
        if m and m.group(2) in layer:
            out[f"{layer[m.group(2)]}[{int(m.group(1))}]"] = a
        elif name in top:
            out[top[name]] = a
    return out


@dataclass(frozen=True)
class GPT2Family(InfiniTrainFamily):
    def canonical_state(self, state: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
        """wte's V rows padded to Vp with zeros; `lm_head.weight` (a separate copy when a build loses
        the tie) is not a canonical tensor and is left out."""
        out = _rename(state, _GPT2_LAYER, _GPT2_TOP)
        if "wte" in out and out["wte"].shape[0] < config.padded_vocab_size:
            padded = np.zeros((config.padded_vocab_size, out["wte"].shape[1]), dtype=np.float32)
            padded[: out["wte"].shape[0]] = out["wte"]
            out["wte"] = padded
        return out

    def skip_reason(self, case: CaseSpec, model, checkpoint: Path) -> str | None:
        if model.num_heads != GPT2_LOADER_HEADS:
            return (f"InfiniTrain's GPT-2 LLMC loader accepts only {GPT2_LOADER_HEADS} heads, "
                    f"the model has {model.num_heads}")
        version = _header_word(checkpoint, 1)
        if version is not None and version != GPT2_LOADER_VERSION:
            return (f"InfiniTrain's GPT-2 LLMC loader reads only version {GPT2_LOADER_VERSION} (FP32) checkpoints, "
                    f"{checkpoint} is version {version}")
        return None


@dataclass(frozen=True)
class Llama3Family(InfiniTrainFamily):
    def canonical_state(self, state: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
        return _rename(state, _LLAMA3_LAYER, _LLAMA3_TOP)

    def preflight(self, model, checkpoint: Path, optimizer: OptimizerSpec) -> None:
        if model.vocab_size < LLAMA3_MIN_VOCAB:
            raise LockstepError(f"InfiniTrain's {self.executable} hard-codes buffers for a vocabulary of at least "
                                f"{LLAMA3_MIN_VOCAB:,} tokens, but {checkpoint} has V={model.vocab_size:,}; "
                                "keep the real vocabulary in small Llama 3 shapes (e.g. llama3-tiny)")
        if optimizer != LLAMA3_HARD_CODED_ADAM:
            raise LockstepError(f"InfiniTrain's {self.executable} hard-codes {LLAMA3_HARD_CODED_ADAM.label}, "
                                f"the contract asks for {optimizer.label}")


ADAPTERS: dict[str, InfiniTrainFamily] = {
    "gpt2": GPT2Family("gpt2", "gpt2"),
    "llama3": Llama3Family("llama3", "llama3", flags=("--model", "llama3")),
    "qwen3": Llama3Family("qwen3", "qwen3", optional=True,
                          missing_note="InfiniTrain b24d92f has none; its PR #208 adds one reading the v4 layout"),
}


def adapter_for(family: str) -> InfiniTrainFamily:
    try:
        return ADAPTERS[family]
    except KeyError:
        raise LockstepError(f"InfiniTrain has no example executable for model family {family!r}") from None


def _header_word(path: Path, index: int) -> int | None:
    try:
        header = np.fromfile(path, dtype="<i4", count=index + 1)
    except OSError:
        return None
    return int(header[index]) if header.shape[0] > index else None
