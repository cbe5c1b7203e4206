"""`lockstep run` over two "nodes" on one machine: two lockstep processes on 127.0.0.1 that meet at
a c10d rendezvous (gloo), one rank each of a DP=2 case, against the same case on one node.
gpt2-tiny, 3 steps at a high lr (SGD 1e-2) so that the losses move far past the threshold."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lockstep.formats.run_record import read_run_record

pytestmark = [pytest.mark.slow, pytest.mark.integration]

MATRIX = """
[defaults]
model = "gpt2"
seq_len = 64
steps = 3
lr = 1e-2

[[case]]
name = "dp2"
dtype = "float32"
dp = 2
micro_batch = 2
total_batch = 256
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lockstep_run(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lockstep", "run", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "160"})


def test_two_localhost_nodes_train_like_one_node(tiny_checkpoint, tiny_shakespeare_train, tmp_path):
    frameworks = "pytorch,megatron" if _megatron_installed() else "pytorch"
    (tmp_path / "m.toml").write_text(MATRIX)
    common = ["--matrix", "m.toml", "--frameworks", frameworks, "--llmc", str(tiny_checkpoint),
              "--data", str(tiny_shakespeare_train), "--no-report", "--timeout", "600"]
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [lockstep_run([*common, "--nnodes", "2", "--node-rank", str(r), "--rdzv-endpoint", endpoint,
                           "--out", f"node{r}"], tmp_path) for r in (0, 1)]
    outputs = [p.communicate(timeout=900)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outputs
    assert "node 1 of 2" in outputs[1] and "nodes: 2 nodes (c10d rendezvous at 127.0.0.1" in outputs[0]

    one = lockstep_run([*common, "--out", "one"], tmp_path)
    one_output = one.communicate(timeout=900)[0]
    assert one.returncode == 0, one_output

    # Only node 0 writes records; node 1 keeps its ranks' logs apart, under node1/node1/.
    assert not list((tmp_path / "node1").rglob("*.jsonl")) and not (tmp_path / "node1" / "run.json").exists()
    for fw in frameworks.split(","):
        assert (tmp_path / "node1" / "node1" / fw / "dp2.log").is_file()
        two = read_run_record(tmp_path / "node0" / fw / "dp2.jsonl")
        single = read_run_record(tmp_path / "one" / fw / "dp2.jsonl")
        assert two.ok and single.ok
        assert "2 nodes" in two.meta["launcher"] and "nodes" not in single.meta["launcher"]
        diff = max(abs(a - b) for a, b in zip(two.losses(), single.losses()))
        print(f"{fw} DP=2 on two localhost nodes vs one node: max |dloss| {diff:.3e}; "
              f"loss {two.losses()[0]:.6f} -> {two.losses()[-1]:.6f}")
        assert len(two.losses()) == 3 and diff < 1e-5
        assert two.losses()[0] - two.losses()[-1] > 1e-2
        # The step lines are in node 0's log even when c10d gave global rank 0 to node 1.
        step_line = {"pytorch": "train loss", "megatron": "lm loss"}[fw]
        assert step_line in (tmp_path / "node0" / fw / "dp2.log").read_text()


def _megatron_installed() -> bool:
    from lockstep.runners.megatron.runner import megatron_core_installed

    return megatron_core_installed()
