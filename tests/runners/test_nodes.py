"""Where ranks run: torchrun's command line on one node, over a c10d rendezvous and under srun;
the Slurm allocation read from its variables; who reports; device counts with --oversubscribe."""

from __future__ import annotations

import shlex
import sys

import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.runners import base
from lockstep.runners.launch import rendezvous_id, torchrun_command
from lockstep.runners.nodes import NodeLayout, first_host, reports_results

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

WORKER = "lockstep.runners.pytorch.train"


def dp(n: int, **kw) -> CaseSpec:
    return CaseSpec(name=f"dp{n}", model="gpt2", dtype="float32", micro_batch=10, seq_len=64, total_batch=5120,
                    steps=3, lr=1e-4, dp=n, **kw).check()


def test_one_node_is_standalone_torchrun():
    assert torchrun_command(WORKER, 8, ["job.json"]) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8", "-m", WORKER, "job.json"]


def test_two_nodes_meet_at_a_c10d_rendezvous_with_half_the_ranks_each():
    nodes = NodeLayout(nnodes=2, node_rank=1, rdzv_endpoint="10.1.2.3:29400")
    cmd = torchrun_command(WORKER, 8, ["job.json"], nodes, run_id="lockstep-pytorch-gpt2_3")
    assert cmd == [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--node-rank=1", "--nproc-per-node=4",
                   "--rdzv-backend=c10d", "--rdzv-endpoint=10.1.2.3:29400", "--rdzv-id=lockstep-pytorch-gpt2_3",
                   "-m", WORKER, "job.json"]


def test_rendezvous_id_is_the_same_on_every_node_and_differs_per_framework_and_case():
    job = {"case": dp(2).to_dict()}
    assert rendezvous_id(WORKER, job) == "lockstep-pytorch-dp2"
    assert rendezvous_id("lockstep.runners.megatron.worker", job) == "lockstep-megatron-dp2"


def test_slurm_starts_one_torchrun_per_node_under_srun():
    env = {"SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    nodes = NodeLayout.from_slurm(env)
    assert (nodes.nnodes, nodes.node_rank, nodes.rdzv_endpoint, nodes.launcher) == (2, 0, "gpu07:29500", "slurm")
    cmd = torchrun_command(WORKER, 16, ["/shared/out/job.json"], nodes, run_id="lockstep-pytorch-x")
    assert cmd[:8] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash", "-c",
                       cmd[7]]
    script = cmd[7]
    # The node rank is each task's own $SLURM_NODEID, expanded by its shell; the workers get it too.
    assert script.startswith("export LOCKSTEP_NODE_RANK=$SLURM_NODEID; exec ")
    words = shlex.split(script.split("; exec ", 1)[1])
    assert words == [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--node-rank=$SLURM_NODEID",
                     "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=gpu07:29500",
                     "--rdzv-id=lockstep-pytorch-x", "-m", WORKER, "/shared/out/job.json"]


def test_slurm_endpoint_can_be_given_and_the_allocation_must_exist():
    env = {"SLURM_NNODES": "4", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "a1,a2,a3,a4"}
    assert NodeLayout.from_slurm(env, rdzv_endpoint="a2:6000").rdzv_endpoint == "a2:6000"
    assert NodeLayout.from_slurm(env).rdzv_endpoint == "a1:29500"
    with pytest.raises(LockstepError, match="SLURM_NNODES"):
        NodeLayout.from_slurm({})


@pytest.mark.parametrize("nodelist,host", [("gpu[03-05,07],cpu1", "gpu03"), ("node7", "node7"), ("a1,b2", "a1"),
                                           ("rack1-n[009-012]-ib", "rack1-n009-ib"), ("x[2,4]", "x2")])
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.parametrize("layout,message", [
    (NodeLayout(nnodes=2, node_rank=0), "--rdzv-endpoint"),
    (NodeLayout(nnodes=2, node_rank=2, rdzv_endpoint="h:1"), "--node-rank 2"),
    (NodeLayout(nnodes=2, node_rank=0, rdzv_endpoint="nohostport"), "HOST:PORT"),
    (NodeLayout(nnodes=0), "--nnodes"),
])
def test_bad_node_layouts_are_refused_with_the_option_named(layout, message):
    with pytest.raises(LockstepError, match=message):
        layout.check()


def test_only_local_rank_0_of_node_0_reports():
    assert reports_results({"LOCAL_RANK": "0", "RANK": "3", "LOCKSTEP_NODE_RANK": "0"})
    assert not reports_results({"LOCAL_RANK": "0", "RANK": "0", "LOCKSTEP_NODE_RANK": "1"})
    assert not reports_results({"LOCAL_RANK": "1", "LOCKSTEP_NODE_RANK": "0"})
    assert reports_results({})  # in-process, one device


def test_oversubscribe_lets_more_ranks_than_cores_run_on_the_cpu_only(monkeypatch):
    monkeypatch.setattr(base, "available_devices", lambda device: 2)
    assert base.device_shortage(dp(8), "cpu") == "needs 8 devices, this machine has 2 CPU cores (--oversubscribe runs them anyway)"
    assert base.device_shortage(dp(8), "cpu", oversubscribe=True) is None
    assert base.device_shortage(dp(8), "cuda", oversubscribe=True) == "needs 8 devices, this machine has 2 GPUs"


def test_each_node_needs_only_its_share_of_the_devices(monkeypatch):
    monkeypatch.setattr(base, "available_devices", lambda device: 4)
    two = NodeLayout(nnodes=2, node_rank=0, rdzv_endpoint="h:1")
    assert base.device_shortage(dp(8), "cuda", nodes=two) is None
    assert base.device_shortage(dp(8), "cuda", nodes=NodeLayout(nnodes=1)) == "needs 8 devices, this machine has 4 GPUs"
    three = NodeLayout(nnodes=3, node_rank=0, rdzv_endpoint="h:1")
    assert base.device_shortage(dp(8), "cuda", nodes=three) == "its 8 rank(s) cannot be split evenly over 3 nodes"
