"""`lockstep run --dry-run`: the plan (every case, the frameworks that run it, each skip with its
reason), nothing trained and nothing written; and the plan's rule that a baseline runs only a
case some test framework will be compared with (issue 36, item 17)."""

from __future__ import annotations

from lockstep.cli import main
from lockstep.plan import RunRequest, plan_run


def test_dry_run_prints_the_plan_and_writes_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))
    out_dir = tmp_path / "o"
    rc = main(["run", "--dry-run", "--frameworks", "pytorch,megatron", "--device", "cpu", "--out", str(out_dir)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert not out_dir.exists() and not (tmp_path / "cache").exists()  # no out dir, no tokens, no weights
    for case in ("gpt2_1", "gpt2_1_bfloat16", "gpt2_2", "gpt2_2_bfloat16", "gpt2_3", "gpt2_3_bfloat16"):
        assert case in out
    lines = out.splitlines()
    assert ("skipped (2): megatron-core's bf16 autocast backward needs CUDA: megatron/gpt2_1_bfloat16, "
            "megatron/gpt2_2_bfloat16") in lines
    assert "pytorch/gpt2_1," not in out and "megatron/gpt2_1," not in out
    assert any(line.startswith("dry run: ") and "pair(s) would run" in line for line in lines)


def test_a_baseline_runs_only_cases_a_test_framework_is_compared_on(tmp_path):
    def plan(frameworks, repeat=1):
        return plan_run(RunRequest(frameworks=frameworks, cases=["gpt2_1", "gpt2_1_bfloat16"], device="cpu",
                                   out=str(tmp_path / "o")), repeat=repeat, make_files=False)

    both = plan(["pytorch", "megatron"])
    pytorch, megatron = both.runners
    fp32, bf16 = both.cases
    assert both.runs(fp32, pytorch) and both.runs(fp32, megatron)
    assert not both.runs(bf16, megatron)
    assert "nothing to compare it with" in both.skip_reason(bf16, pytorch)
    assert any("pytorch skips gpt2_1_bfloat16" in note for note in both.notes)  # said before anything runs
    # Negative controls: pytorch alone, or repeated (its repeats are compared with each other), runs it.
    alone = plan(["pytorch"])
    assert alone.runs(alone.cases[1], alone.runners[0])
    repeated = plan(["pytorch", "megatron"], repeat=2)
    assert repeated.runs(repeated.cases[1], repeated.runners[0])


def test_an_infinitrain_test_config_s_skips_are_one_line_per_reason(capsys, tmp_path, monkeypatch):
    """InfiniTrain's file skips many pairs for a few reasons: each reason once, with its count."""
    from pathlib import Path

    from lockstep.runners.base import available_devices

    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))
    config = Path(__file__).parents[1] / "fixtures" / "infinitrain_test_configs" / "skips_by_reason.json"
    rc = main(["run", "--dry-run", "--matrix", str(config), "--frameworks", "pytorch,megatron", "--device", "cpu",
               "--out", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = [" ".join(line.split()) for line in out.splitlines()]
    skip = [line for line in lines if line.startswith("skipped (")]
    cores = available_devices("cpu")
    assert skip == [
        "skipped (2): no test framework runs this case here (megatron: megatron-core's bf16 autocast backward needs "
        "CUDA): nothing to compare it with: pytorch/gpt2_1_bfloat16, pytorch/llama3_1_bfloat16",
        "skipped (2): megatron-core's bf16 autocast backward needs CUDA: megatron/gpt2_1_bfloat16, "
        "megatron/llama3_1_bfloat16",
        f"skipped (12): needs 8 devices, this machine has {cores} CPU cores (--oversubscribe "
        "runs them anyway): pytorch/gpt2_3, megatron/gpt2_3, pytorch/llama3_3, megatron/llama3_3, "
        "pytorch/gpt2_3_bfloat16, megatron/gpt2_3_bfloat16 and 6 more"]
    assert not any(line.startswith("skip ") for line in lines)  # no line per pair
    assert lines[-1] == "dry run: 4 (case, framework) pair(s) would run, 16 skipped"
