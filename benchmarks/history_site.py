"""Build time of `lockstep history site` for histories of 1,000 and 10,000 runs.

The histories are made as the tests make theirs (tests/history/history_runs.py: real H200
records compared by the real comparison code, varied commits, machines and versions). For each
size: the first build into an empty directory, a rebuild with nothing new (no page written),
and a rebuild after one more run (only the pages that run is on). Prints one line per figure.

    PYTHONPATH=src python benchmarks/history_site.py [N ...]
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "history"))

from history_runs import many_runs  # noqa: E402

from lockstep.history import HistoryStore  # noqa: E402
from lockstep.history.site import build_site  # noqa: E402


def bench(n: int, work: Path) -> None:
    runs = many_runs(n + 1, work / "runs")
    store = HistoryStore(work / "history.sqlite")
    t = time.perf_counter()
    store.append_many(runs[:n])
    appended = time.perf_counter() - t
    site = work / "site"

    def timed():
        cpu = time.process_time()
        built = build_site(store, site)
        return built, time.process_time() - cpu

    first, first_cpu = timed()
    again, again_cpu = timed()
    store.append(runs[n])
    one_more, one_more_cpu = timed()
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    print(f"{n} runs: history written in {appended:.1f} s; site {first.pages} pages, {size / 2**20:.1f} MiB")
    # Wall time, and this process's CPU time (what a loaded machine inflates less).
    print(f"  first build      {first.seconds:6.2f} s wall, {first_cpu:6.2f} s CPU  ({first.written} pages written)")
    print(f"  rebuild, no new  {again.seconds:6.2f} s wall, {again_cpu:6.2f} s CPU  ({again.written} written)")
    print(f"  rebuild, +1 run  {one_more.seconds:6.2f} s wall, {one_more_cpu:6.2f} s CPU  ({one_more.written} written)")


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1000, 10000]
    print(f"python {platform.python_version()} on {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    for n in sizes:
        with tempfile.TemporaryDirectory() as d:
            bench(n, Path(d))


if __name__ == "__main__":
    main()
