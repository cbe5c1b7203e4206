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
    assert ("skip megatron/gpt2_1_bfloat16: megatron-core's bf16 autocast backward needs CUDA") in lines
    assert ("skip pytorch/gpt2_1_bfloat16: no test framework runs this case here (megatron: megatron-core's bf16 "
            "autocast backward needs CUDA): nothing to compare it with") in lines
    assert "skip pytorch/gpt2_1:" not in out and "skip megatron/gpt2_1:" not in out
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
