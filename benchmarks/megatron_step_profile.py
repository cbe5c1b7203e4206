"""What one megatron-core training step costs the host: kernels, device-to-host copies and
synchronizations per step (torch.profiler), and the host's time to issue a step.

    python benchmarks/megatron_step_profile.py --case gpt2_1 --checkpoint CKPT --tokens TOKENS \
        [--device cuda] [--megatron-step both|plain|no-norm] [--steps 12] [--profile-steps 4] [--json OUT]

`plain` is megatron-core's optimizer.step() (what lockstep ran before issue 13: it computes the
gradient norm, an all-reduce and a .item(), even with clip_grad 0); `no-norm` is what lockstep
runs now (prepare_grads + step_with_ready_grads). `both` runs each in its own process and
prints them side by side. The loop is benchmarks/bare_loops.py's megatron loop (the same
model, data, loss and optimizer as lockstep's megatron runner).

Per step: `issue ms` = host time from the step's start until the last call returns (before the
closing synchronize; when it is close to `step ms`, the step is CPU-bound), `step ms` = the
step as docs/reference/training-contract.md#timing times it; from the profiled steps: CUDA kernels,
Memcpy DtoH / HtoD, and the host's
cudaStreamSynchronize / cudaDeviceSynchronize / cudaEventSynchronize calls (the closing
synchronize of the timing itself is one cudaDeviceSynchronize per step). On a CPU the counts
of CUDA events are 0 and only the timings mean something.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def count_events(prof) -> Counter:
    from torch.autograd import DeviceType

    counts: Counter = Counter()
    for evt in prof.events():
        name = evt.name
        on_device = getattr(evt, "device_type", None) == DeviceType.CUDA
        if on_device:
            if name.startswith("Memcpy DtoH"):
                counts["memcpy_dtoh"] += 1
            elif name.startswith("Memcpy HtoD"):
                counts["memcpy_htod"] += 1
            elif name.startswith("Memcpy") or name.startswith("Memset"):
                counts["memcpy_memset_other"] += 1
            else:
                counts["kernels"] += 1
        elif name.startswith("aten::"):
            counts["aten_ops"] += 1  # every dispatched op, nested ones included (a launch proxy on CPU)
        elif name in SYNC_CALLS:
            counts["syncs"] += 1
            counts[name] += 1
        elif name in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync"):
            counts[name] += 1
    return counts


def profile_one(args) -> dict:
    import torch

    from bare_loops import ieee_fp32, megatron_step_fn, synchronize
    from lockstep.cases.matrix import load_matrix, select_cases
    from lockstep.cases.spec import CaseSpec

    case = select_cases(load_matrix(args.matrix), [args.case])[0]
    total = args.steps + args.profile_steps
    case = CaseSpec.from_dict({**case.to_dict(), "steps": total})
    ieee_fp32()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    step = megatron_step_fn(case, args.checkpoint, args.tokens, device, args.megatron_step)
    issue_ms, step_ms = [], []
    for i in range(args.steps):
        synchronize(device)
        t0 = time.perf_counter()
        step(i)
        t1 = time.perf_counter()
        synchronize(device)
        t2 = time.perf_counter()
        issue_ms.append((t1 - t0) * 1e3)
        step_ms.append((t2 - t0) * 1e3)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(args.steps, total):
            synchronize(device)
            step(i)
            synchronize(device)
    counts = count_events(prof)
    per_step = {k: v / args.profile_steps for k, v in sorted(counts.items())}
    measured = slice(1, None) if len(step_ms) > 1 else slice(None)
    from lockstep.runners.megatron.parallel import shutdown

    shutdown()
    return {"megatron_step": args.megatron_step, "case": case.name, "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "issue_ms_median": statistics.median(issue_ms[measured]), "step_ms_median": statistics.median(step_ms[measured]),
            "timed_steps": args.steps, "profiled_steps": args.profile_steps, "per_step": per_step}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matrix", default="gpt2")
    p.add_argument("--case", default="gpt2_1")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--megatron-step", choices=["both", "plain", "no-norm"], default="both")
    p.add_argument("--steps", type=int, default=12, help="timed steps before profiling (the first is warm-up)")
    p.add_argument("--profile-steps", type=int, default=4)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.megatron_step != "both":
        print(json.dumps(profile_one(args)))
        return 0
    results = []
    for kind in ("plain", "no-norm"):
        cmd = [sys.executable, __file__, "--matrix", args.matrix, "--case", args.case, "--checkpoint", args.checkpoint,
               "--tokens", args.tokens, "--device", args.device, "--megatron-step", kind, "--steps", str(args.steps),
               "--profile-steps", str(args.profile_steps)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode != 0 or not lines:
            print(f"{kind} failed (rc {out.returncode}):\n{out.stderr[-3000:]}", file=sys.stderr)
            return 1
        results.append(json.loads(lines[-1]))
    keys = ["aten_ops", "kernels", "memcpy_dtoh", "memcpy_htod", "syncs", *SYNC_CALLS, "cudaMemcpyAsync", "cudaLaunchKernel"]
    print(f"megatron-core step of {args.case} on {results[0]['device_name']}: per step")
    print(f"{'':28s}" + "".join(f"{r['megatron_step']:>12s}" for r in results))
    print(f"{'issue ms (median)':28s}" + "".join(f"{r['issue_ms_median']:12.2f}" for r in results))
    print(f"{'step ms (median)':28s}" + "".join(f"{r['step_ms_median']:12.2f}" for r in results))
    for k in keys:
        print(f"{k:28s}" + "".join(f"{r['per_step'].get(k, 0):12.1f}" for r in results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
