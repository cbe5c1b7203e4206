"""Shared fixtures. GPU tests are marked `gpu` and skipped where CUDA is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
TINY_SHAKESPEARE_TXT = SHARED_DATA / "tinyshakespeare" / "input.txt"
ENCODER_JSON = SHARED_DATA / "gpt2-tokenizer" / "encoder.json"


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_text() -> Path:
    if not TINY_SHAKESPEARE_TXT.is_file():
        pytest.skip(f"{TINY_SHAKESPEARE_TXT} is not present")
    return TINY_SHAKESPEARE_TXT
