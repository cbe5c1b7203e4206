"""A trainer the `command` runner runs: one `[frameworks.NAME]` table of a TOML file.

    [frameworks.mytrainer]
    command = "{python} train.py --llmc {llmc} --tokens {tokens} -B {B} -T {T} --steps {steps} --lr {lr}"
    log_format = "llmc"          # llmc | infinitrain | megatron | jsonl
    families = ["gpt2"]          # the model families it trains (default: every family)
    devices = ["cpu", "cuda"]    # default: both
    dtypes = ["float32"]         # default: float32 and bfloat16
    parallel = []                # layouts it runs (dp, tp, pp, vpp, sp, zero); default: one device only

The command is split like a shell line (shlex) and each word filled from the case
(`FIELDS`); it never runs through a shell. docs/reference/command-runner.md has every key.
"""

from __future__ import annotations

import json
import re
import shlex
import string
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.cases.spec import DTYPES
from lockstep.errors import FormatError
from lockstep.formats.run_record import StepRecord
from lockstep.runners.registry import ALL_LAYOUTS
from lockstep.step_contract import LOGGED_FP32_SEQUENTIAL, LOGGED_FP64_MEAN

LOG_FORMATS = ("llmc", "infinitrain", "megatron", "jsonl")
# What a template may name, and what each is (docs/reference/command-runner.md lists them too).
FIELDS = {
    "llmc": "the LLMC checkpoint to start from (absolute path)",
    "tokens": "the llm.c token file to train on (absolute path)",
    "out": "an empty directory of the case's own, for anything the trainer writes",
    "B": "micro batch: sequences per micro step per DP rank", "micro_batch": "the same as {B}",
    "T": "sequence length", "seq_len": "the same as {T}",
    "steps": "optimizer steps", "lr": "learning rate (Python's repr of the float)",
    "dtype": "float32 or bfloat16", "accum": "gradient-accumulation micro steps per step",
    "total_batch": "tokens per optimizer step",
    "dp": "data-parallel size", "tp": "tensor-parallel size", "pp": "pipeline-parallel size",
    "vpp": "virtual pipeline stages", "sp": "sequence parallel: true or false", "zero": "ZeRO stage",
    "world_size": "dp x tp x pp", "case": "the case's name", "model": "the model's name (e.g. gpt2-tiny)",
    "family": "the model family (gpt2, llama3, qwen3)", "optimizer": "sgd or adam (the family's contract)",
    "device": "cpu or cuda", "python": "the Python interpreter running lockstep",
    "here": "the directory of the TOML file",
    "build": "the build directory (--command-build, or each commit's under lockstep bisect; default {here})",
    "lr_decay_style": "the lr schedule's decay: none, constant, linear, cosine or inverse-square-root "
                      "(constant without a schedule)",
    "lr_warmup_iters": "warm-up steps (0 without a schedule)",
    "lr_warmup_init": "the warm-up's initial lr (Python's repr of the float)",
    "lr_decay_iters": "the step the decay reaches min_lr (the case's steps when the schedule says 0)",
    "min_lr": "the decay's final lr (Python's repr of the float)",
}
KEYS = ("command", "log_format", "steps_file", "version", "description", "families", "devices", "dtypes",
        "parallel", "env", "cwd", "timeout_s", "logged_loss", "megatron_step2_correction", "speed_anchor")
LOGGED_LOSSES = (LOGGED_FP64_MEAN, LOGGED_FP32_SEQUENTIAL)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class TrainerSpec:
    name: str  # the framework name (`--frameworks pytorch,NAME`)
    source: str  # the TOML file it came from
    command: str
    log_format: str = "llmc"
    # Where the step lines are, when not in the console log (a template, e.g. "{out}/steps.jsonl").
    steps_file: str | None = None
    version: str = ""
    description: str = ""
    families: tuple[str, ...] | None = None  # None: every family
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[str, ...] = DTYPES
    parallel: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    cwd: str | None = None  # a template; default: the case's {out}
    timeout_s: float | None = None
    logged_loss: str = LOGGED_FP64_MEAN
    megatron_step2_correction: bool = False  # Megatron-LM logs step 2 as the mean of steps 1 and 2
    # Why its losses are not the contract's (its own data order, optimizer, clipping): set, its pairs are
    # read for tok/s only ("speed only"), never judged on the loss.
    speed_anchor: str | None = None

    @property
    def here(self) -> Path:
        return Path(self.source).resolve().parent

    def argv(self, fields: dict) -> list[str]:
        """The command's words with every {field} filled (never through a shell)."""
        return [word.format_map(fields) for word in shlex.split(self.command)]


def load_trainers(path: str | Path) -> list[TrainerSpec]:
    """Every `[frameworks.NAME]` table of a TOML file, checked (FormatError naming the file and the key)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise FormatError(path, f"cannot be read ({e.strerror or e})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise FormatError(path, f"is not valid TOML ({e})") from None
    tables = data.get("frameworks")
    if not isinstance(tables, dict) or not tables:
        raise FormatError(path, "has no [frameworks.NAME] table (each names one trainer for the command runner)")
    return [_trainer(path, name, table) for name, table in tables.items()]


def _trainer(path: Path, name: str, t) -> TrainerSpec:
    where = f"[frameworks.{name}]"

    def bad(problem: str):
        return FormatError(path, f"{where} {problem}")

    if not NAME_RE.match(name):
        raise bad("is not a framework name (letters, digits, '_', '.', '-')")
    if not isinstance(t, dict):
        raise bad("is not a table")
    unknown = sorted(set(t) - set(KEYS))
    if unknown:
        raise bad(f"has unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    command = t.get("command")
    if not isinstance(command, str) or not command.strip():
        raise bad("needs command = \"...\" (the trainer's command line, with {llmc}, {tokens}, ... in it)")
    log_format = t.get("log_format", "llmc")
    if log_format not in LOG_FORMATS:
        raise bad(f"log_format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")

    def words(key: str, allowed: tuple[str, ...] | None = None, default=None):
        v = t.get(key, default)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise bad(f"{key} must be a list of strings")
        if allowed is not None and (extra := [x for x in v if x not in allowed]):
            raise bad(f"{key} names {', '.join(extra)}; allowed: {', '.join(allowed)}")
        return tuple(v)

    env = t.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise bad("env must be a table of strings")
    timeout = t.get("timeout_s")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise bad("timeout_s must be a positive number of seconds")
    logged_loss = t.get("logged_loss", LOGGED_FP64_MEAN)
    if logged_loss not in LOGGED_LOSSES:
        raise bad(f"logged_loss {logged_loss!r} is not one of {', '.join(LOGGED_LOSSES)}")
    anchor = t.get("speed_anchor")
    if anchor is not None and (not isinstance(anchor, str) or not anchor.strip()):
        raise bad("speed_anchor must say why its losses are not the contract's (a non-empty string)")
    spec = TrainerSpec(
        name=name, source=str(path), command=command, log_format=log_format, steps_file=t.get("steps_file"),
        version=str(t.get("version", "")), description=str(t.get("description", "")),
        families=words("families"), devices=words("devices", ("cpu", "cuda"), ["cpu", "cuda"]),
        dtypes=words("dtypes", DTYPES, list(DTYPES)), parallel=words("parallel", ALL_LAYOUTS, []),
        env=dict(env), cwd=t.get("cwd"), timeout_s=float(timeout) if timeout is not None else None,
        logged_loss=logged_loss, megatron_step2_correction=bool(t.get("megatron_step2_correction", False)),
        speed_anchor=anchor.strip() if anchor else None)
    for key in ("command", "steps_file", "cwd", *(f"env.{k}" for k in env)):
        template = spec.env[key[4:]] if key.startswith("env.") else getattr(spec, key)
        if template is None:
            continue
        for _, fname, _, _ in string.Formatter().parse(template):
            if fname is not None and fname not in FIELDS:
                raise bad(f"{key} names {{{fname}}}, which is not a field (fields: "
                          f"{', '.join('{' + f + '}' for f in FIELDS)}; write {{{{ and }}}} for literal braces)")
    return spec


def template_fields(case, inputs, out_dir: Path, trainer: TrainerSpec, build_dir: str | None = None) -> dict[str, str]:
    """The case, its inputs and its directory as the strings a template fills in."""
    import os

    fam = inputs.family
    fields = {
        "llmc": os.path.abspath(inputs.checkpoint), "tokens": os.path.abspath(inputs.tokens),
        "out": os.path.abspath(out_dir), "B": case.micro_batch, "micro_batch": case.micro_batch,
        "T": case.seq_len, "seq_len": case.seq_len, "steps": case.steps, "lr": repr(float(case.lr)),
        "dtype": case.dtype, "accum": case.accum, "total_batch": case.total_batch, "dp": case.dp, "tp": case.tp,
        "pp": case.pp, "vpp": case.vpp, "sp": "true" if case.sp else "false", "zero": case.zero,
        "world_size": case.world_size, "case": case.name, "model": inputs.model_name, "family": fam.name,
        "optimizer": fam.optimizer.kind, "device": inputs.device, "python": sys.executable,
        "here": str(trainer.here), "build": os.path.abspath(build_dir) if build_dir else str(trainer.here),
        **schedule_fields(case),
    }
    return {k: str(v) for k, v in fields.items()}


def schedule_fields(case) -> dict:
    """The case's lr schedule as InfiniTrain's flag values; without one, a constant lr
    (style constant, no warm-up), which a trainer given these flags trains the same."""
    from lockstep.cases.spec import LRSchedule

    schedule = case.lr_schedule or LRSchedule("constant")
    return {"lr_decay_style": schedule.lr_decay_style, "lr_warmup_iters": schedule.lr_warmup_iters,
            "lr_warmup_init": repr(float(schedule.lr_warmup_init)),
            "lr_decay_iters": schedule.decay_iters(case.steps), "min_lr": repr(float(schedule.min_lr))}


def parse_jsonl_steps(text: str, source: str) -> list[StepRecord]:
    """Lines that are JSON objects with "step" and "loss" (any other line is ignored): the step
    records of a trainer with `log_format = "jsonl"`; optional keys step_ms, tokens_per_s, lr,
    peak_mem_mb."""
    steps = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or "step" not in row or "loss" not in row:
            continue
        try:
            steps.append(StepRecord(step=int(row["step"]), loss=float(row["loss"]),
                                    **{k: float(row[k]) for k in ("step_ms", "tokens_per_s", "lr", "peak_mem_mb")
                                       if row.get(k) is not None}))
        except (TypeError, ValueError):
            raise FormatError(source, f"line {lineno}: a step record whose step or numbers are not numbers") from None
    if not steps:
        raise FormatError(source, 'holds no JSON step records ({"step": N, "loss": X, ...} lines)')
    return steps
