"""Data tests never touch the network or the user's cache: every test gets an empty cache
root and LOCKSTEP_OFFLINE=1, and urlopen fails loudly if anything still tries to download."""

from __future__ import annotations

import urllib.request

import pytest


@pytest.fixture(autouse=True)
def isolated_data_env(tmp_path, monkeypatch):
    cache = tmp_path / "lockstep-cache"
    monkeypatch.setenv("LOCKSTEP_CACHE", str(cache))
    monkeypatch.setenv("LOCKSTEP_OFFLINE", "1")

    def no_network(*args, **kwargs):
        raise AssertionError("a data test tried to use the network")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    return cache
