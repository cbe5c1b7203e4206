"""Where a run's processes live: one machine, or several nodes that meet at a rendezvous.

`NodeLayout` is what `lockstep run --nnodes/--node-rank/--rdzv-endpoint/--launcher` asked for.
Every node runs the same plan; each starts its share of every case's ranks (torchrun with a
c10d rendezvous, or one torchrun per node under `srun`, or InfiniTrain's `infini_run`), and
only node rank 0 writes records, compares and reports.

torchrun's c10d rendezvous numbers the ranks by the nodes' (address, pid), not by
`--node-rank`, so global rank 0 may run on any node. The process that reports the steps is
therefore chosen by lockstep's own node rank (`LOCKSTEP_NODE_RANK`, set for the workers) and
the local rank: local rank 0 of node 0. Every value it reports (the loss, the slowest rank's
step time) is all-reduced over all ranks first, so any rank could report it.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass

from lockstep.errors import LockstepError

NODE_RANK_ENV = "LOCKSTEP_NODE_RANK"
LAUNCHERS = ("torchrun", "slurm")
DEFAULT_RDZV_PORT = 29500


@dataclass(frozen=True)
class NodeLayout:
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT of the c10d rendezvous (several nodes only)
    launcher: str = "torchrun"  # "torchrun": one lockstep per node; "slurm": one lockstep, srun per case

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1 or self.launcher == "slurm"

    @property
    def writes_records(self) -> bool:
        return self.node_rank == 0

    def check(self) -> "NodeLayout":
        if self.launcher not in LAUNCHERS:
            raise LockstepError(f"--launcher must be one of {', '.join(LAUNCHERS)}, not {self.launcher!r}")
        if self.nnodes < 1:
            raise LockstepError(f"--nnodes is {self.nnodes}, must be at least 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise LockstepError(f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1} (--nnodes {self.nnodes})")
        if self.multi_node:
            if not self.rdzv_endpoint:
                raise LockstepError("runs over several nodes need --rdzv-endpoint HOST:PORT (node 0's address)")
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit():
                raise LockstepError(f"--rdzv-endpoint {self.rdzv_endpoint!r} is not HOST:PORT")
        return self

    def procs_per_node(self, world_size: int) -> int:
        return world_size // self.nnodes

    def split_problem(self, world_size: int) -> str | None:
        """Why a case of `world_size` ranks cannot be spread evenly over the nodes, or None."""
        if self.nnodes > 1 and world_size % self.nnodes:
            return f"its {world_size} rank(s) cannot be split evenly over {self.nnodes} nodes"
        return None

    @property
    def label(self) -> str:
        if not self.multi_node:
            return "one node"
        how = "srun" if self.launcher == "slurm" else "c10d rendezvous"
        return f"{self.nnodes} nodes ({how} at {self.rdzv_endpoint}), this is node {self.node_rank}"

    @classmethod
    def from_slurm(cls, env: dict | None = None, rdzv_endpoint: str | None = None) -> "NodeLayout":
        """The allocation lockstep runs in: SLURM_NNODES, SLURM_NODEID, the first host of
        SLURM_JOB_NODELIST as the rendezvous host (unless --rdzv-endpoint says otherwise)."""
        env = os.environ if env is None else env
        missing = [k for k in ("SLURM_NNODES", "SLURM_JOB_NODELIST") if not env.get(k)]
        if missing:
            raise LockstepError(f"--launcher slurm runs inside a Slurm allocation, but {', '.join(missing)} "
                                "is not set (start lockstep from sbatch or salloc)")
        endpoint = rdzv_endpoint or f"{first_host(env['SLURM_JOB_NODELIST'])}:{DEFAULT_RDZV_PORT}"
        return cls(nnodes=int(env["SLURM_NNODES"]), node_rank=int(env.get("SLURM_NODEID", 0)),
                   rdzv_endpoint=endpoint, launcher="slurm").check()


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: `gpu[03-05,07],cpu1` -> `gpu03` (zero padding kept)."""
    m = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?([^,]*)", nodelist.strip())
    if not m or not (m.group(1) or m.group(2)):
        raise LockstepError(f"SLURM_JOB_NODELIST {nodelist!r} names no host")
    prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
    if ranges is None:
        return prefix + suffix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first + suffix


def torchrun_args(layout: NodeLayout, world_size: int, run_id: str, node_rank: str | int | None = None) -> list[str]:
    """torchrun's options that place this node's share of the ranks."""
    if not layout.multi_node:
        return ["--standalone", f"--nproc_per_node={world_size}"]
    rank = layout.node_rank if node_rank is None else node_rank
    return [f"--nnodes={layout.nnodes}", f"--node-rank={rank}", f"--nproc-per-node={layout.procs_per_node(world_size)}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={layout.rdzv_endpoint}", f"--rdzv-id={run_id}"]


def slurm_command(layout: NodeLayout, torchrun_head: list[str], world_size: int, run_id: str,
                  tail: list[str]) -> list[str]:
    """One torchrun per node under `srun`; each takes its node rank from its own SLURM_NODEID.

    `torchrun_head` is the interpreter and `-m torch.distributed.run`; `tail` the worker module
    and its arguments. The per-node command runs under `bash -c` so that $SLURM_NODEID is the
    task's, not the value of the node lockstep itself runs on.
    """
    args = torchrun_args(layout, world_size, run_id, node_rank="$SLURM_NODEID")
    quoted = [a if a.startswith("--node-rank=") else shlex.quote(a) for a in [*torchrun_head, *args, *tail]]
    return srun_per_node(layout, f"export {NODE_RANK_ENV}=$SLURM_NODEID; exec " + " ".join(quoted))


def srun_per_node(layout: NodeLayout, script: str) -> list[str]:
    """`script` once on every node of the allocation (one task each); a failing node ends them all."""
    return ["srun", f"--nodes={layout.nnodes}", f"--ntasks={layout.nnodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1", "bash", "-c", script]


def reports_results(env: dict | None = None) -> bool:
    """True in the one worker process that writes the step lines and results: local rank 0 of node 0."""
    env = os.environ if env is None else env
    return int(env.get("LOCAL_RANK", 0)) == 0 and int(env.get(NODE_RANK_ENV, 0)) == 0
