"""The `command` runner: a trainer lockstep has never seen (command_trainer/train_gpt2.py, plain
PyTorch written without lockstep's code) joins with a TOML entry and is compared against pytorch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lockstep.cli import main
from lockstep.errors import FormatError, LockstepError
from lockstep.formats.run_record import read_run_record
from lockstep.models import SHAPES
from lockstep.runners import framework_names, get_runner, spec_for
from lockstep.runners.base import RunInputs
from lockstep.runners.command import command_options
from lockstep.runners.command.trainer import load_trainers, parse_jsonl_steps
from lockstep.cases.spec import CaseSpec

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

TOY_TOML = Path(__file__).parent / "command_trainer" / "toy.toml"


def make_gpt2_case(**kw) -> CaseSpec:
    spec = dict(name="gpt2_1", model="gpt2-tiny", dtype="float32", micro_batch=4, seq_len=64, total_batch=256, steps=1,
                lr=1e-4)
    return CaseSpec(**{**spec, **kw})


def test_toy_trainer_passes_and_its_defects_fail_through_lockstep_run(capsys, tmp_path, tiny_checkpoint,
                                                                      training_tokens):
    """pytorch vs the toy trainer on gpt2_1 (FP32, 3 steps, CPU): within 1e-5; the same trainer with
    GELU's constant x10, or reading every window one token late, FAILs."""
    out = tmp_path / "out"
    rc = main(["run", "--frameworks", "pytorch,toy-gpt2,toy-gpt2-gelu,toy-gpt2-window", "--command-runner",
               str(TOY_TOML), "--cases", "gpt2_1", "--steps", "3", "--llmc", str(tiny_checkpoint),
               "--data", str(training_tokens), "--device", "cpu", "--out", str(out), "--no-report"])
    captured = capsys.readouterr()
    assert rc == 1, captured.err  # the defective trainers fail the run
    record = read_run_record(out / "toy-gpt2" / "gpt2_1.jsonl")
    assert record.ok and [s.step for s in record.steps] == [1, 2, 3]
    assert record.meta["framework_version"] == "toy GPT-2 trainer 1"
    assert "train_gpt2.py" in record.meta["worker_command"] and "--accum 1" in record.meta["worker_command"]
    assert (out / "toy-gpt2" / "gpt2_1.log").read_text().startswith("[COMMAND] ")
    summary = json.loads((out / "summary.json").read_text())
    by_test = {c["test_framework"]: c["cases"][0] for c in summary["comparisons"]}
    good = by_test["toy-gpt2"]
    assert good["passed"] is True and good["threshold"] == 1e-5 and good["max_abs_diff"] < 1e-5
    assert good["steps"] == 3
    for defective in ("toy-gpt2-gelu", "toy-gpt2-window"):
        assert by_test[defective]["passed"] is False, defective
        assert by_test[defective]["max_abs_diff"] > 1e-4, defective
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["frameworks"] == ["pytorch", "toy-gpt2", "toy-gpt2-gelu", "toy-gpt2-window"]


def test_a_speed_anchor_is_read_for_tok_s_only(capsys, tmp_path, tiny_checkpoint, training_tokens):
    """The window-late trainer FAILs as a test (above); declared a speed anchor, the same losses are
    not judged: "speed only" with its tok/s ratio and the reason, and the run passes."""
    toml = tmp_path / "anchor.toml"
    table = TOY_TOML.read_text().split("[frameworks.toy-gpt2-window]")[1].split("\n[")[0]
    toml.write_text("[frameworks.anchor]" + table.replace("{here}", str(TOY_TOML.parent))
                    + 'speed_anchor = "reads every window one token late"\n')
    out = tmp_path / "out"
    rc = main(["run", "--frameworks", "pytorch,anchor", "--command-runner", str(toml), "--cases", "gpt2_1",
               "--steps", "3", "--llmc", str(tiny_checkpoint), "--data", str(training_tokens), "--device", "cpu",
               "--out", str(out), "--no-report", "--no-history", "--junit", str(tmp_path / "j.xml")])
    captured = capsys.readouterr()
    assert rc == 0, captured.out
    assert "1 speed only" in captured.out
    summary = json.loads((out / "summary.json").read_text())
    comparison = summary["comparisons"][0]
    case = comparison["cases"][0]
    assert case["verdict"] == "speed only" and case["passed"] is False and case["max_abs_diff"] > 1e-4
    assert case["cause"] == "loss not judged (anchor: reads every window one token late)"
    assert case["throughput_ratio"] > 0 and comparison["passed"] is True
    assert comparison["counts"]["speed_only"] == 1 and comparison["counts"]["failed"] == 0
    assert '<skipped message="loss not judged (anchor: reads every window one token late)"' in \
        (tmp_path / "j.xml").read_text()


def test_a_steps_file_in_the_cases_out_dir_is_no_case_of_its_own(capsys, tmp_path, tiny_checkpoint, training_tokens):
    """`<case>.out/steps.jsonl` (the documented steps_file) is the trainer's, not a case "steps" of the
    comparison: the pair is judged (here a speed anchor's, with a tok/s ratio) and nothing is missing."""
    script = tmp_path / "fake.py"
    script.write_text("import json, sys\nout, steps = sys.argv[1], int(sys.argv[2])\n"
                      "with open(out + '/steps.jsonl', 'w') as f:\n"
                      "    for s in range(1, steps + 1):\n"
                      "        f.write(json.dumps({'step': s, 'loss': 10.0 - s, 'step_ms': 5.0}) + '\\n')\n")
    toml = tmp_path / "t.toml"
    toml.write_text(f'[frameworks.t]\ncommand = "{{python}} {script} {{out}} {{steps}}"\nlog_format = "jsonl"\n'
                    'steps_file = "{out}/steps.jsonl"\nspeed_anchor = "made-up losses"\n')
    out = tmp_path / "out"
    rc = main(["run", "--frameworks", "pytorch,t", "--command-runner", str(toml), "--cases", "gpt2_1", "--steps", "3",
               "--llmc", str(tiny_checkpoint), "--data", str(training_tokens), "--device", "cpu", "--out", str(out),
               "--no-report", "--no-history"])
    captured = capsys.readouterr()
    comparison = json.loads((out / "summary.json").read_text())["comparisons"][0]
    assert rc == 0 and comparison["missing"] == [], captured.out
    assert [c["case"] for c in comparison["cases"]] == ["gpt2_1"] and comparison["cases"][0]["verdict"] == "speed only"
    assert (out / "t" / "gpt2_1.out" / "steps.jsonl").is_file()
    # tok/s from the records' 5 ms per step: 256 tokens / 5 ms
    assert comparison["cases"][0]["test"]["tokens_per_s_overall"] == pytest.approx(256 / 0.005)


def test_trainers_become_framework_names():
    options = {"command": command_options([TOY_TOML])}
    assert {"toy-gpt2", "toy-gpt2-gelu", "toy-gpt2-window"} <= set(framework_names(options))
    assert spec_for("toy-gpt2", options).name == "command"
    assert get_runner("toy-gpt2", options).name == "toy-gpt2"
    with pytest.raises(LockstepError, match="unknown framework 'toy-gpt2'"):
        get_runner("toy-gpt2", {})  # no --command-runner: no such framework


@pytest.mark.parametrize("text, problem", [
    ('[frameworks.t]\ncommand = "run {llmc} {tokns}"\n', "command names {tokns}, which is not a field"),
    ('[frameworks.t]\ncommand = "run"\nlog_format = "csv"\n', "log_format 'csv' is not one of"),
    ('[frameworks.t]\ncommand = "run"\ncommnd = "x"\n', "unknown key(s) commnd"),
    ('[frameworks.t]\nlog_format = "llmc"\n', "needs command ="),
    ('[frameworks.t]\ncommand = "run"\nparallel = ["dp", "xp"]\n', "parallel names xp"),
    ('[other]\nx = 1\n', "has no [frameworks.NAME] table"),
    ('[frameworks.t\n', "is not valid TOML"),
    ('[frameworks.t]\ncommand = "run"\nspeed_anchor = " "\n', "speed_anchor must say why its losses are not"),
])
def test_bad_toml_is_one_sentence_naming_the_file(tmp_path, text, problem):
    path = tmp_path / "trainers.toml"
    path.write_text(text)
    with pytest.raises(FormatError) as e:
        load_trainers(path)
    assert str(path) in str(e.value) and problem in str(e.value)


def test_a_trainer_may_not_take_a_registered_name(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('[frameworks.pytorch]\ncommand = "run"\n')
    with pytest.raises(LockstepError, match="takes the name of a registered framework"):
        command_options([path])


def _inputs(tiny_checkpoint, tokens, **kw) -> RunInputs:
    return RunInputs(checkpoint=tiny_checkpoint, tokens=tokens, model=SHAPES["gpt2-tiny"].config, device="cpu",
                     model_name="gpt2-tiny", **kw)


def _runner(tmp_path, table: str):
    path = tmp_path / "trainers.toml"
    path.write_text(table)
    return get_runner("t", {"command": command_options([path])})


def test_jsonl_steps_from_a_file_of_the_case(tmp_path, tiny_checkpoint, training_tokens):
    """A trainer that writes JSON step records into {out}: lockstep reads them from there."""
    script = tmp_path / "fake.py"
    script.write_text("import json, sys\nout, steps = sys.argv[1], int(sys.argv[2])\n"
                      "with open(out + '/steps.jsonl', 'w') as f:\n"
                      "    for s in range(1, steps + 1):\n"
                      "        f.write(json.dumps({'step': s, 'loss': 10.0 - s, 'step_ms': 5.0}) + '\\n')\n")
    runner = _runner(tmp_path, f'[frameworks.t]\ncommand = "{{python}} {script} {{out}} {{steps}}"\n'
                               'log_format = "jsonl"\nsteps_file = "{out}/steps.jsonl"\n')
    rec = runner.run(make_gpt2_case(steps=3), _inputs(tiny_checkpoint, training_tokens), tmp_path / "o")
    assert rec.ok, rec.error
    assert [(s.step, s.loss, s.step_ms) for s in rec.steps] == [(1, 9.0, 5.0), (2, 8.0, 5.0), (3, 7.0, 5.0)]


def test_jsonl_parser_and_its_refusal():
    text = 'hello\n{"step": 1, "loss": 2.5}\n{"note": 1}\n{"step": 2, "loss": 2.25, "tokens_per_s": 100}\n'
    assert [(s.step, s.loss, s.tokens_per_s) for s in parse_jsonl_steps(text, "x.log")] == [(1, 2.5, None),
                                                                                             (2, 2.25, 100.0)]
    with pytest.raises(FormatError, match="holds no JSON step records"):
        parse_jsonl_steps("step 1 loss 2\n", "x.log")


def test_timeout_kills_the_whole_process_group(tmp_path, tiny_checkpoint, training_tokens):
    """A trainer that hangs (and started a child of its own) is stopped at the timeout, its child
    too: nothing it started outlives the run."""
    script = tmp_path / "hang.py"
    script.write_text("import subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                      "open(sys.argv[1] + '/child.pid', 'w').write(str(child.pid))\n"
                      "print('started', flush=True)\ntime.sleep(120)\n")
    runner = _runner(tmp_path, f'[frameworks.t]\ncommand = "{{python}} {script} {{out}}"\n')
    rec = runner.run(make_gpt2_case(steps=2), _inputs(tiny_checkpoint, training_tokens, timeout_s=3),
                     tmp_path / "o")
    assert not rec.ok and "t timed out after 3 s at step 0 of 2" in rec.error and "started" in rec.error
    pid = int((tmp_path / "o" / "t" / "gpt2_1.out" / "child.pid").read_text())
    status = Path(f"/proc/{pid}/status")
    assert not status.exists() or "State:\tZ" in status.read_text()  # gone, or dead and not yet reaped


def test_a_failing_trainer_is_a_failed_record_with_its_log_tail(tmp_path, tiny_checkpoint, training_tokens):
    runner = _runner(tmp_path, '[frameworks.t]\ncommand = "{python} -c \'import sys; print(\\"boom\\"); sys.exit(3)\'"\n')
    rec = runner.run(make_gpt2_case(steps=2), _inputs(tiny_checkpoint, training_tokens), tmp_path / "o")
    assert not rec.ok and "t exited with status 3 after 0 of 2 step(s)" in rec.error and "boom" in rec.error


def test_what_a_trainer_cannot_run_is_a_skip_reason(tmp_path, tiny_checkpoint, training_tokens):
    runner = get_runner("toy-gpt2", {"command": command_options([TOY_TOML])})
    inputs = _inputs(tiny_checkpoint, training_tokens)
    assert runner.skip_reason(make_gpt2_case(), inputs) is None
    assert "runs on one device only, not DP=2" in runner.skip_reason(make_gpt2_case(dp=2, total_batch=512), inputs)
    assert "trains float32, not bfloat16" in runner.skip_reason(make_gpt2_case(dtype="bfloat16"), inputs)
    llama = RunInputs(checkpoint=tiny_checkpoint, tokens=training_tokens, model=SHAPES["llama3-tiny"].config,
                      device="cpu")
    assert "trains gpt2 models, not Llama 3" in runner.skip_reason(make_gpt2_case(), llama)
