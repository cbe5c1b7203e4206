"""The cost of a verdict (issue 23): `lockstep run`'s main job with and without the step-1
certificate, and `lockstep diagnose` of one case, each timed from start to exit with its peak
memory (RSS of lockstep and every process it started) and peak scratch on disk (the out dir,
sampled every 0.2 s).

    python benchmarks/verdict_cost.py --out docs/results/DATE-cost main [-- EXTRA lockstep run ARGS]
    python benchmarks/verdict_cost.py --out OUT diagnose --case llama3_2 --frameworks pytorch,infinitrain \\
        [-- EXTRA lockstep diagnose ARGS]

`main` runs `lockstep run` twice (certificates on, then --no-certify) into OUT/main and
OUT/main-no-certify and reads run.json's "timing" (where the time went: stages, and per
framework and case start-up / weights / data / training / teardown). `diagnose` runs it once into
OUT/diagnose-CASE. Each writes OUT/<name>.json and appends a line to OUT/verdict_cost.md, with
date, commit and machine. Goals: the GPU main job <= 20 s on one H200 with the certificate adding
<= 10%; a diagnose of Llama 3.2 1B in <= 90 s with scratch <= 2x its FP32 weights.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness_overhead import commit, machine  # noqa: E402  (one way to name the commit and machine)


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def tree_rss(pid: int) -> int:
    """RSS of a process and all its descendants (bytes), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass
    return total


def measured(cmd: list[str], out_dir: Path, log: Path) -> dict:
    print("+", " ".join(cmd), flush=True)
    peak = {"scratch": 0, "rss": 0}
    start = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak["scratch"] = max(peak["scratch"], tree_bytes(out_dir) if out_dir.exists() else 0)
                peak["rss"] = max(peak["rss"], tree_rss(proc.pid))
                done.wait(0.2)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        rc = proc.wait()
        done.set()
        t.join()
    return {"command": " ".join(cmd), "exit": rc, "wall_s": round(time.monotonic() - start, 2),
            "peak_rss_gb": round(peak["rss"] / 1e9, 2), "peak_scratch_gb": round(peak["scratch"] / 1e9, 2),
            "output": str(log)}


def main_job(out: Path, extra: list[str]) -> dict:
    results = {}
    for name, args in (("main", []), ("main-no-certify", ["--no-certify"])):
        run_dir = out / name
        res = measured([sys.executable, "-m", "lockstep", "run", "--out", str(run_dir), "--no-history", "--force",
                        *args, *extra], run_dir, out / f"{name}.stdout.txt")
        try:
            res["timing"] = json.loads((run_dir / "run.json").read_text()).get("timing")
        except (OSError, ValueError):
            res["timing"] = None
        results[name] = res
    a, b = results["main"]["wall_s"], results["main-no-certify"]["wall_s"]
    results["certificate_overhead"] = round(a / b - 1, 3) if b else None
    return results


def diagnose(out: Path, case: str, frameworks: str, extra: list[str]) -> dict:
    run_dir = out / f"diagnose-{case}"
    # A fresh out dir: a diagnose into one that holds an earlier diagnose's captures keeps them
    # until it replaces them (measured on an H200: 10.3 GB instead of 8.2 GB for Llama 3.2 1B).
    shutil.rmtree(run_dir, ignore_errors=True)
    res = measured([sys.executable, "-m", "lockstep", "diagnose", "--case", case, "--frameworks", frameworks,
                    "--out", str(run_dir), *extra], run_dir, out / f"diagnose-{case}.stdout.txt")
    res["note"] = "scratch = the out dir (captures, InfiniTrain's save and dumps), not the cached weights"
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("what", choices=["main", "diagnose"])
    p.add_argument("--case", default="gpt2_1")
    p.add_argument("--frameworks", default="pytorch,megatron")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit(), "machine": machine()}
    if args.what == "main":
        result = {**stamp, **main_job(args.out, extra)}
        line = (f"- {stamp['date']} {stamp['commit']} main job: {result['main']['wall_s']} s with certificates, "
                f"{result['main-no-certify']['wall_s']} s without ({result['certificate_overhead']:+.1%}); peak RSS "
                f"{result['main']['peak_rss_gb']} GB; exit {result['main']['exit']}")
        name = "main"
    else:
        result = {**stamp, **diagnose(args.out, args.case, args.frameworks, extra)}
        line = (f"- {stamp['date']} {stamp['commit']} diagnose {args.case} ({args.frameworks}): {result['wall_s']} s, "
                f"peak RSS {result['peak_rss_gb']} GB, peak scratch {result['peak_scratch_gb']} GB; exit {result['exit']}")
        name = f"diagnose-{args.case}"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    with open(args.out / "verdict_cost.md", "a") as f:
        m = stamp["machine"]
        f.write(line + f" ({m.get('device')}, torch {m.get('torch')}, megatron-core {m.get('megatron_core', '-')})\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
