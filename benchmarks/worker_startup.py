"""Where a worker group's start-up goes (issue 23): each piece a megatron-core worker pays before
its first case, timed on its own in a fresh process, and megatron's per-case model-parallel set-up
and release in one process.

    python benchmarks/worker_startup.py [--device cuda|cpu] [--out DIR]

Pieces (each a fresh `python3` run twice: the first with whatever page cache the machine has, the
second warm): the interpreter alone; `import torch`; torch plus the first CUDA tensor; lockstep's
megatron worker module plus every megatron-core module it uses; torchrun (standalone, one rank)
around an empty script; torch.distributed's process group of one rank (NCCL with its device bound,
as the worker starts it, and without). Then, in one process of one rank: megatron-core's
`initialize_model_parallel` and lockstep's `release_model_parallel`, three cases' worth.

Writes DIR/worker_startup.json and appends a table to DIR/worker_startup.md (date, commit, machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness_overhead import commit, machine  # noqa: E402

PIECES = {
    "interpreter": "pass",
    "import torch": "import torch",
    "torch + first CUDA tensor": "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
    "lockstep megatron worker + megatron-core imports":
        "import lockstep.runners.megatron.worker as w; w.import_megatron()",
}

PROCESS_GROUP = """
import os, sys, time, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
cuda = sys.argv[1] != "cpu"
t = time.perf_counter()
if cuda:
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    torch.zeros(1, device=dev)
t_cuda = time.perf_counter()
kw = {"device_id": dev} if sys.argv[1] == "cuda-bound" else {}
dist.init_process_group(backend="nccl" if cuda else "gloo", **kw)
t_init = time.perf_counter()
dist.barrier()
t_barrier = time.perf_counter()
print({"init_process_group": t_init - t_cuda, "first barrier": t_barrier - t_init})
os._exit(0)
"""

MODEL_PARALLEL = """
import os, sys, time, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
from lockstep.runners.megatron.worker import import_megatron
import_megatron()
from megatron.core import parallel_state
from lockstep.runners.megatron.parallel import release_model_parallel, start_process_group
device = "cuda" if sys.argv[1].startswith("cuda") else "cpu"
if sys.argv[1] == "cuda-lazy":  # no device bound: NCCL makes a group's communicator at its first collective
    torch.cuda.set_device(0)
    dist.init_process_group(backend="nccl")
else:
    start_process_group(device)  # as the worker starts it (CUDA: its device bound, communicators made eagerly)
out = []
for case in range(3):
    t0 = time.perf_counter()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    t1 = time.perf_counter()
    x = torch.ones(4, device="cuda" if device == "cuda" else "cpu")
    dist.all_reduce(x, group=parallel_state.get_data_parallel_group())
    if device == "cuda":
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    release_model_parallel()
    t3 = time.perf_counter()
    out.append({"initialize_model_parallel": t1 - t0, "first DP all-reduce": t2 - t1, "release": t3 - t2})
print(out)
os._exit(0)
"""


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    began = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    took = time.perf_counter() - began
    if proc.returncode != 0:
        return took, f"failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"
    return took, proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="benchmarks/out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONWARNINGS": "ignore", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    rows: dict[str, object] = {}
    for name, code in PIECES.items():
        if "cuda" in code and args.device != "cuda":
            continue
        first, _ = timed([sys.executable, "-c", code], env)
        second, _ = timed([sys.executable, "-c", code], env)
        rows[name] = {"first_s": round(first, 3), "warm_s": round(second, 3)}
        print(f"{name}: {first:.2f} s, then {second:.2f} s", flush=True)
    with tempfile.TemporaryDirectory() as td:
        noop = Path(td) / "noop.py"
        noop.write_text("pass\n")
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(noop)]
        first, _ = timed(torchrun, env)
        second, _ = timed(torchrun, env)
        rows["torchrun (1 rank) around an empty script"] = {"first_s": round(first, 3), "warm_s": round(second, 3)}
        print(f"torchrun: {first:.2f} s, then {second:.2f} s", flush=True)
        script = Path(td) / "pg.py"
        script.write_text(PROCESS_GROUP)
        kinds = ["cuda-bound", "cuda-lazy"] if args.device == "cuda" else ["cpu"]
        for i, kind in enumerate(kinds):
            took, said = timed([sys.executable, str(script), kind, str(29611 + i)], env)
            rows[f"process group of one rank ({kind})"] = {"process_s": round(took, 3), "inside": said}
            print(f"process group {kind}: {took:.2f} s {said}", flush=True)
        script = Path(td) / "mp.py"
        script.write_text(MODEL_PARALLEL)
        for i, kind in enumerate(["cuda", "cuda-lazy"] if args.device == "cuda" else ["cpu"]):
            took, said = timed([sys.executable, str(script), kind, str(29621 + i)], env)
            rows[f"megatron model-parallel set-up and release, 3 cases ({kind})"] = {"process_s": round(took, 3),
                                                                                    "inside": said}
            print(f"model parallel {kind}: {took:.2f} s {said}", flush=True)
    record = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": commit(), "machine": machine(),
              "device": args.device, "pieces": rows}
    (out / "worker_startup.json").write_text(json.dumps(record, indent=1))
    with open(out / "worker_startup.md", "a") as f:
        f.write(f"\n{record['date']} | {record['commit']} | {record['machine']}\n\n| piece | seconds |\n| --- | --- |\n")
        for name, r in rows.items():
            f.write(f"| {name} | {json.dumps(r)} |\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
