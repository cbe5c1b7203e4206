"""InfiniTrain's `llama3` example for the Llama 3 family (and, in builds that have one, Qwen3's)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep.errors import LockstepError
from lockstep.models.family import OptimizerSpec
from lockstep.runners.infinitrain.families import (EXAMPLE_FLAG_DEFAULTS, InfiniTrainFamily, TestConfigExample, rename,
                                                   unrename)

# Its llama3 example hard-codes the vocabulary-sized buffers of Llama 3 and its optimizer.
LLAMA3_MIN_VOCAB = 128_256
LLAMA3_HARD_CODED_ADAM = OptimizerSpec("adam", beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)

# example/llama3/checkpoint_loader.cc's names
_LLAMA3_LAYER = {"ln_1.weight": "ln1w", "attn.c_attn.weight": "qkvw", "attn.c_proj.weight": "attprojw",
                 "ln_2.weight": "ln2w", "mlp.c_fc.weight": "fcw", "mlp.c_fc2.weight": "fcw2",
                 "mlp.c_proj.weight": "fcprojw"}
_LLAMA3_TOP = {"transformer.wte.weight": "wte", "transformer.ln_f.weight": "lnfw", "lm_head.weight": "lm_head"}


@dataclass(frozen=True)
class Llama3Family(InfiniTrainFamily):
    def canonical_state(self, state: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
        return rename(state, _LLAMA3_LAYER, _LLAMA3_TOP)

    def native_state(self, canonical: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
        """`canonical_state`'s inverse: its state dict holds its parameters only (no buffers; lm_head untied)."""
        return unrename(canonical, _LLAMA3_LAYER, _LLAMA3_TOP)

    def preflight(self, model, checkpoint: Path, optimizer: OptimizerSpec) -> None:
        if model.vocab_size < LLAMA3_MIN_VOCAB:
            raise LockstepError(f"InfiniTrain's {self.executable} hard-codes buffers for a vocabulary of at least "
                                f"{LLAMA3_MIN_VOCAB:,} tokens, but {checkpoint} has V={model.vocab_size:,}; "
                                "keep the real vocabulary in small Llama 3 shapes (e.g. llama3-tiny)")
        if optimizer != LLAMA3_HARD_CODED_ADAM:
            raise LockstepError(f"InfiniTrain's {self.executable} hard-codes {LLAMA3_HARD_CODED_ADAM.label}, "
                                f"the contract asks for {optimizer.label}")


# example/llama3/main.cc writes its default config (Llama 3.2 1B) into a saved trainer_state.json, whatever
# model --llmc_filepath loaded (seen in a save of llama3-tiny on b24d92f's CPU build).
ADAPTER = Llama3Family("llama3", "llama3", flags=("--model", "llama3"),
                       resume_shape=(("n_layer", 16), ("n_head", 32), ("n_kv_head", 8), ("n_embd", 2048),
                                     ("vocab_size", 128256)),
                       test_config=TestConfigExample(
                           order=1, log_prefix="llama3", default_shape="llama3", groups_variable="LLAMA3_TEST_GROUPS",
                           default_groups=("basic", "zero", "lora", "checkpoint"), groups_without_variables=None,
                           input_variables=("LLAMA3_INPUT_BIN", "LLAMA3_LLMC_FILEPATH"),
                           flag_defaults={**EXAMPLE_FLAG_DEFAULTS, "learning_rate": 1e-5,
                                          "lora_target_modules": "c_attn,c_proj,c_fc,c_fc2"}))
