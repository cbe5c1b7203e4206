"""InfiniTrain's parallel flags for every case shape of the built-in matrices, on one node and
over several (its launcher `infini_run`, and under `srun`), and what its CPU build skips.

The expected flags are derived here from the case's fields and InfiniTrain's gflags
(docs/reference/infinitrain.md), independently of the runner's code: its world is nthread_per_process threads per
process, DP = world / (TP x PP), TP/SP/PP/VPP/ZeRO are flags only when used.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from lockstep.cases.matrix import load_matrix
from lockstep.cases.spec import CaseSpec
from lockstep.models import SHAPES
from lockstep.runners.base import RunInputs
from lockstep.runners.infinitrain.runner import InfiniTrainRunner
from lockstep.runners.nodes import NodeLayout

MATRICES = ("gpt2", "gpt2_parallel", "llama3", "llama3_parallel", "qwen3")
ALL_CASES = [(m, c) for m in MATRICES for c in load_matrix(m)]
PARALLEL_FLAGS = ("tensor_parallel", "sequence_parallel", "pipeline_parallel", "virtual_pipeline_parallel",
                  "zero_stage")


def inputs_for(case: CaseSpec, tmp_path: Path, device="cuda", nodes: NodeLayout | None = None) -> RunInputs:
    return RunInputs(checkpoint=tmp_path / "model.bin", tokens=tmp_path / "train.bin",
                     model=SHAPES[case.model].config, device=device, nodes=nodes or NodeLayout())


def gflags(args: list[str]) -> dict[str, str]:
    """InfiniTrain's `--flag value` and `--flag=value` arguments -> {flag: value}."""
    out, i = {}, 0
    while i < len(args):
        assert args[i].startswith("--"), f"stray argument {args[i]!r} in {args}"
        if "=" in args[i]:
            key, value = args[i][2:].split("=", 1)
            i += 1
        else:
            key, value = args[i][2:], args[i + 1]
            i += 2
        assert key not in out, f"--{key} given twice"
        out[key] = value
    return out


def expected_parallel_flags(case: CaseSpec, processes: int = 1) -> dict[str, str]:
    flags = {"nthread_per_process": str(case.dp * case.tp * case.pp // processes)}
    if case.tp > 1:
        flags["tensor_parallel"] = str(case.tp)
    if case.sp:
        flags["sequence_parallel"] = "true"
    if case.pp > 1:
        flags["pipeline_parallel"] = str(case.pp)
    if case.vpp > 1:
        flags["virtual_pipeline_parallel"] = str(case.vpp)
    if case.zero:
        flags["zero_stage"] = str(case.zero)
    return flags


def test_the_matrices_hold_every_parallel_kind():
    cases = [c for _, c in ALL_CASES]
    assert any(c.dp == 8 for c in cases) and any(c.tp == 8 and c.sp for c in cases)
    assert any(c.pp == 8 for c in cases) and any(c.vpp == 2 for c in cases)
    assert {c.zero for c in cases} == {0, 1, 2}
    assert any(c.dp > 1 and c.tp > 1 and c.pp > 1 for c in cases)


@pytest.mark.parametrize("matrix,case", ALL_CASES, ids=[f"{m}:{c.name}" for m, c in ALL_CASES])
def test_one_node_flags_of_every_case(matrix, case, tmp_path):
    runner = InfiniTrainRunner(build_dir=tmp_path)
    cmd = runner.command(case, inputs_for(case, tmp_path))
    family = SHAPES[case.model].family
    assert cmd[0] == str(tmp_path / family)  # gpt2, llama3 or qwen3 executable of the build
    flags = gflags(cmd[1:])
    assert {k: v for k, v in flags.items() if k in PARALLEL_FLAGS or k == "nthread_per_process"} == \
        expected_parallel_flags(case)
    assert (flags["batch_size"], flags["total_batch_size"], flags["sequence_length"], flags["num_iteration"]) == \
        (str(case.micro_batch), str(case.total_batch), str(case.seq_len), str(case.steps))
    assert (flags["dtype"], flags["device"], float(flags["learning_rate"])) == (case.dtype, "cuda", case.lr)
    assert flags.get("model") == ("llama3" if family == "llama3" else None)
    # InfiniTrain's own arithmetic gives the case's DP and accumulation back.
    world = int(flags["nthread_per_process"])
    dp = world // (int(flags.get("tensor_parallel", 1)) * int(flags.get("pipeline_parallel", 1)))
    assert dp == case.dp
    assert int(flags["total_batch_size"]) // (int(flags["batch_size"]) * int(flags["sequence_length"]) * dp) == case.accum


@pytest.mark.parametrize("matrix,case", [(m, c) for m, c in ALL_CASES if c.world_size % 2 == 0],
                         ids=[f"{m}:{c.name}" for m, c in ALL_CASES if c.world_size % 2 == 0])
def test_two_node_flags_of_every_even_case_go_through_infini_run(matrix, case, tmp_path):
    nodes = NodeLayout(nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.5:29500")
    cmd = InfiniTrainRunner(build_dir=tmp_path).command(case, inputs_for(case, tmp_path, nodes=nodes))
    split = cmd.index("--")
    assert cmd[0] == str(tmp_path / "infini_run")
    assert gflags(cmd[1:split]) == {"nnodes": "2", "nproc_per_node": "1", "node_rank": "1",
                                    "rdzv_endpoint": "10.0.0.5:29500"}
    assert cmd[split + 1] == str(tmp_path / SHAPES[case.model].family)
    flags = gflags(cmd[split + 2:])
    # One process per node: each holds half of the world's ranks as threads.
    assert {k: v for k, v in flags.items() if k in PARALLEL_FLAGS or k == "nthread_per_process"} == \
        expected_parallel_flags(case, processes=2)


def test_slurm_runs_infini_run_once_per_node_with_its_own_node_rank(tmp_path):
    case = next(c for _, c in ALL_CASES if c.name == "qwen3_3d_ddp_tp2_pp2_bf16")
    nodes = NodeLayout(nnodes=2, node_rank=0, rdzv_endpoint="gpu03:29500", launcher="slurm")
    cmd = InfiniTrainRunner(build_dir=tmp_path).command(case, inputs_for(case, tmp_path, nodes=nodes))
    assert cmd[:6] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash"]
    assert cmd[6] == "-c"
    script = shlex.split(cmd[7])
    assert script[0] == "exec" and script[1] == str(tmp_path / "infini_run")
    assert "--node_rank=$SLURM_NODEID" in script  # expanded by each task's shell, not by lockstep
    assert "--nthread_per_process" in script and script[script.index("--nthread_per_process") + 1] == "4"
    assert "--zero_stage" not in script


def test_zero_cases_pass_zero_stage(tmp_path):
    case = CaseSpec(name="z2", model="gpt2", dtype="float32", micro_batch=40, seq_len=64, total_batch=5120, steps=10,
                    lr=1e-4, dp=2, zero=2).check()
    flags = gflags(InfiniTrainRunner(build_dir=tmp_path).command(case, inputs_for(case, tmp_path))[1:])
    assert (flags["zero_stage"], flags["nthread_per_process"]) == ("2", "2")


@pytest.mark.parametrize("matrix,case", [(m, c) for m, c in ALL_CASES if c.world_size > 1],
                         ids=[f"{m}:{c.name}" for m, c in ALL_CASES if c.world_size > 1])
def test_its_cpu_build_skips_every_parallel_case_with_the_reason(matrix, case, tmp_path):
    reason = InfiniTrainRunner(build_dir=tmp_path).skip_reason(case, inputs_for(case, tmp_path, device="cpu"))
    assert reason is not None
    assert "bfloat16 crashes on CPU" in reason if case.is_bf16 else ("need --device cuda" in reason and
                                                                     case.parallel_label in reason)


def test_multi_node_preflight_needs_infini_run(tmp_path):
    from lockstep.errors import LockstepError

    exe = tmp_path / "gpt2"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    case = load_matrix("gpt2_parallel")[0]
    nodes = NodeLayout(nnodes=2, node_rank=0, rdzv_endpoint="127.0.0.1:29500")
    runner = InfiniTrainRunner(build_dir=tmp_path)
    with pytest.raises(LockstepError, match="infini_run"):
        runner.preflight(inputs_for(case, tmp_path, nodes=nodes))
    runner.preflight(inputs_for(case, tmp_path))  # one node needs only the executable
