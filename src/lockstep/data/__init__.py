"""Data: the tokenizers (GPT-2, Llama 3, Qwen3), the text corpora, `prepare` (llm.c's token
files) and the contract's batch order (loader.py)."""
