"""Tiny random Hugging Face models, built and saved locally with transformers (no download), for
the conversion tests. Callers skip without transformers (pytest.importorskip) before using these.

Each is seeded, FP32, with eager attention (the softmax lockstep's reference also computes
plainly), and keeps what the LLMC format needs: GPT-2's head count divides its width, Llama 3's
and Qwen3's head_dim is C/NH.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SEED = 1234


def build(kind: str, **overrides):
    """A random `transformers` causal LM: kind gpt2 | llama3 | qwen3; `overrides` go to its config."""
    import torch
    import transformers

    if kind == "gpt2":
        fields = dict(vocab_size=300, n_positions=64, n_embd=48, n_layer=2, n_head=12, bos_token_id=0, eos_token_id=0)
        config_type, model_type = transformers.GPT2Config, transformers.GPT2LMHeadModel
    elif kind == "llama3":
        fields = dict(vocab_size=256, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, rope_theta=500000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
        config_type, model_type = transformers.LlamaConfig, transformers.LlamaForCausalLM
    elif kind == "qwen3":
        fields = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rope_theta=1000000.0,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
        config_type, model_type = transformers.Qwen3Config, transformers.Qwen3ForCausalLM
    else:
        raise ValueError(kind)
    config = config_type(**(fields | overrides))
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    return model_type(config).eval()


def save(model, directory: Path, **kwargs) -> Path:
    """save_pretrained quietly (no progress bars in the test log)."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(directory, **kwargs)
    return directory


def hf_logits(model, tokens) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(tokens)).logits.float().numpy()


def token_batch(vocab_size: int, batch: int = 2, seq_len: int = 24) -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, vocab_size, size=(batch, seq_len), dtype=np.int64)
