"""Data: the GPT-2 tokenizer, the text corpora, `prepare` (llm.c's token files) and the
contract's batch order (loader.py)."""
