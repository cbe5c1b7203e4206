"""The weights a run starts from: lockstep's cached llm.c init of a shape and seed (written once,
by one process, never torn) and each checkpoint's sha256 (kept beside lockstep's own inits)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

from lockstep.errors import LockstepError
from lockstep.fsutil import atomic_write, sha256_file, write_once

_digests: dict[Path, str] = {}


def checkpoint_digest(path: Path, cache: Path | None = None) -> str:
    """sha256 of a checkpoint, once per process (a 1B-parameter file takes seconds). One in
    lockstep's own `cache` (its seeded inits) keeps its digest beside it (`<file>.sha256.json`,
    with the size and modification time it was taken at) and is hashed again only when those change."""
    if path not in _digests:
        _digests[path] = _cached_digest(path) if cache is not None and _inside(path, cache) else sha256_file(path)
    return _digests[path]


def _inside(path: Path, directory: Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path(directory).resolve())
    except ValueError:
        return False
    return True


def _cached_digest(path: Path) -> str:
    side = Path(f"{path}.sha256.json")
    st = os.stat(path)
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        kept = json.loads(side.read_text())
        if {k: kept.get(k) for k in stamp} == stamp and isinstance(kept.get("sha256"), str):
            return kept["sha256"]
    except (OSError, ValueError):
        pass
    digest = sha256_file(path)
    try:
        with atomic_write(side, "w", what="checkpoint digest") as f:
            json.dump({**stamp, "sha256": digest}, f)
    except LockstepError:
        pass  # a cache that cannot take it: hashed again next time
    return digest



def ensure_initial_checkpoint(cache: Path, model_name: str, fam, config, seed: int,
                              on_wait: Callable[[Path], None] | None = None) -> Path:
    """The cached llm.c init of a shape and seed, written once. Several lockstep processes may
    need it at once (CI jobs sharing a cache): one writes it (aside, then renamed) while the
    others wait on its lock file, then reuse it unwritten; none ever sees a torn file."""
    from lockstep.models.init import INIT_SCHEME, write_initial_checkpoint

    path = cache / "checkpoints" / f"{model_name}_llmc_init_seed{seed}_{INIT_SCHEME}.bin"

    def is_complete(p: Path) -> bool:
        if not p.is_file():
            return False
        try:
            return fam.read_layout(p).config == config
        except LockstepError:
            return False  # a damaged cache entry (e.g. left by an older lockstep) is rewritten

    what = f"llm.c init of {model_name} (seed {seed})"
    write_once(path, is_complete, lambda p: write_initial_checkpoint(p, fam, config, seed, what=what),
               on_wait=lambda: (on_wait or say_waiting)(path))
    return path


def say_waiting(path: Path) -> None:
    """Said at once (not among the plan's notes): a wait of minutes must not look like a hang."""
    print(f"waiting for another lockstep writing {path}", file=sys.stderr, flush=True)


