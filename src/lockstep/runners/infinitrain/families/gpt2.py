"""InfiniTrain's `gpt2` example for the GPT-2 family."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep.cases.spec import CaseSpec
from lockstep.runners.infinitrain.families import EXAMPLE_FLAG_DEFAULTS, InfiniTrainFamily, TestConfigExample, header_word, rename, unrename

# Its GPT-2 LLMC loader never sets n_kv_head, which keeps the default 12, and then checks
# n_kv_head == n_head; it CHECKs version 3 (FP32 tensors) and rejects bf16 files (version 5).
GPT2_LOADER_HEADS = 12
GPT2_LOADER_VERSION = 3

_GPT2_LAYER = {"ln_1.weight": "ln1w", "ln_1.bias": "ln1b", "attn.c_attn.weight": "qkvw", "attn.c_attn.bias": "qkvb",
               "attn.c_proj.weight": "attprojw", "attn.c_proj.bias": "attprojb", "ln_2.weight": "ln2w",
               "ln_2.bias": "ln2b", "mlp.c_fc.weight": "fcw", "mlp.c_fc.bias": "fcb", "mlp.c_proj.weight": "fcprojw",
               "mlp.c_proj.bias": "fcprojb"}
_GPT2_TOP = {"transformer.wte.weight": "wte", "transformer.wpe.weight": "wpe", "transformer.ln_f.weight": "lnfw",
             "transformer.ln_f.bias": "lnfb"}


@dataclass(frozen=True)
class GPT2Family(InfiniTrainFamily):
    def canonical_state(self, state: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
        """wte's V rows padded to Vp with zeros; `lm_head.weight` (a separate copy when a build loses
        the tie) is not a canonical tensor and is left out."""
        out = rename(state, _GPT2_LAYER, _GPT2_TOP)
        if "wte" in out and out["wte"].shape[0] < config.padded_vocab_size:
            padded = np.zeros((config.padded_vocab_size, out["wte"].shape[1]), dtype=np.float32)
            padded[: out["wte"].shape[0]] = out["wte"]
            out["wte"] = padded
        return out

    def native_state(self, canonical: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
        """wte's first V rows (its model has V, llm.c's file Vp), lm_head.weight the same values (its
        "tie" is a copy at construction, transformer.cc:250-262, and the state dict names both), and
        each layer's causal-mask buffer `attn.bias` (causal_self_attention.cc:46-50: ones on and
        below the diagonal, 1x1xTxT for T = the model's block size)."""
        out = unrename(canonical, _GPT2_LAYER, _GPT2_TOP)
        wte = np.ascontiguousarray(out["transformer.wte.weight"][: config.vocab_size], dtype=np.float32)
        out["transformer.wte.weight"] = wte
        out["lm_head.weight"] = wte
        T = config.max_seq_len
        mask = np.tril(np.ones((T, T), dtype=np.float32)).reshape(1, 1, T, T)
        for layer in range(config.num_layers):
            out[f"transformer.h.{layer}.attn.bias"] = mask
        return out

    def skip_reason(self, case: CaseSpec, model, checkpoint: Path) -> str | None:
        if model.num_heads != GPT2_LOADER_HEADS:
            return (f"InfiniTrain's GPT-2 LLMC loader accepts only {GPT2_LOADER_HEADS} heads, "
                    f"the model has {model.num_heads}")
        version = header_word(checkpoint, 1)
        if version is not None and version != GPT2_LOADER_VERSION:
            return (f"InfiniTrain's GPT-2 LLMC loader reads only version {GPT2_LOADER_VERSION} (FP32) checkpoints, "
                    f"{checkpoint} is version {version}")
        return None


# example/gpt2/config.h GPT2Config(): GPT-2 124M, with llm.c's padded vocabulary.
ADAPTER = GPT2Family("gpt2", "gpt2", resume_shape=(("n_layer", 12), ("n_head", 12), ("n_kv_head", 12),
                                                   ("n_embd", 768), ("vocab_size", 50304)),
                     test_config=TestConfigExample(
                         order=0, log_prefix="gpt2", default_shape="gpt2", groups_variable="GPT2_TEST_GROUPS",
                         default_groups=("basic", "zero", "lora", "checkpoint"), groups_without_variables=None,
                         input_variables=("GPT2_INPUT_BIN", "GPT2_LLMC_FILEPATH"),
                         flag_defaults={**EXAMPLE_FLAG_DEFAULTS, "learning_rate": 1e-4,
                                        "lora_target_modules": "c_attn,c_proj"}))
