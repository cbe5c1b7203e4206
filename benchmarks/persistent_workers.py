"""Wall time of `lockstep run` with persistent workers (the default) and with one process per case.

    python benchmarks/persistent_workers.py --out docs/results/DATE-workers [--matrix gpt2]
        [--order persistent-first|per-case-first] [-- EXTRA lockstep run ARGS]

Runs the same `python -m lockstep run --matrix M EXTRA` twice, into OUT/persistent and
OUT/per-case (`--no-persistent-workers`), timing each from start to exit. Then checks that both
runs' records hold bitwise the same losses, and prints and writes OUT/persistent_workers.md and
.json: wall time of each, the saving, per framework the summed run time of its cases (first
step start to record end), with date, commit and machine. Issue 13's goals: the GPU main job
(GPT-2 matrix on one H200) in <= 30 s, the CPU main job in <= 3 min on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness_overhead import commit, machine  # noqa: E402  (one way to name the commit and machine)

MODES = {"persistent": [], "per-case": ["--no-persistent-workers"]}


def timed_run(matrix: str, out: Path, extra: list[str], mode_args: list[str]) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "lockstep", "run", "--matrix", matrix, "--out", str(out), "--no-history", "--force",
           *mode_args, *extra]
    print("+", " ".join(cmd), flush=True)
    start = time.monotonic()
    with open(out.parent / f"{out.name}.stdout.txt", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    return time.monotonic() - start, rc


def records(out: Path) -> dict[tuple[str, str], dict]:
    """(framework, case) -> {"losses": [...], "status", "started_at", "finished_at"} of every record."""
    found = {}
    for path in sorted(out.glob("*/*.jsonl")):
        if path.parent.name == "repeats":
            continue
        lines = path.read_text().splitlines()
        meta = json.loads(lines[0])
        found[(path.parent.name, path.stem)] = {
            "status": meta.get("status"), "losses": [json.loads(ln)["loss"] for ln in lines[1:]],
            "seconds": (dt.datetime.fromisoformat(meta["finished_at"]) - dt.datetime.fromisoformat(
                meta["started_at"])).total_seconds() if meta.get("finished_at") else None}
    return found


def bits(losses: list[float]) -> list[bytes]:
    return [struct.pack("<d", x) for x in losses]


def main(argv: list[str]) -> int:
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    else:
        extra = []
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--matrix", default="gpt2")
    p.add_argument("--order", choices=["persistent-first", "per-case-first"], default="persistent-first",
                   help="which mode runs first (the first run also warms the file cache and the init checkpoint)")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")  # megatron-core's import warnings, when machine() reads its version
    args.out.mkdir(parents=True, exist_ok=True)
    order = list(MODES) if args.order == "persistent-first" else list(reversed(MODES))
    wall, rcs, recs = {}, {}, {}
    for mode in order:
        wall[mode], rcs[mode] = timed_run(args.matrix, args.out / mode, extra, MODES[mode])
        recs[mode] = records(args.out / mode)
    pairs = sorted(set(recs["persistent"]) | set(recs["per-case"]))
    equal = [pair for pair in pairs if pair in recs["persistent"] and pair in recs["per-case"]
             and bits(recs["persistent"][pair]["losses"]) == bits(recs["per-case"][pair]["losses"])
             and recs["persistent"][pair]["losses"]]
    frameworks = sorted({fw for fw, _ in pairs})
    per_fw = {mode: {fw: sum(r["seconds"] or 0 for (f, _), r in recs[mode].items() if f == fw) for fw in frameworks}
              for mode in MODES}
    result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "commit": commit(),
              "machine": machine(), "matrix": args.matrix, "extra_args": extra, "order": order,
              "wall_s": wall, "exit_codes": rcs, "saved_s": wall["per-case"] - wall["persistent"],
              "speedup": wall["per-case"] / wall["persistent"], "per_framework_record_s": per_fw,
              "pairs": [f"{fw}/{case}" for fw, case in pairs],
              "bitwise_equal_losses": [f"{fw}/{case}" for fw, case in equal]}
    m = result["machine"]
    lines = [f"# `lockstep run` with and without persistent workers ({args.matrix} matrix)", "",
             f"date {result['date']} | commit {result['commit']} | host {m['host']} ({m['cpu_count']} CPUs, "
             f"{m['device']}) | torch {m['torch']}" + (f" | megatron-core {m['megatron_core']}" if "megatron_core" in m
                                                        else ""),
             f"command: `lockstep run --matrix {args.matrix} {' '.join(extra)}` (run order: {', '.join(order)})", "",
             "| mode | wall time (s) | exit | " + " | ".join(f"{fw}: its records' start..end, summed (s)" for fw in frameworks) + " |",
             "| --- | ---: | ---: | " + " | ".join("---:" for _ in frameworks) + " |"]
    for mode in MODES:
        lines.append(f"| {mode} | {wall[mode]:.1f} | {rcs[mode]} | "
                     + " | ".join(f"{per_fw[mode][fw]:.0f}" for fw in frameworks) + " |")
    lines += ["", f"saved {result['saved_s']:.1f} s ({result['speedup']:.2f}x); losses bitwise equal in "
                  f"{len(equal)} of {len(pairs)} (framework, case) records"
              + ("" if len(equal) == len(pairs) else f" (differ or missing: "
                 f"{', '.join(p for p in result['pairs'] if p not in result['bitwise_equal_losses'])})")]
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out / "persistent_workers.md").write_text(text)
    (args.out / "persistent_workers.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(rc == 0 for rc in rcs.values()) and len(equal) == len(pairs) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
