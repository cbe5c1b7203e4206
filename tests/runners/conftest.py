"""Fixtures of the runner tests beyond tests/conftest.py's gpt2-tiny ones."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def llama3_tiny_checkpoint(tmp_path_factory) -> Path:
    """llama3-tiny (L4 NH8 kv4 C128, the real 128,256-token vocabulary) with llm.c's init, seed 42.
    Its contract optimizer is Adam. GPT-2's token ids are valid Llama 3 ids, so the gpt2-tiny
    token file serves both in tests that compare two runs on the same tokens."""
    from lockstep.models import FAMILIES, SHAPES
    from lockstep.models.init import write_initial_checkpoint

    path = tmp_path_factory.mktemp("llama3") / "llama3_tiny_seed42.bin"
    write_initial_checkpoint(path, FAMILIES["llama3"], SHAPES["llama3-tiny"].config, seed=42)
    return path
