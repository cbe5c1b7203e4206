"""lockstep's harness overhead: `lockstep run` against bare loops on the same cases.

    python benchmarks/harness_overhead.py --out docs/results/DATE-overhead [--matrix gpt2]
        [--cases gpt2_1,gpt2_1_bfloat16,gpt2_2,gpt2_2_bfloat16] [--model gpt2] [--device cuda]
        [--frameworks pytorch,megatron] [--steps 10] [-- EXTRA lockstep run ARGS]

1. Runs `python -m lockstep run` (wall time recorded) into OUT/lockstep.
2. For every single-device case and framework it ran, runs `benchmarks/bare_loops.py` on the
   same checkpoint and token file (read from OUT/lockstep/run.json): torch for pytorch; for
   megatron both `no-norm` (the same optimizer step as lockstep: the ratio's denominator) and
   `plain` (Megatron-LM's optimizer.step() with its gradient norm, for information).
3. Prints and writes OUT/harness_overhead.md and .json: per case, lockstep's median tok/s
   (steps 2..N, compare/throughput.py) ÷ the bare loop's median, with date, commit and machine.
   Goal (issue 13): >= 0.97 on every single-GPU case.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, text=True, **kw)


def machine() -> dict:
    import torch

    info = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"}
    try:
        import megatron.core

        info["megatron_core"] = megatron.core.__version__
    except ImportError:
        pass
    return info


def commit() -> str:
    if os.environ.get("LOCKSTEP_COMMIT"):
        return os.environ["LOCKSTEP_COMMIT"]
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def bare(framework: str, case: str, matrix: str, manifest: dict, device: str, steps: int | None,
         megatron_step: str | None = None) -> dict | None:
    model = next((m for m in manifest["models"] if m["name"] == case_model(manifest, case)), manifest["model"])
    cmd = [sys.executable, str(HERE / "bare_loops.py"), framework, "--matrix", matrix, "--case", case,
           "--checkpoint", model["checkpoint"], "--tokens", model["data"], "--device", device]
    if steps:
        cmd += ["--steps", str(steps)]
    if megatron_step:
        cmd += ["--megatron-step", megatron_step]
    out = sh(cmd, capture_output=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        print(f"bare {framework} {case} failed (rc {out.returncode}):\n{out.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1])


def case_model(manifest: dict, case: str) -> str:
    for c in manifest["cases"]:
        if c["name"] == case:
            return c.get("model", "")
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="lockstep run ÷ bare loops, per case")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--matrix", default="gpt2")
    p.add_argument("--cases", default="gpt2_1,gpt2_1_bfloat16,gpt2_2,gpt2_2_bfloat16")
    p.add_argument("--model")
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--frameworks", default="pytorch,megatron")
    p.add_argument("--steps", type=int)
    p.add_argument("extra", nargs="*", help="more `lockstep run` arguments (after --)")
    args = p.parse_args(argv)

    import torch

    from lockstep.compare.throughput import throughput_of
    from lockstep.formats.run_record import read_run_record

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    run_dir = args.out / "lockstep"
    cmd = [sys.executable, "-m", "lockstep", "run", "--matrix", args.matrix, "--cases", args.cases,
           "--frameworks", args.frameworks, "--device", device, "--out", str(run_dir), "--no-report"]
    cmd += (["--model", args.model] if args.model else []) + (["--steps", str(args.steps)] if args.steps else [])
    cmd += args.extra
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    rc = sh(cmd).returncode
    wall_s = time.monotonic() - t0
    manifest = json.loads((run_dir / "run.json").read_text())
    header = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "commit": commit(),
              "machine": machine(), "lockstep_run_command": cmd, "lockstep_run_rc": rc,
              "lockstep_run_wall_s": round(wall_s, 1)}
    rows = []
    for case in manifest["cases"]:
        if case.get("dp", 1) * case.get("tp", 1) * case.get("pp", 1) != 1:
            continue
        for fw in manifest["frameworks"]:
            path = run_dir / fw / f"{case['name']}.jsonl"
            if not path.is_file():
                continue
            rec = read_run_record(path)
            tp = throughput_of(rec) if rec.ok else None
            ours = tp.tokens_per_s.median if tp and tp.tokens_per_s else None
            variants = {"pytorch": [("torch", None)], "megatron": [("megatron", "no-norm"), ("megatron", "plain")]}
            for bare_fw, step_kind in variants.get(fw, []):
                b = bare(bare_fw, case["name"], args.matrix, manifest, device, args.steps, step_kind)
                theirs = b["median_tokens_per_s"] if b else None
                rows.append({"case": case["name"], "framework": fw, "bare": b["framework"] if b else bare_fw,
                             "lockstep_tokens_per_s": ours, "lockstep_cv": tp.tokens_per_s.cv if ours else None,
                             "bare_tokens_per_s": theirs,
                             "ratio": ours / theirs if ours and theirs else None})
    lines = [f"# lockstep ÷ bare loop ({header['date']}, commit {header['commit']})", "",
             f"Machine: {json.dumps(header['machine'])}", "",
             f"`lockstep run` wall time: {header['lockstep_run_wall_s']} s (rc {rc}) for "
             f"{len(manifest['cases'])} case(s) × {len(manifest['frameworks'])} framework(s).", "",
             "| case | framework | bare loop | lockstep tok/s (median ±CV) | bare tok/s (median) | lockstep ÷ bare |",
             "|---|---|---|---:|---:|---:|"]
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for r in rows:
        lines.append(f"| {r['case']} | {r['framework']} | {r['bare']} | {fmt(r['lockstep_tokens_per_s'], ',.0f')} "
                     f"±{fmt(r['lockstep_cv'], '.0%')} | {fmt(r['bare_tokens_per_s'], ',.0f')} | {fmt(r['ratio'], '.3f')} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out / "harness_overhead.md").write_text(text)
    (args.out / "harness_overhead.json").write_text(json.dumps({**header, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
