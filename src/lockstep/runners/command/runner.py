"""`command` runner: a trainer lockstep has never seen, run from its TOML entry (trainer.py).

Its command gets the case's LLMC file, token file and hyper-parameters through the template; its
console output is the run's native log (`<case>.log`, under a `[COMMAND]` line), read with the
parsers lockstep already has (formats/logs.py) or as JSON step records. It runs as one subprocess
in a session of its own (logged_process.py): a timeout or an interrupt kills its whole tree.
It cannot show its step 1 from inside, so its pairs are compared on the loss alone (no certificate).
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import replace
from pathlib import Path

from lockstep.cases.spec import CaseSpec
from lockstep.errors import FormatError, RunError
from lockstep.formats.logs import correct_megatron_step2, parse_infinitrain_log, parse_llmc_log, parse_megatron_log
from lockstep.formats.run_record import CASE_OUT_SUFFIX, StepRecord
from lockstep.fsutil import read_text
from lockstep.runners.base import ExecuteResult, FrameworkRunner, RunInputs, StepCallback
from lockstep.runners.command.trainer import TrainerSpec, parse_jsonl_steps, template_fields
from lockstep.runners.launch import shared_cores_env, worker_env
from lockstep.runners.logged_process import check_finished, parse_or_none, run_logged
from lockstep.step_contract import tokens_per_second

DEFAULT_TIMEOUT_S = 1800.0
LAYOUT_OF = {"dp": lambda c: c.dp > 1, "tp": lambda c: c.tp > 1, "pp": lambda c: c.pp > 1,
             "vpp": lambda c: c.vpp > 1, "sp": lambda c: c.sp, "zero": lambda c: c.zero > 0,
             "ep": lambda c: c.ep > 1}


# Significant digits of the lr each log format prints ("lr %.2e" in llm.c's and InfiniTrain's step
# lines, "%.6E" in Megatron-LM's): the comparison checks a record read from a log to these (JSON
# step records hold the full value).
PRINTED_LR_DIGITS = {"llmc": 3, "infinitrain": 3, "megatron": 7}


def _with_rate(step: StepRecord, tokens: int) -> StepRecord:
    """A step that states its time and not its tok/s gets the case's tokens per step over that time."""
    if step.tokens_per_s is not None or not step.step_ms:
        return step
    return replace(step, tokens_per_s=tokens_per_second(tokens, step.step_ms))


class CommandRunner(FrameworkRunner):
    name = "command"
    runs_apart = True  # the user's trainer, a process of its own

    def __init__(self, trainer: TrainerSpec, build_dir: str | None = None):
        self.trainer = trainer
        self.build_dir = build_dir
        self.name = trainer.name  # its records go to <out>/<trainer name>/
        self.logged_loss = trainer.logged_loss

    def version(self) -> str:
        return self.trainer.version or f"command runner trainer from {self.trainer.source}"

    def skip_reason(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        t, where = self.trainer, f"({self.trainer.source})"
        if t.families is not None and inputs.family.name not in t.families:
            return f"{t.name} trains {', '.join(t.families)} models, not {inputs.family.title} {where}"
        if inputs.device not in t.devices:
            return f"{t.name} runs on {', '.join(t.devices)}, not {inputs.device} {where}"
        if case.dtype not in t.dtypes:
            return f"{t.name} trains {', '.join(t.dtypes)}, not {case.dtype} {where}"
        missing = [layout for layout, used in LAYOUT_OF.items() if used(case) and layout not in t.parallel]
        if missing:
            can = f"runs {', '.join(t.parallel)}" if t.parallel else "runs on one device only"
            return f"{t.name} {can}, not {case.parallel_label} {where}"
        return super().skip_reason(case, inputs)

    def parse(self, text: str, source: str, case: CaseSpec) -> list[StepRecord]:
        fmt = self.trainer.log_format
        if fmt == "jsonl":
            return parse_jsonl_steps(text, source)
        if fmt == "infinitrain":
            return parse_infinitrain_log(text, source).steps
        if fmt == "megatron":
            record = parse_megatron_log(text, source, seq_length=case.seq_len)
            return (correct_megatron_step2(record) if self.trainer.megatron_step2_correction else record).steps
        return parse_llmc_log(text, source).steps

    def execute(self, case: CaseSpec, inputs: RunInputs, log_path: Path, on_step: StepCallback | None) -> ExecuteResult:
        t = self.trainer
        log_path = Path(log_path)
        out_dir = log_path.with_name(case.name + CASE_OUT_SUFFIX)
        shutil.rmtree(out_dir, ignore_errors=True)  # an earlier run's files are never read as this one's
        out_dir.mkdir(parents=True)
        fields = template_fields(case, inputs, out_dir, t, self.build_dir)
        cmd = t.argv(fields)
        env = worker_env({**shared_cores_env(inputs.jobs), **{k: v.format_map(fields) for k, v in t.env.items()}})
        cwd = Path(t.cwd.format_map(fields)) if t.cwd else out_dir
        timeout_s = inputs.timeout_s if inputs.timeout_s is not None else (t.timeout_s or DEFAULT_TIMEOUT_S)
        steps_file = Path(t.steps_file.format_map(fields)) if t.steps_file else None

        def from_log(text: str, source: str) -> list[StepRecord]:
            return self.parse(text, source, case)

        if steps_file is None:
            run = run_logged(cmd, log_path, from_log, env=env, cwd=cwd, timeout_s=timeout_s, on_step=on_step,
                             what=t.name)
        else:
            run = run_logged(cmd, log_path, lambda text, source: [], env=env, cwd=cwd, timeout_s=timeout_s,
                             what=t.name)
            steps = self._steps_from_file(steps_file, case) if steps_file.is_file() else []
            run = type(run)(text=run.text, steps=steps, returncode=run.returncode, timed_out=run.timed_out)
            for rec in steps if on_step else ():
                on_step(rec)
        check_finished(run, log_path, case.steps, t.name, timeout_s)
        steps = [_with_rate(s, case.total_batch) for s in run.steps]
        if not any(out_dir.iterdir()):
            out_dir.rmdir()  # nothing written: no empty directory beside the records
        digits = None if t.steps_file else PRINTED_LR_DIGITS.get(t.log_format)
        return ExecuteResult(steps=steps, meta={"worker_command": shlex.join(cmd), "launcher": "subprocess",
                                                    **({"lr_significant_digits": digits} if digits else {}),
                                                    **({"speed_anchor": t.speed_anchor} if t.speed_anchor else {}),
                                                    "command_runner": {"trainer": t.name, "source": t.source,
                                                                       "log_format": t.log_format,
                                                                       "build": fields["build"]}})

    def _steps_from_file(self, path: Path, case: CaseSpec) -> list[StepRecord]:
        try:
            text = read_text(path, f"{self.trainer.name}'s step file", errors="replace")
        except FormatError as e:
            raise RunError(str(e)) from None
        return parse_or_none(lambda t, s: self.parse(t, s, case), text, str(path))
