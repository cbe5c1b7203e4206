"""Shared fixtures. GPU tests are marked `gpu` and skipped where CUDA is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# LOCKSTEP_TEST_TEXT names the text where ../shared is absent (e.g. a tree copied to a GPU machine).
TINY_SHAKESPEARE_TXT = Path(os.environ.get("LOCKSTEP_TEST_TEXT") or SHARED_DATA / "tinyshakespeare" / "input.txt")
ENCODER_JSON = SHARED_DATA / "gpt2-tokenizer" / "encoder.json"


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def private_history(tmp_path, monkeypatch):
    """Every `lockstep run` / `compare` appends to the run history: in tests, to a file of the
    test's own, never to the user's data dir."""
    monkeypatch.setenv("LOCKSTEP_HISTORY", str(tmp_path / "history.sqlite"))
    return tmp_path / "history.sqlite"


@pytest.fixture(scope="session")
def shared_text() -> Path:
    if not TINY_SHAKESPEARE_TXT.is_file():
        pytest.skip(f"{TINY_SHAKESPEARE_TXT} is not present")
    return TINY_SHAKESPEARE_TXT


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """gpt2-tiny (L2 NH12 C96) with llm.c's init, seed 42."""
    from lockstep.models import FAMILIES, SHAPES
    from lockstep.models.init import write_initial_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / "gpt2_tiny_seed42.bin"
    write_initial_checkpoint(path, FAMILIES["gpt2"], SHAPES["gpt2-tiny"].config, seed=42)
    return path


@pytest.fixture(scope="session")
def tiny_shakespeare_train(tmp_path_factory, shared_text) -> Path:
    """llm.c's tiny_shakespeare_train.bin, made from ../shared/data's text."""
    from lockstep.data.prepare import prepare_dataset

    prepared = prepare_dataset(tmp_path_factory.mktemp("data"), text_path=shared_text)
    return prepared.train_path
