"""Log lines other tools already read (docs/reference/logs.md): writers used by lockstep's runners,
and parsers that turn native logs into the common RunRecord.

Each parser's regular expression sits beside the writer of the same line, so that one format
string and one regular expression can be checked against each other (tests round-trip them).

Formats read by `parse_log_file` (detected per file, `origin` of the record in brackets):
- InfiniTrain ["infinitrain-log"]: glog-prefixed llm.c step lines, optionally with the
  `| peak used: N MB | peak reserved: N MB, DP=.., TP=.., SP=.., PP=..)` tail, among any
  other lines.
- llm.c / PyTorch baseline ["llmc-log"]: the same step line without a glog prefix, with an
  optional `| norm X` field.
- upstream Megatron-LM ["megatron-lm-log"]: `iteration N/M | ... | lm loss: X | ...` lines.
  Throughput comes from `PERF step` lines when the log has them; otherwise tok/s is derived
  from "elapsed time per iteration" x global batch size x sequence length, and iterations 1-2
  carry no timing (upstream's elapsed time of 1-2 is not a step time).
- lockstep's own megatron runner ["lockstep-megatron-log"]: the same iteration lines, but with
  the TRUE per-step loss, plus PERF lines. It is recognised by the marker
  `LOCKSTEP_MEGATRON_MARKER` ("lockstep megatron runner") appearing in one of the first
  `MARKER_SCAN_LINES` lines (the runner writes e.g. `[COMMAND] ...` then
  `[INFO] written by lockstep megatron runner ...`).

Megatron-LM's step-2 running-mean quirk (docs/reference/logs.md#megatron-lm-pretrain_gptpy) is NOT
corrected by the parsers: the record holds the logged values. `correct_megatron_step2` applies `loss2 = 2*logged2 - loss1`
when the caller asks (`lockstep compare --megatron-step2-correction`), and never to lockstep's
own records or logs.
"""

from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from lockstep.errors import FormatError
from lockstep.fsutil import read_text
from lockstep.formats.run_record import RunRecord, StepRecord, read_run_record
from lockstep.step_contract import tokens_per_second

# Origins of records read from native logs (RunRecord.origin).
ORIGIN_INFINITRAIN = "infinitrain-log"
ORIGIN_LLMC = "llmc-log"
ORIGIN_MEGATRON_LM = "megatron-lm-log"
ORIGIN_LOCKSTEP_MEGATRON = "lockstep-megatron-log"
ORIGIN_LOCKSTEP = "lockstep"  # a `.jsonl` run record written by lockstep itself

# The marker lockstep's megatron runner writes near the top of its log (agreed with that runner):
# a log carrying it holds true per-step losses, so the step-2 correction must never touch it.
LOCKSTEP_MEGATRON_MARKER = "lockstep megatron runner"
MARKER_SCAN_LINES = 20


# --------------------------------------------------------------------------------------------
# llm.c / InfiniTrain step line
# --------------------------------------------------------------------------------------------

def llmc_step_line(step: int, steps: int, loss: float, lr: float, step_ms: float, tokens_per_s: float) -> str:
    """`step    1/10 | train loss 5.356193 | lr 1.00e-04 | (12.34 ms | 20746 tok/s)` (llm.c / InfiniTrain)."""
    return f"step {step:4d}/{steps} | train loss {loss:.6f} | lr {lr:.2e} | ({step_ms:.2f} ms | {tokens_per_s:.0f} tok/s)"


# Reads llmc_step_line's output, llm.c's `train_gpt2.py` line (with `| norm X`) and InfiniTrain's
# line (with the peak-memory tail). Numbers are `\S+` so that `nan`/`-nan`/`inf` parse and then
# fail the finiteness check with a clear message instead of silently not matching.
LLMC_STEP_RE = re.compile(
    r"step\s+(?P<step>\d+)/(?P<steps>\d+) \| train loss (?P<loss>\S+)"
    r"(?: \| norm (?P<norm>\S+))?"
    r" \| lr (?P<lr>\S+) \| \((?P<ms>\S+) ms \| (?P<tps>\S+) tok/s"
    r"(?: \| peak used:\s*(?P<peak_used>\d+) MB \| peak reserved:\s*(?P<peak_reserved>\d+) MB(?:, (?P<parallel>[^)]*))?)?"
    r"\)")

# glog's line prefix: severity, date (MMDD or, in newer glog, YYYYMMDD), time, thread id, file:line].
GLOG_PREFIX_RE = re.compile(r"^[IWEF]\d{4}(?:\d{4})? \d{2}:\d{2}:\d{2}\.\d+\s+\d+ [^\]\s]+\] ")


def infinitrain_step_line(glog_prefix: str, step: int, steps: int, loss: float, lr: float, step_ms: float,
                          tokens_per_s: float, peak_used_mb: int | None = None, peak_reserved_mb: int | None = None,
                          dp: int = 1, tp: int = 1, sp: int = 1, pp: int = 1) -> str:
    """InfiniTrain's step line as its main.cc logs it (for tests and fixtures; lockstep never runs it)."""
    body = llmc_step_line(step, steps, loss, lr, step_ms, tokens_per_s)
    if peak_used_mb is not None:
        body = body[:-1] + (f" | peak used: {peak_used_mb:5d} MB | peak reserved: {peak_reserved_mb or 0:5d} MB,"
                            f" DP={dp}, TP={tp}, SP={sp}, PP={pp})")
    return f"{glog_prefix}{body}"


# --------------------------------------------------------------------------------------------
# Megatron-LM iteration line
# --------------------------------------------------------------------------------------------

def megatron_iteration_line(timestamp: str, step: int, steps: int, consumed_samples: int, step_ms: float, lr: float,
                            global_batch: int, loss: float, grad_norm: float | None = None) -> str:
    """Megatron-LM's `training_log` line, with the true per-step loss (no step-2 running mean)."""
    norm = f" grad norm: {grad_norm:.3f} |" if grad_norm is not None else ""
    return (f" [{timestamp}] iteration {step:8d}/{steps:8d} | consumed samples: {consumed_samples:12d} |"
            f" elapsed time per iteration (ms): {step_ms:.1f} | learning rate: {lr:.6E} |"
            f" global batch size: {global_batch:5d} | lm loss: {loss:.6E} | loss scale: 1.0 |{norm}"
            f" number of skipped iterations:   0 | number of nan iterations:   0 |")


# `iteration N/M |` then `key: value |` fields in any order (upstream adds and drops fields between
# versions, e.g. "throughput per GPU (TFLOP/s/GPU)"), so the fields are read by name.
MEGATRON_ITERATION_RE = re.compile(r"\biteration\s+(?P<step>\d+)/\s*(?P<steps>\d+) \|(?P<fields>.*)$")
MEGATRON_FIELD_RE = re.compile(r"\s*(?P<key>[^|:]+?):\s*(?P<value>[^|]*?)\s*(?:\||$)")

# Where a Megatron log states its sequence length: upstream's argument dump
# (`  seq_length ...... 1024`), a `--seq-length 1024` command line, or a `seq=1024` /
# `seq_length=1024` config line (lockstep's runner).
SEQ_LENGTH_RE = re.compile(r"(?:--seq-length[ =]|\bseq_length\s*(?:\.+|[=:])\s*|\bseq\s*=\s*)(?P<seq>\d+)\b")


# --------------------------------------------------------------------------------------------
# PERF lines (lockstep's throughput lines, any framework)
# --------------------------------------------------------------------------------------------

def perf_step_line(step: int, steps: int, step_ms: float, tokens_per_s: float) -> str:
    return f"PERF step {step}/{steps} | {step_ms:.2f} ms | {tokens_per_s:.0f} tok/s"


PERF_STEP_RE = re.compile(r"PERF step (?P<step>\d+)/(?P<steps>\d+) \| (?P<ms>\S+) ms \| (?P<tps>\S+) tok/s")


def perf_summary_line(measured_steps: int, avg_ms: float, avg_tokens_per_s: float) -> str:
    return f"PERF summary | measured_steps {measured_steps} | avg {avg_ms:.2f} ms | avg {avg_tokens_per_s:.0f} tok/s"


PERF_SUMMARY_RE = re.compile(
    r"PERF summary \| measured_steps (?P<n>\d+) \| avg (?P<ms>\S+) ms \| avg (?P<tps>\S+) tok/s")

# lockstep's runners start their logs with the command they ran.
COMMAND_LINE_RE = re.compile(r"^\[COMMAND\] (?P<command>.*)$")


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _PerfStep:
    step_ms: float
    tokens_per_s: float


def _number(text: str, source: str, lineno: int, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise FormatError(source, f"line {lineno}: {what} {text!r} is not a number") from None


DECIMAL_RE = re.compile(r"^[+-]?\d*(?:\.(?P<frac>\d*))?(?:[eE](?P<exp>[+-]?\d+))?$")


def printed_quantum(text: str) -> float | None:
    """The unit in the last printed digit of a number: "5.356193" -> 1e-6, "1.082745E+01" -> 1e-5.
    A log's loss is only known to half of it; None for nan/inf or text that is not a decimal."""
    m = DECIMAL_RE.match(text)
    if not m or len(text) > 64:
        return None
    power = int(m["exp"] or 0) - len(m["frac"] or "")
    return 10.0 ** power if abs(power) < 300 else None


def _note_quantum(extra: dict, text: str) -> None:
    q = printed_quantum(text)
    if q is not None and q > extra.get("loss_quantum", 0.0):
        extra["loss_quantum"] = q


def _count(text: str, source: str, lineno: int, what: str) -> int:
    """A step number or count as printed; absurdly long digit strings are an error, not a
    ValueError from Python's integer-conversion limit."""
    if len(text) > 12:
        raise FormatError(source, f"line {lineno}: {what} {text[:20]}... has {len(text)} digits")
    return int(text)


def _perf_steps(lines: list[str], source: str) -> dict[int, _PerfStep]:
    perf: dict[int, _PerfStep] = {}
    for lineno, line in enumerate(lines, start=1):
        m = PERF_STEP_RE.search(line) if "PERF step" in line else None  # the `in` test is 10x cheaper
        if m:
            perf[_count(m["step"], source, lineno, "step")] = _PerfStep(_number(m["ms"], source, lineno, "step time"),
                                             _number(m["tps"], source, lineno, "tok/s"))
    return perf


def _common_meta(lines: list[str], source: str, log_format: str) -> dict:
    meta: dict = {"log_format": log_format, "log_file": source}
    for line in lines[:MARKER_SCAN_LINES]:
        m = COMMAND_LINE_RE.match(line.strip())
        if m:
            meta["command"] = m["command"]
            break
    for lineno, line in enumerate(lines, start=1):
        m = PERF_SUMMARY_RE.search(line) if "PERF summary" in line else None
        if m:
            meta["perf_summary"] = {"measured_steps": _count(m["n"], source, lineno, "measured steps"),
                                    "avg_step_ms": _number(m["ms"], source, lineno, "step time"),
                                    "avg_tokens_per_s": _number(m["tps"], source, lineno, "tok/s")}
    return meta


def _case_name(source: str) -> str:
    return Path(source).stem


def _parse_parallel(text: str | None) -> dict:
    """`DP=1, TP=1, SP=1, PP=1` -> {"dp": 1, "tp": 1, "sp": 1, "pp": 1}."""
    out = {}
    for part in (text or "").split(","):
        key, _, value = part.strip().partition("=")
        if key and value.strip().isdigit() and len(value.strip()) <= 12:
            out[key.lower()] = int(value)
    return out


def _llmc_steps(lines: list[str], source: str, glog: bool) -> tuple[list[StepRecord], dict]:
    """Step lines with (InfiniTrain) or without (llm.c) a glog prefix; other lines are ignored."""
    steps: list[StepRecord] = []
    extra: dict = {}
    parallel_text = None
    for lineno, line in enumerate(lines, start=1):
        if "train loss" not in line:  # cheap filter before the regular expressions (100k-step logs)
            continue
        if glog:
            prefix = GLOG_PREFIX_RE.match(line)
            if not prefix:
                continue
            m = LLMC_STEP_RE.match(line, prefix.end())
        else:
            m = LLMC_STEP_RE.match(line.strip())
        if not m:
            continue
        steps.append(StepRecord(
            step=_count(m["step"], source, lineno, "step"), loss=_number(m["loss"], source, lineno, "loss"),
            step_ms=_number(m["ms"], source, lineno, "step time"),
            tokens_per_s=_number(m["tps"], source, lineno, "tok/s"),
            lr=_number(m["lr"], source, lineno, "learning rate"),
            peak_mem_mb=_peak_mb(m["peak_used"])))
        _note_quantum(extra, m["loss"])
        extra["steps_planned"] = max(extra.get("steps_planned", 0), _count(m["steps"], source, lineno, "planned steps"))
        if _peak_mb(m["peak_reserved"]) is not None:
            extra["peak_reserved_mb"] = max(extra.get("peak_reserved_mb", 0.0), float(m["peak_reserved"]))
        if m["parallel"] and m["parallel"] != parallel_text:
            parallel_text = m["parallel"]
            extra["parallel"] = _parse_parallel(parallel_text)
    return steps, extra


def _peak_mb(text: str | None) -> float | None:
    """A peak-memory figure of a step line; "0 MB" is a build that tracks none (no training step
    peaks at nothing), so unknown, not 0."""
    return float(text) if text and int(text) > 0 else None


def _fill_from_perf(steps: list[StepRecord], perf: dict[int, _PerfStep]) -> None:
    for s in steps:
        p = perf.get(s.step)
        if p is not None:
            if s.step_ms is None:
                s.step_ms = p.step_ms
            if s.tokens_per_s is None:
                s.tokens_per_s = p.tokens_per_s


def parse_infinitrain_log(text: str, source: str, glog: bool = True) -> RunRecord:
    """InfiniTrain's stderr (glog-prefixed step lines among any other lines) -> RunRecord.

    `glog=False`: an example that prints its step lines to stdout with std::cout, without glog's
    prefix (tiny_mixtral of branch feat/support_moe: `step    1/10 | train loss 11.771182 | norm
    -1.0000 | lr 1.00e-04 | (14567.44 ms | 18 tok/s)`); its glog lines (a failed CHECK) are ignored.
    `source` names the log in messages and gives the case name (its stem).
    Raises FormatError when the text holds no InfiniTrain step line.
    """
    expected = ("InfiniTrain step lines (glog-prefixed `step N/M | train loss ...`)" if glog
                else "InfiniTrain step lines (`step N/M | train loss ...` on stdout)")
    return _parse_step_lines(text, source, glog=glog, framework="infinitrain", origin=ORIGIN_INFINITRAIN,
                             expected=expected)


def parse_llmc_log(text: str, source: str) -> RunRecord:
    """llm.c / PyTorch baseline step lines (no glog prefix) -> RunRecord."""
    return _parse_step_lines(text, source, glog=False, framework="llmc", origin=ORIGIN_LLMC,
                             expected="llm.c step lines (`step N/M | train loss ...`)")


def _parse_step_lines(text: str, source: str, *, glog: bool, framework: str, origin: str, expected: str) -> RunRecord:
    """The llm.c step-line family (InfiniTrain's glog lines are the same lines behind a prefix)."""
    lines = text.splitlines()
    steps, extra = _llmc_steps(lines, source, glog=glog)
    if not steps:
        raise FormatError(source, f"holds no {expected}")
    _fill_from_perf(steps, _perf_steps(lines, source))
    meta = {**_common_meta(lines, source, origin), **extra}
    return RunRecord(framework=framework, case=_case_name(source), steps=steps, meta=meta, source=source, origin=origin)


def _megatron_fields(fields: str) -> dict[str, str]:
    return {m["key"].strip(): m["value"] for m in MEGATRON_FIELD_RE.finditer(fields) if m["key"].strip()}


def is_lockstep_megatron_log(text: str) -> bool:
    """True when the log was written by lockstep's megatron runner (true per-step losses)."""
    head = text.splitlines()[:MARKER_SCAN_LINES]
    return any(LOCKSTEP_MEGATRON_MARKER in line for line in head)


def parse_megatron_log(text: str, source: str, seq_length: int | None = None) -> RunRecord:
    """Megatron iteration lines -> RunRecord with the losses as logged (see correct_megatron_step2).

    Timing: `PERF step` lines when present; else elapsed time per iteration, with tok/s =
    global batch size x sequence length / elapsed time. The sequence length comes from the log
    (`seq_length ....`, `--seq-length`, `seq=`), else from `seq_length`. For upstream logs
    iterations 1-2 carry no timing, since upstream's elapsed time there is not a step time.
    """
    lines = text.splitlines()
    lockstep_written = is_lockstep_megatron_log(text)
    origin = ORIGIN_LOCKSTEP_MEGATRON if lockstep_written else ORIGIN_MEGATRON_LM
    log_seq = next((_count(m["seq"], source, 0, "sequence length") for line in lines
                    if "seq" in line and (m := SEQ_LENGTH_RE.search(line))), None)
    seq = log_seq if log_seq is not None else seq_length
    perf = _perf_steps(lines, source)
    steps: list[StepRecord] = []
    meta = _common_meta(lines, source, origin)
    for lineno, line in enumerate(lines, start=1):
        m = MEGATRON_ITERATION_RE.search(line) if "iteration" in line else None
        if not m:
            continue
        fields = _megatron_fields(m["fields"])
        if "lm loss" not in fields:
            continue  # e.g. a validation or skipped-iteration line
        step, global_batch = _megatron_step(m, fields, source, lineno, seq, upstream=not lockstep_written, perf=perf)
        steps.append(step)
        _note_quantum(meta, fields["lm loss"])
        meta["steps_planned"] = max(meta.get("steps_planned", 0), _count(m["steps"], source, lineno, "planned steps"))
        if global_batch is not None:
            meta["global_batch_size"] = global_batch
    if not steps:
        raise FormatError(source, "holds no Megatron iteration lines with an `lm loss` field")
    _note_seq_length(meta, seq, log_seq is not None, bool(perf))
    return RunRecord(framework="megatron", case=_case_name(source), steps=steps, meta=meta,
                     source=source, origin=origin)


def _megatron_step(m: re.Match, fields: dict[str, str], source: str, lineno: int, seq: int | None, *,
                   upstream: bool, perf: dict) -> tuple[StepRecord, int | None]:
    """One iteration line's step and the global batch size it names (None: not named)."""
    step = _count(m["step"], source, lineno, "step")
    loss = _number(fields["lm loss"], source, lineno, "lm loss")
    lr = _number(fields["learning rate"], source, lineno, "learning rate") if "learning rate" in fields else None
    elapsed = fields.get("elapsed time per iteration (ms)")
    step_ms = _number(elapsed, source, lineno, "elapsed time") if elapsed is not None else None
    global_batch = _global_batch(fields.get("global batch size"), source, lineno)
    tokens_per_s = None
    if step_ms is not None and global_batch is not None and seq is not None and step_ms > 0:
        tokens_per_s = tokens_per_second(global_batch * seq, step_ms)
    if upstream and step <= 2:
        step_ms = tokens_per_s = None  # upstream: elapsed time of iterations 1-2 is not a step time
    if step in perf:
        step_ms, tokens_per_s = perf[step].step_ms, perf[step].tokens_per_s
    return StepRecord(step=step, loss=loss, step_ms=step_ms, tokens_per_s=tokens_per_s, lr=lr), global_batch


def _global_batch(gbs: str | None, source: str, lineno: int) -> int | None:
    if gbs is None:
        return None
    gbs_value = _number(gbs, source, lineno, "global batch size")
    if not (math.isfinite(gbs_value) and 0 < gbs_value < 1e12):
        raise FormatError(source, f"line {lineno}: global batch size {gbs!r:.30} is not a positive count")
    return int(gbs_value)


def _note_seq_length(meta: dict, seq: int | None, from_log: bool, has_perf: bool) -> None:
    """Say where the sequence length behind tok/s came from, or why tok/s is unknown."""
    if seq is not None:
        meta["seq_length"] = seq
        meta["seq_length_from"] = "log" if from_log else "argument"
    elif not has_perf:
        meta["throughput_note"] = "no sequence length in the log or given (--seq-length): tok/s unknown"


def correct_megatron_step2(record: RunRecord) -> RunRecord:
    """Undo upstream Megatron-LM's running mean at iteration 2: loss2 = 2*logged2 - loss1.

    Returns a corrected copy (the logged value is kept in meta). Refuses lockstep's own
    records and logs, which hold true per-step losses; a record already corrected or without
    a step 2 comes back unchanged.
    """
    src = record.source or f"{record.framework}/{record.case}"
    if record.origin in (ORIGIN_LOCKSTEP, ORIGIN_LOCKSTEP_MEGATRON):
        raise FormatError(src, "is lockstep's own record with true per-step losses; "
                               "the Megatron-LM step-2 correction does not apply to it")
    if record.meta.get("megatron_step2_corrected"):
        return record
    by_step = {s.step: s for s in record.steps}
    if 2 not in by_step:
        return record
    if 1 not in by_step:
        raise FormatError(src, "has an iteration 2 but no iteration 1, so its step-2 loss cannot be corrected")
    fixed = copy.deepcopy(record)
    step1 = next(s for s in fixed.steps if s.step == 1)
    step2 = next(s for s in fixed.steps if s.step == 2)
    fixed.meta["megatron_step2_logged_loss"] = step2.loss
    step2.loss = 2.0 * step2.loss - step1.loss
    fixed.meta["megatron_step2_corrected"] = True
    return fixed


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------

def detect_log_format(text: str) -> str | None:
    """The origin a log would get, or None when it holds no step lines lockstep knows."""
    lines = text.splitlines()
    if any("lm loss" in line and MEGATRON_ITERATION_RE.search(line) for line in lines):
        return ORIGIN_LOCKSTEP_MEGATRON if is_lockstep_megatron_log(text) else ORIGIN_MEGATRON_LM
    glog_step = False
    plain_step = False
    for line in lines:
        if "train loss" not in line:
            continue
        prefix = GLOG_PREFIX_RE.match(line)
        if prefix and LLMC_STEP_RE.match(line, prefix.end()):
            glog_step = True
            break
        if LLMC_STEP_RE.match(line.strip()):
            plain_step = True
    if glog_step:
        return ORIGIN_INFINITRAIN
    if plain_step:
        return ORIGIN_LLMC
    return None


def parse_log_file(path: str | os.PathLike, seq_length: int | None = None) -> RunRecord:
    """Read a native log, detecting its format. Raises FormatError naming the file when the file
    is missing, its format is unknown, or it holds no step records."""
    path = Path(path)
    # A native log holds whatever a (possibly crashing) process printed: bytes that are not UTF-8
    # become U+FFFD rather than an error, since the step lines themselves are ASCII.
    text = read_text(path, "log file", errors="replace")
    fmt = detect_log_format(text)
    source = str(path)
    if fmt == ORIGIN_INFINITRAIN:
        return parse_infinitrain_log(text, source)
    if fmt == ORIGIN_LLMC:
        return parse_llmc_log(text, source)
    if fmt in (ORIGIN_MEGATRON_LM, ORIGIN_LOCKSTEP_MEGATRON):
        return parse_megatron_log(text, source, seq_length=seq_length)
    if not text.strip():
        raise FormatError(path, "is empty: no step records")
    raise FormatError(path, "holds no step records in a known format "
                            "(InfiniTrain / llm.c `step N/M | train loss`, Megatron `iteration N/M | ... lm loss`)")


def load_run(path: str | os.PathLike, seq_length: int | None = None) -> RunRecord:
    """A `.jsonl` run record, or any other file read as a native log."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return read_run_record(path)
    return parse_log_file(path, seq_length=seq_length)


class ParsedRuns:
    """The run files of one `lockstep run`, each parsed once however many of its stages read it (the
    comparison's metadata and pairs, a second comparison after evidence, the report, the history):
    keyed by the file's path, size and modification time, so a file written again is read again.
    Callers treat what it returns as read-only."""

    def __init__(self):
        self._parsed: dict[tuple, RunRecord] = {}

    def load(self, path: str | os.PathLike, seq_length: int | None = None) -> RunRecord:
        path = Path(path)
        st = path.stat()
        key = (str(path.absolute()), seq_length, st.st_mtime_ns, st.st_size)
        if key not in self._parsed:
            self._parsed[key] = load_run(path, seq_length)
        return self._parsed[key]


def load_with(files: "ParsedRuns | None", path: str | os.PathLike, seq_length: int | None = None) -> RunRecord:
    """`load_run`, through `files` where the caller keeps one."""
    return files.load(path, seq_length) if files is not None else load_run(path, seq_length)
