"""Fixtures for diagnose tests: gpt2-tiny's llm.c init in memory, and a token stream made here."""

from __future__ import annotations

import numpy as np
import pytest

from lockstep.cases.spec import CaseSpec


@pytest.fixture(scope="session")
def gpt2_tiny():
    from lockstep.models import FAMILIES, SHAPES
    from lockstep.models.init import init_tensors

    config = SHAPES["gpt2-tiny"].config
    return config, init_tensors(config, FAMILIES["gpt2"].init_rule(config), seed=42)


@pytest.fixture(scope="session")
def token_ids() -> np.ndarray:
    """Tokens whose statistics are not uniform (a repeated phrase with noise), GPT-2 vocabulary."""
    rng = np.random.default_rng(0)
    phrase = rng.integers(0, 50257, size=97)
    tokens = np.tile(phrase, 40)
    noise = rng.random(tokens.shape) < 0.3
    tokens[noise] = rng.integers(0, 50257, size=int(noise.sum()))
    return tokens.astype(np.uint16)


def make_gpt2_case(**kw) -> CaseSpec:
    spec = dict(name="gpt2_1", model="gpt2-tiny", dtype="float32", micro_batch=4, seq_len=64, total_batch=256, steps=1,
                lr=1e-4)
    spec.update(kw)
    return CaseSpec(**spec)


@pytest.fixture(scope="session")
def gpt2_case():
    """gpt2_1's shape (B=4, T=64, 256 tokens/step), one step; keyword overrides."""
    return make_gpt2_case
