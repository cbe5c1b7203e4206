"""Model shapes (configs.py), the reference GPT-2 (gpt2.py) and llm.c's init (init.py)."""
