"""`lockstep run`'s parallel options as planned (nothing trains here): --oversubscribe, the node
options and their one-sentence refusals."""

from __future__ import annotations

import pytest

from lockstep.cli import main
from lockstep.plan import RunRequest, plan_run
from lockstep.runners import base
from lockstep.runners.nodes import NodeLayout

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)


def request(tiny_checkpoint, tiny_shakespeare_train, tmp_path, **kw) -> RunRequest:
    return RunRequest(matrix="gpt2", cases=["gpt2_2", "gpt2_3", "gpt2_3_bfloat16"], frameworks=["pytorch"],
                      llmc=str(tiny_checkpoint), data=str(tiny_shakespeare_train), device="cpu",
                      out=str(tmp_path / "o"), **kw)


def test_8_rank_cases_are_skipped_unless_oversubscribe_is_asked_for_and_said(
        tiny_checkpoint, tiny_shakespeare_train, tmp_path, monkeypatch):
    monkeypatch.setattr(base, "available_devices", lambda device: 2)
    plain = plan_run(request(tiny_checkpoint, tiny_shakespeare_train, tmp_path))
    assert plain.unrunnable == {
        "gpt2_3": "needs 8 devices, this machine has 2 CPU cores (--oversubscribe runs them anyway)",
        "gpt2_3_bfloat16": "needs 8 devices, this machine has 2 CPU cores (--oversubscribe runs them anyway)"}
    assert not any("oversubscribe" in n for n in plain.notes)

    over = plan_run(request(tiny_checkpoint, tiny_shakespeare_train, tmp_path, oversubscribe=True))
    assert over.unrunnable == {}
    assert ("--oversubscribe: gpt2_3, gpt2_3_bfloat16 run 8 ranks on 2 CPU cores (gloo, 1 torch thread per rank): "
            "slower, same arithmetic") in over.notes
    assert all(over.inputs[c].oversubscribe for c in ("gpt2_2", "gpt2_3"))


def test_a_case_that_cannot_be_split_over_the_nodes_is_skipped_with_the_reason(
        tiny_checkpoint, tiny_shakespeare_train, tmp_path):
    nodes = NodeLayout(nnodes=3, node_rank=0, rdzv_endpoint="127.0.0.1:29999")
    plan = plan_run(request(tiny_checkpoint, tiny_shakespeare_train, tmp_path, oversubscribe=True, nodes=nodes))
    assert plan.unrunnable["gpt2_2"] == "its 1 rank(s) cannot be split evenly over 3 nodes"
    assert plan.unrunnable["gpt2_3"] == "its 8 rank(s) cannot be split evenly over 3 nodes"
    assert "nodes: 3 nodes (c10d rendezvous at 127.0.0.1:29999), this is node 0" in plan.notes


@pytest.mark.parametrize("args,message", [
    (["--nnodes", "2"], "runs over several nodes need --rdzv-endpoint HOST:PORT"),
    (["--nnodes", "2", "--node-rank", "5", "--rdzv-endpoint", "h:1"], "--node-rank 5 is outside 0..1"),
    (["--launcher", "slurm"], "--launcher slurm runs inside a Slurm allocation"),
])
def test_bad_node_options_fail_with_one_sentence(capsys, tmp_path, monkeypatch, args, message):
    for var in ("SLURM_NNODES", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(var, raising=False)
    rc = main(["run", *args, "--frameworks", "pytorch", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 1 and message in err and "Traceback" not in err
