"""A randomly initialised Hugging Face GPT-2 of the real 124M config, saved locally (no download):
the stand-in for openai-community/gpt2, whose pretrained weights were not available here.
Run in an empty folder: writes hf_gpt2_124m_random/ (config.json, model.safetensors, 498 MB)."""

import time

import torch
import transformers

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
t = time.perf_counter()
cfg = transformers.GPT2Config()  # n_positions 1024, n_embd 768, n_layer 12, n_head 12, vocab 50257, tied
model = transformers.GPT2LMHeadModel(cfg).eval()
model.save_pretrained("hf_gpt2_124m_random")
print("saved in", round(time.perf_counter() - t, 1), "s; params", sum(p.numel() for p in model.parameters()))
