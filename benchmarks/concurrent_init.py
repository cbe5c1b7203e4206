"""Two `lockstep run`s that need the same cached llm.c init at the same moment (CI jobs sharing a
cache): one must write it, the other wait and reuse it, and neither may ever see a torn file.

    python benchmarks/concurrent_init.py                       # Llama 3.2 1B shape (llama3): ~5 GB
    python benchmarks/concurrent_init.py --model gpt2-tiny     # seconds, for a quick look
    python benchmarks/concurrent_init.py --cache DIR --keep    # keep the written checkpoint

Starts two processes at once, each calling lockstep's own `ensure_initial_checkpoint` (what
`lockstep run` calls while planning) on a fresh cache directory, and prints one JSON object:
the date, lockstep's commit, the machine, and per process its wall time, whether it waited on
the other, how many times it wrote the file, the inode it got back and the file's sha256 as it
read it. A pass: exactly one process wrote, both got the same inode and sha256, the file has the
layout's size, and nothing else (no temporary) is left beside it but the lock file.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(cache: Path, model: str, seed: int) -> dict:
    """One process's planning step, as far as the init goes."""
    import lockstep.models.init as init
    from lockstep.models import family, model_shape
    from lockstep.initial_weights import ensure_initial_checkpoint, say_waiting

    writes, waited_at = [], []
    real = init.write_initial_checkpoint

    def counting(*args, **kwargs):
        writes.append(time.time())
        real(*args, **kwargs)

    def on_wait(path: Path) -> None:
        waited_at.append(time.time())
        say_waiting(path)

    init.write_initial_checkpoint = counting
    shape = model_shape(model)
    start = time.time()
    path = ensure_initial_checkpoint(cache, model, family(shape.family), shape.config, seed, on_wait=on_wait)
    ready = time.time()
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return {"pid": os.getpid(), "started": start, "ready_s": round(ready - start, 2), "waited": bool(waited_at),
            "writes": len(writes), "inode": os.stat(path).st_ino, "size": os.stat(path).st_size,
            "sha256": digest.hexdigest(), "path": str(path)}


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict:
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {"host": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "memory_gb": round(mem / 1e9, 1) if mem else None, "python": platform.python_version()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama3", help="registered model shape (default llama3: the 1B shape, ~5 GB)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--cache", type=Path, help="cache directory to use (default: a fresh temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the cache directory afterwards")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.cache, args.model, args.seed)))
        return 0

    commit = git_commit()  # of the code the two processes run, taken before they start
    cache = args.cache or Path(tempfile.mkdtemp(prefix="lockstep-concurrent-init-"))
    from lockstep.models import family, model_shape

    shape = model_shape(args.model)
    expected_size = family(shape.family).layout(shape.config).file_size
    cmd = [sys.executable, __file__, "--child", "--cache", str(cache), "--model", args.model, "--seed", str(args.seed)]
    started = time.time()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results, stderr = [], []
    for proc in procs:
        out, err = proc.communicate()
        stderr.append(err.strip())
        if proc.returncode != 0:
            print(err, file=sys.stderr)
            return 1
        results.append(json.loads(out.strip().splitlines()[-1]))
    wall = time.time() - started
    path = Path(results[0]["path"])
    beside = sorted(q.name for q in path.parent.iterdir())
    for r in results:
        r["started_after_s"] = round(r.pop("started") - started, 2)
    report = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "lockstep_commit": commit, "machine": machine(), "model": args.model, "seed": args.seed,
        "file": str(path), "expected_size": expected_size, "wall_s": round(wall, 2), "processes": results,
        "stderr": stderr, "files_beside": beside,
        "one_writer": sorted(r["writes"] for r in results) == [0, 1],
        "same_inode": len({r["inode"] for r in results}) == 1,
        "same_sha256": len({r["sha256"] for r in results}) == 1,
        "whole": all(r["size"] == expected_size for r in results),
        "no_temporary": beside == sorted([path.name, f".{path.name}.lock"]),
    }
    report["passed"] = all(report[k] for k in ("one_writer", "same_inode", "same_sha256", "whole", "no_temporary"))
    print(json.dumps(report, indent=2))
    if not args.keep and args.cache is None:
        path.unlink(missing_ok=True)
        (path.parent / f".{path.name}.lock").unlink(missing_ok=True)
        path.parent.rmdir()
        cache.rmdir()
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
